// Geometry of the work: requests, their units of 2^unit_rows_log2 rows (64, or the narrow
// kernels' 16 / 32), and how many KV blocks each unit reads.
// Shared by the plan, attention and combine phases so they agree on every index.
#pragma once
#include "../config.h"
#include "params.h"

namespace jit_mla {

// Device data is never trusted for addressing (check_inputs=True reports bad values instead): a
// request's query rows are clamped into [0, total_q) and its KV length into [0, kv_cap] (the block
// table's width in tokens), so a wrong cum_seq_lens_q or seq_lens gives a wrong result for that
// request but never an access outside q, out, lse or block_tables, nor unbounded work.
__device__ __forceinline__ int clamp_q_row(const MlaParams& p, int x) {
  return min(max(x, 0), p.total_q);
}
// A request's query rows [begin, begin + len), from one read of its two prefix sums.
struct QRange {
  int begin;
  int len;
};
__device__ __forceinline__ QRange request_q_range(const MlaParams& p, int b) {
  if (p.cum_q == nullptr) return {b * p.q_len, p.q_len};
  const int begin = clamp_q_row(p, p.cum_q[b]), end = clamp_q_row(p, p.cum_q[b + 1]);
  return {begin, max(end - begin, 0)};
}
__device__ __forceinline__ int request_kv_len(const MlaParams& p, int b) {
  return min(max(p.seq_lens[b], 0), p.kv_cap);
}
__device__ __forceinline__ int request_num_units(const MlaParams& p, int b) {
  // 32-bit unsigned: q_len * H <= total_q * H < 2^31 (the launcher checks), so rounding up to
  // whole units stays below 2^32.
  const unsigned rows = static_cast<unsigned>(request_q_range(p, b).len) * static_cast<unsigned>(p.head_div.d);
  return static_cast<int>((rows + (1u << p.unit_rows_log2) - 1) >> p.unit_rows_log2);
}

// Number of KV tokens a row of token t sees: bottom-right causal, L - n + t + 1, clamped.
__device__ __forceinline__ int row_kv_limit(int kv_len, int q_len, int t) {
  const int lim = kv_len - q_len + t + 1;
  return lim < 0 ? 0 : (lim > kv_len ? kv_len : lim);
}

struct Unit {
  int b;          // request
  int row0;       // first row of the unit inside the request (rows = token * H + head)
  int rows;       // valid rows, 1..2^unit_rows_log2 (<= 64)
  int q_len;      // request's query length n
  int kv_len;     // request's seq_lens L
  int kv_extent;  // KV tokens the unit's last row sees (the most of any of its rows)
  int num_blocks; // ceil(kv_extent / 64)
  long long q_row_base;  // global row (token * H + head) of the unit's row 0
};

__device__ __forceinline__ Unit make_unit(const MlaParams& p, int b, int m) {
  Unit u;
  u.b = b;
  const QRange q = request_q_range(p, b);
  u.q_len = q.len;
  u.kv_len = request_kv_len(p, b);
  const int total_rows = u.q_len * p.head_div.d;
  u.row0 = m << p.unit_rows_log2;
  u.rows = min(1 << p.unit_rows_log2, total_rows - u.row0);
  // A unit without rows (q_len 0) gets token 0: row_kv_limit clamps it as it did -1 / H.
  const int t_last = fast_div(max(0, u.row0 + u.rows - 1), p.head_div);
  u.kv_extent = row_kv_limit(u.kv_len, u.q_len, t_last);
  u.num_blocks = (u.kv_extent + kBlockN - 1) / kBlockN;
  u.q_row_base = (long long)q.begin * p.head_div.d + u.row0;
  return u;
}

__device__ __forceinline__ int request_num_groups(const MlaParams& p, int b) {
  return (request_num_units(p, b) + p.m_group - 1) >> p.m_group_log2;
}

// KV blocks group j of request b runs over: those of its last unit, whose rows see the most.
__device__ __forceinline__ int group_num_blocks(const MlaParams& p, int b, int j) {
  const int last = min((j + 1) * p.m_group, request_num_units(p, b)) - 1;
  return make_unit(p, b, last).num_blocks;
}

// CTA sets: the plan's ranges, m_group CTAs side by side in each.
__device__ __forceinline__ int num_sets(const MlaParams& p) { return p.num_ctas >> p.m_group_log2; }

// The request owning group g: the largest b with group_prefix[b] <= g (skips empty requests).
__device__ __forceinline__ int find_request(const MlaParams& p, int g) {
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.group_prefix[mid] <= g) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ bool pos_less(WorkPos a, WorkPos b) {
  return a.group < b.group || (a.group == b.group && a.block < b.block);
}

// Partial-result slot of CTA set s for (lane) unit of group g: the set splits at most the group
// its range starts inside of (slot pair 2s) and the one it ends inside of (2s+1); each of the
// set's m_group CTAs has its own slot in the pair.
// beg: bounds[s], where the caller has it already.
__device__ __forceinline__ int partial_slot_at(const MlaParams& p, WorkPos beg, int s, int g, int lane) {
  const int which = (beg.group == g && beg.block > 0) ? 0 : 1;
  return (kSlotsPerCta * s + which) * p.m_group + lane;
}
__device__ __forceinline__ int partial_slot(const MlaParams& p, int s, int g, int lane) {
  return partial_slot_at(p, p.bounds[s], s, g, lane);
}

// Row r of a split unit's normalized partial O in its slot: 512 bf16 (the slot is sized for the
// fp8 kernels' fp32 promotion; the partial takes its first half). bf16, not fp32: the partials
// are written by every split CTA and read back by the merge, twice the bytes in fp32 for an
// error of one bf16 rounding of a normalized row, as the output's own. kPartialSlotStride: bf16
// elements from a row of one slot to the same row of the next (a slot holds kBlockM fp32 rows).
constexpr int kPartialSlotStride = 2 * kBlockM * kHeadDimV;
__device__ __forceinline__ __nv_bfloat16* partial_row(const MlaParams& p, int slot, int r) {
  return reinterpret_cast<__nv_bfloat16*>(p.partial_o) + (long long)slot * kPartialSlotStride + r * kHeadDimV;
}

}  // namespace jit_mla
