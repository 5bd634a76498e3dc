// Geometry of the work: requests, their 64-row units, and how many KV blocks each unit reads.
// Shared by the plan, attention and combine kernels so they agree on every index.
#pragma once
#include "../config.h"
#include "params.h"

namespace jit_mla {

__device__ __forceinline__ int request_q_begin(const MlaParams& p, int b) {
  return p.cum_q != nullptr ? p.cum_q[b] : b * p.q_len;
}
__device__ __forceinline__ int request_q_len(const MlaParams& p, int b) {
  return p.cum_q != nullptr ? p.cum_q[b + 1] - p.cum_q[b] : p.q_len;
}
__device__ __forceinline__ int request_num_units(const MlaParams& p, int b) {
  const long long rows = (long long)request_q_len(p, b) * p.num_heads;
  return (int)((rows + kBlockM - 1) / kBlockM);
}

// Number of KV tokens a row of token t sees: bottom-right causal, L - n + t + 1, clamped.
__device__ __forceinline__ int row_kv_limit(int kv_len, int q_len, int t) {
  const int lim = kv_len - q_len + t + 1;
  return lim < 0 ? 0 : (lim > kv_len ? kv_len : lim);
}

struct Unit {
  int b;          // request
  int row0;       // first row of the unit inside the request (rows = token * H + head)
  int rows;       // valid rows, 1..64
  int q_len;      // request's query length n
  int kv_len;     // request's seq_lens L
  int kv_extent;  // KV tokens the unit's last row sees (the most of any of its rows)
  int num_blocks; // ceil(kv_extent / 64)
  long long q_row_base;  // global row (token * H + head) of the unit's row 0
};

__device__ __forceinline__ Unit make_unit(const MlaParams& p, int b, int m) {
  Unit u;
  u.b = b;
  u.q_len = request_q_len(p, b);
  u.kv_len = p.seq_lens[b];
  const int total_rows = u.q_len * p.num_heads;
  u.row0 = m * kBlockM;
  u.rows = min(kBlockM, total_rows - u.row0);
  const int t_last = (u.row0 + u.rows - 1) / p.num_heads;
  u.kv_extent = row_kv_limit(u.kv_len, u.q_len, t_last);
  u.num_blocks = (u.kv_extent + kBlockN - 1) / kBlockN;
  u.q_row_base = (long long)request_q_begin(p, b) * p.num_heads + u.row0;
  return u;
}

// The request owning unit u: the largest b with unit_prefix[b] <= u (skips empty requests).
__device__ __forceinline__ int find_request(const MlaParams& p, int u) {
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.unit_prefix[mid] <= u) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ Unit unit_at(const MlaParams& p, int u) {
  const int b = find_request(p, u);
  return make_unit(p, b, u - p.unit_prefix[b]);
}

__device__ __forceinline__ bool pos_less(WorkPos a, WorkPos b) {
  return a.unit < b.unit || (a.unit == b.unit && a.block < b.block);
}

// Partial-result slot of CTA g for unit u: slot 2g for the unit its range starts inside of,
// 2g+1 for the unit its range ends inside of (a CTA can split at most those two).
__device__ __forceinline__ int partial_slot(const MlaParams& p, int g, int u) {
  const WorkPos beg = p.bounds[g];
  return (beg.unit == u && beg.block > 0) ? kSlotsPerCta * g : kSlotsPerCta * g + 1;
}

}  // namespace jit_mla
