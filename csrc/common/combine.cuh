// Split merge, the last phase of the attention kernel itself (no second kernel): once every CTA
// has written its partials (a grid-wide barrier; the kernel is launched cooperatively, so all
// its CTAs are resident and the barrier cannot wait for a CTA that never starts), the CTAs share
// the rows of every split unit. One launch per call instead of two saves ~2.5 us of host time
// and the drain-and-launch gap between two kernels on the GPU.
//
// Items of output rows (a whole row, or 128 or 256 columns of one), contiguous per warp: a warp
// weighs a row's n normalized bf16 partials (partial_row) in fp32 and writes bf16, one item after
// another or, for whole rows with few splits, up to four rows of one unit together. Consecutive
// items mostly share a row (whose weights it works out once) and a unit (whose list of partial
// slots it collects once).
//
// The partials go to shared memory by cp.async (each lane copies the 16-byte chunks it reads
// back itself), and loops that are not unrolled weigh them from there: the merge runs once per
// call, so its code is fetched cold, and the unrolled register version (a load site and FMAs per
// split) spent most of its time stalled on instruction fetch (Session 23, ncu PC sampling: 59% of
// the merge's samples at B8 kv4096 H128, 68% at B1 kv65536).
#pragma once
#include <cooperative_groups.h>

#include "../config.h"
#include "device_utils.cuh"
#include "finalize.cuh"
#include "params.h"
#include "probe.h"
#include "units.cuh"

namespace jit_mla {

constexpr int kCombineWarps = kNumThreads / 32;           // 8
constexpr int kCombineCols = 32 * 8;                      // 256 columns: 8 bf16 (16 bytes) per lane
constexpr int kCombineChunks = kHeadDimV / kCombineCols;  // 2 per row
constexpr int kCombineQuarters = 4;                       // 128-column items: two splits per warp step
constexpr int kCombineRows = 4;                           // whole rows merged together, at most
constexpr int kCombineRowLanes = 32 / kCombineRows;       // merge_rows: lanes per row, one split each
// A warp's staging: 16-byte chunks per lane (18 KiB per warp). A round of copies fills it: 18
// splits of a whole row, 36 of a 256-column item, 72 of a 128-column one, so that a short
// request split over every set of the H200 (B1 kv8192 H16: 65 sets of 2 blocks; B1 kv65536 H128:
// 66) merges in one round: a second waits for the first's copies to be weighed, one more L2
// round trip. With kMaxCtas' slots and weights, CombineSmem takes the 160 KiB the smallest kernel
// has (mla_sm90.cu checks).
constexpr int kStageChunks = 36;

// Per warp: the current unit's partial slots, the current row's (rows') per-split LSE, then
// weight, and the staged partials (chunk c of lane l at stage[c][l]: a warp's 16-byte reads of
// one c are 512 contiguous bytes). Lives at the start of the attention kernel's dynamic shared
// memory, free once attention is done: every load into it waited for, every wgmma retired, and a
// CTA barrier (the grid barrier's arrival) behind. mla_sm90.cu checks that every kernel has it.
struct CombineSmem {
  int slots[kCombineWarps][kMaxCtas];
  float weight[kCombineWarps][kMaxCtas];
  uint4 stage[kCombineWarps][kStageChunks][32];
};

// Set s's range [bounds[s], bounds[s + 1]) (an empty one past the last set).
struct SetRange {
  WorkPos a, c;
};
__device__ __forceinline__ SetRange load_set_range(const MlaParams& p, int s, int sets) {
  if (s >= sets) return SetRange{WorkPos{INT_MAX, 0}, WorkPos{INT_MAX, 0}};
  return SetRange{p.bounds[s], p.bounds[s + 1]};
}

// Slots holding the partials of (lane_m) unit of group grp, in order, into slots; returns their
// count (in every lane). The sets whose ranges [bounds[s], bounds[s+1]) meet the group are
// consecutive from its first set (the plan lists it); empty ranges (equal bounds) wrote nothing.
// The warp scans 32 sets per step; first: the ranges of sets first_set + lane, loaded by the
// caller ahead of its request search (both depend only on the split list).
__device__ __forceinline__ int collect_slots(const MlaParams& p, int grp, int first_set, int lane_m,
                                             SetRange first, int* slots) {
  const int lane = threadIdx.x & 31;
  const int sets = num_sets(p);
  int count = 0;
  SetRange r = first;
  for (int base = first_set; base < sets; base += 32) {
    const int s = base + lane;
    if (base != first_set) r = load_set_range(p, s, sets);
    const bool past = r.a.group > grp;  // past the last set too (INT_MAX)
    const bool in = s < sets && !past && !(r.a.group == r.c.group && r.a.block == r.c.block);
    const unsigned take = __ballot_sync(0xffffffffu, in);
    if (in) slots[count + __popc(take & ((1u << lane) - 1))] = partial_slot_at(p, r.a, s, grp, lane_m);
    count += __popc(take);
    if (__any_sync(0xffffffffu, past)) break;
  }
  __syncwarp();
  return count;
}

// The request owning group g (largest b with group_prefix[b] <= g), as find_request, but 32
// pivots per step, one per lane: one or two dependent loads for up to 1024 requests instead of
// log2(B). The combine's unit lookups are chains of dependent loads; this is the longest link.
// *prefix: group_prefix[b], from the step that found it (group_prefix[0] is 0: the plan's scans
// start there), so that no load of it follows.
__device__ __forceinline__ int find_request_warp(const MlaParams& p, int g, int* prefix) {
  const int lane = threadIdx.x & 31;
  int lo = 0, hi = p.batch - 1;  // the answer is in [lo, hi]; group_prefix[lo] <= g holds
  int at_lo = 0;                 // group_prefix[lo]
  while (lo < hi) {
    const int step = (hi - lo + 32) / 32;  // ceil((hi - lo + 1) / 32)
    const int pivot = lo + lane * step;
    const int gp = pivot <= hi ? p.group_prefix[pivot] : INT_MAX;
    const bool ok = gp <= g;  // lane 0: pivot lo, always ok
    const int last = 31 - __clz(__ballot_sync(0xffffffffu, ok));
    at_lo = __shfl_sync(0xffffffffu, gp, last);
    lo += last * step;
    hi = min(hi, lo + step - 1);
  }
  *prefix = at_lo;
  return lo;
}

// The first kHeldLse * 32 LSEs of row r (every split on a 132-SM GPU), split j = lane + 32 i in
// x[i] (-inf past n), loaded in one round into registers: a loop stores each before the next load
// issues, a round trip per 32 splits. The caller loads them before it issues the row's partial
// copies, so that the copies are not queued in front of what the weights wait for.
constexpr int kHeldLse = 4;
__device__ __forceinline__ void load_held_lse(const MlaParams& p, const int* slots, int n, int r,
                                              float (&x)[kHeldLse]) {
  const int lane = threadIdx.x & 31;
  const float* lse_r = opaque_ptr(p.partial_lse + r);  // row r of slot 0; slot s at + s * kBlockM
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) {
    const int j = lane + 32 * i;
    x[i] = j < n ? __ldcg(lse_r + slots[j] * kBlockM) : -INFINITY;
  }
}

// Row r's weights 2^(lse_j - lse) into weight[0, n) and its lse = log2 sum_j 2^lse_j, from its
// held LSEs x (load_held_lse) and the rest. The loops over splits past the held ones stay
// rolled: they run only beyond 128 splits, and unrolled (by the compiler, 4x with remainders)
// they were ~1,100 instructions of every kernel's code.
__device__ __forceinline__ float row_weights(const MlaParams& p, const int* slots, float* weight,
                                             int n, int r, const float (&x)[kHeldLse]) {
  const int lane = threadIdx.x & 31;
  const float* lse_r = opaque_ptr(p.partial_lse + r);
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) mx = fmaxf(mx, x[i]);
#pragma unroll 1
  for (int j = lane + 32 * kHeldLse; j < n; j += 32) {
    const float y = __ldcg(lse_r + slots[j] * kBlockM);
    weight[j] = y;  // this lane's own entries until the weights replace them
    mx = fmaxf(mx, y);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float lse = -INFINITY;
  if (mx != -INFINITY) {
    float sum = 0.f;  // entries past n are -inf: 0
#pragma unroll
    for (int i = 0; i < kHeldLse; ++i) sum += exp2_approx(x[i] - mx);
#pragma unroll 1
    for (int j = lane + 32 * kHeldLse; j < n; j += 32) sum += exp2_approx(weight[j] - mx);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    lse = mx + log2_approx(sum);
  }
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) {
    const int j = lane + 32 * i;
    if (j < n) weight[j] = lse == -INFINITY ? 0.f : exp2_approx(x[i] - lse);
  }
#pragma unroll 1
  for (int j = lane + 32 * kHeldLse; j < n; j += 32) weight[j] = lse == -INFINITY ? 0.f : exp2_approx(weight[j] - lse);
  __syncwarp();
  return lse;
}

// acc[0 .. 8) += w * the 8 bf16 of u.
__device__ __forceinline__ void fma_bf16x8(float (&acc)[8], float w, uint4 u) {
  const uint32_t x[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] = fmaf(w, __uint_as_float(x[i] << 16), acc[2 * i]);
    acc[2 * i + 1] = fmaf(w, __uint_as_float(x[i] & 0xffff0000u), acc[2 * i + 1]);
  }
}

// What a lane weighs of an item: 8 columns (16 bytes) per 256, col0 + 8 lane + 256 h for
// h < kC (kC 2: a whole row, 1: 256 columns), of every split; or, kPair (a 128-column item),
// col0 + 8 (lane % 16) of the splits j = lane / 16 (mod 2), the half-warps' sums added at the end.
template <bool kPair>
__device__ __forceinline__ int lane_col(int col0) {
  const int lane = threadIdx.x & 31;
  return col0 + 8 * (kPair ? lane & 15 : lane);
}
template <bool kPair>
__device__ __forceinline__ int lane_first_split(int j0) {
  return j0 + (kPair ? (threadIdx.x & 31) >> 4 : 0);
}

// Copies the lane's chunks of rows r0 .. r0 + k - 1, splits [j0, j1), into its staging column
// stage[*][lane], in the order (row, split, h). Each lane reads back only what it copied, so its
// own cp.async.wait_all is all the ordering the staging needs (no warp barrier).
template <int kC, bool kPair>
__device__ __forceinline__ void stage_partials(const MlaParams& p, const int* slots, int j0, int j1, int r0,
                                               int k, int col0, uint4 (*stage)[32]) {
  const int lane = threadIdx.x & 31, col = lane_col<kPair>(col0);
  int c = 0;
#pragma unroll 1
  for (int i = 0; i < k; ++i) {
    const __nv_bfloat16* row = opaque_ptr(partial_row(p, 0, r0 + i) + col);
#pragma unroll 1
    for (int j = lane_first_split<kPair>(j0); j < j1; j += kPair ? 2 : 1) {
      const __nv_bfloat16* src = row + (long long)slots[j] * kPartialSlotStride;
#pragma unroll
      for (int h = 0; h < kC; ++h, ++c) cp_async_16(smem_u32(&stage[c][lane]), src + kCombineCols * h, true);
    }
  }
  cp_async_commit();
}

// acc += weight[j] x the staged chunks of splits [j0, j1) of one row, from chunk *c on (advanced
// past them).
template <int kC, bool kPair>
__device__ __forceinline__ void weigh_staged(const float* weight, int j0, int j1, int* c, uint4 (*stage)[32],
                                             float (&acc)[kC][8]) {
  const int lane = threadIdx.x & 31;
  int cc = *c;
#pragma unroll 2
  for (int j = lane_first_split<kPair>(j0); j < j1; j += kPair ? 2 : 1) {
    const float w = weight[j];
#pragma unroll
    for (int h = 0; h < kC; ++h, ++cc) fma_bf16x8(acc[h], w, stage[cc][lane]);
  }
  *c = cc;
}

// Row r's columns of acc (the lane's, as lane_col), finalized with the row's lse (sink,
// bmm2_scale) and stored as bf16 (16 bytes per lane: whole 32-byte sectors); its LSE with the
// row's first columns.
template <int kC, bool kPair>
__device__ __forceinline__ void store_row(const MlaParams& p, const Unit& unit, int r, int col0, float lse,
                                          float bmm2, float (&acc)[kC][8]) {
  const int lane = threadIdx.x & 31;
  if constexpr (kPair) {
#pragma unroll
    for (int h = 0; h < kC; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], 16);
  }
  const int head = fast_mod(unit.row0 + r, p.head_div);
  const RowFinal fin = finalize_row(lse, p.sinks, head, bmm2);
  const long long row = unit.q_row_base + r;
  if (!kPair || lane < 16) {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + row * kHeadDimV + lane_col<kPair>(col0);
#pragma unroll
    for (int h = 0; h < kC; ++h) {
      const float* a = acc[h];
      *reinterpret_cast<uint4*>(out + kCombineCols * h) =
          make_uint4(pack_bf16x2(a[0] * fin.scale, a[1] * fin.scale), pack_bf16x2(a[2] * fin.scale, a[3] * fin.scale),
                     pack_bf16x2(a[4] * fin.scale, a[5] * fin.scale), pack_bf16x2(a[6] * fin.scale, a[7] * fin.scale));
    }
  }
  if (p.lse != nullptr && lane == 0 && col0 == 0) p.lse[row] = fin.lse;
}

// One item: row r's columns from col0 on (kC x 256, or 128 if kPair), sum_j weight_j O_j over
// its n splits, finalized. Rounds of as many splits as fill the staging; the first round's
// copies are in flight while the row's weights are worked out (new_row: not yet; *lse_io then).
template <int kC, bool kPair>
__device__ __forceinline__ void merge_item(const MlaParams& p, const Unit& unit, const int* slots, float* weight,
                                           int n, int r, int col0, bool new_row, float* lse_io, float bmm2,
                                           uint4 (*stage)[32]) {
  constexpr int kRound = kStageChunks / kC * (kPair ? 2 : 1);  // splits per round
  float acc[kC][8] = {};
  float x[kHeldLse];
  if (new_row) load_held_lse(p, slots, n, r, x);
  stage_partials<kC, kPair>(p, slots, 0, min(n, kRound), r, 1, col0, stage);
  if (new_row) *lse_io = row_weights(p, slots, weight, n, r, x);
  me_mark(kMeWeights);
#pragma unroll 1
  for (int j0 = 0; j0 < n; j0 += kRound) {
    const int j1 = min(n, j0 + kRound);
    if (j0 > 0) stage_partials<kC, kPair>(p, slots, j0, j1, r, 1, col0, stage);
    cp_async_wait_all();
    int c = 0;
    weigh_staged<kC, kPair>(weight, j0, j1, &c, stage, acc);
    me_mark(kMeRound);
  }
  store_row<kC, kPair>(p, unit, r, col0, *lse_io, bmm2, acc);
  me_mark(kMeStored);
}

// A whole row with the partials in registers (single whole-row items: B8 H128 merged 3.5%
// faster this way than staged, Session 23): each step's loads (kRegSplits splits x 2 chunks of
// 16 bytes per lane) in flight together, the row's weights worked out under the first step's.
constexpr int kRegSplits = 9;
__device__ __forceinline__ void merge_row_regs(const MlaParams& p, const Unit& unit, const int* slots,
                                               float* weight, int n, int r, bool new_row, float* lse_io,
                                               float bmm2) {
  const int lane = threadIdx.x & 31;
  float acc[kCombineChunks][8] = {};
  uint4 v[kRegSplits][kCombineChunks];
  // Row r of slot 0: each split's row is one wide multiply-add from it.
  const __nv_bfloat16* row = opaque_ptr(partial_row(p, 0, r) + 8 * lane);
  auto load = [&](int j) {
#pragma unroll
    for (int k = 0; k < kRegSplits; ++k) {
      const __nv_bfloat16* src = row + (long long)slots[min(j + k, n - 1)] * kPartialSlotStride;
#pragma unroll
      for (int h = 0; h < kCombineChunks; ++h)
        v[k][h] = j + k < n ? __ldcg(reinterpret_cast<const uint4*>(src + kCombineCols * h)) : make_uint4(0, 0, 0, 0);
    }
  };
  float x[kHeldLse];
  if (new_row) load_held_lse(p, slots, n, r, x);
  load(0);
  if (new_row) *lse_io = row_weights(p, slots, weight, n, r, x);
  me_mark(kMeWeights);
  for (int j = 0; j < n; j += kRegSplits) {
    if (j > 0) load(j);
#pragma unroll
    for (int k = 0; k < kRegSplits; ++k) {
      const float w = j + k < n ? weight[j + k] : 0.f;
#pragma unroll
      for (int h = 0; h < kCombineChunks; ++h) fma_bf16x8(acc[h], w, v[k][h]);
    }
    me_mark(kMeRound);
  }
  store_row<kCombineChunks, false>(p, unit, r, 0, *lse_io, bmm2, acc);
  me_mark(kMeStored);
}

// Whole rows r0 .. r0 + k - 1 (k <= kCombineRows) of one unit, n splits each, merged together:
// all their chunks in one round (the caller's test: 2 k n <= kStageChunks), one round trip for
// the k rows instead of one each. The weights of all k rows at once while the copies are in
// flight: lane i kSeg + j holds split j of row i, its LSE reduced over the row's kSeg lanes. The
// same numbers as row_weights while a segment has a lane past n (its -inf): with all kSeg LSEs
// NaN, row_weights' fmaxf from -inf gives lse -inf, this NaN; n <= 6 here.
__device__ __forceinline__ void merge_rows(const MlaParams& p, const Unit& unit, const int* slots, float* weight,
                                           int n, int r0, int k, float bmm2, uint4 (*stage)[32]) {
  constexpr int kSeg = kCombineRowLanes;
  const int lane = threadIdx.x & 31;
  stage_partials<kCombineChunks, false>(p, slots, 0, n, r0, k, 0, stage);
  const int mine_i = lane / kSeg, mine_j = lane % kSeg;
  const float x = mine_i < k && mine_j < n ? __ldcg(p.partial_lse + slots[mine_j] * kBlockM + r0 + mine_i) : -INFINITY;
  float mx = x;
#pragma unroll
  for (int d = kSeg / 2; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float sum = mx == -INFINITY ? 0.f : exp2_approx(x - mx);
#pragma unroll
  for (int d = kSeg / 2; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = mx == -INFINITY ? -INFINITY : mx + log2_approx(sum);
  __syncwarp();  // the previous row's weights no longer read
  weight[lane] = lse == -INFINITY ? 0.f : exp2_approx(x - lse);  // row i's at weight[i kSeg + j]
  __syncwarp();
  me_mark(kMeWeights);
  cp_async_wait_all();
  int c = 0;
#pragma unroll 1
  for (int i = 0; i < k; ++i) {
    float acc[kCombineChunks][8] = {};
    weigh_staged<kCombineChunks, false>(weight + i * kSeg, 0, n, &c, stage, acc);
    store_row<kCombineChunks, false>(p, unit, r0 + i, 0, __shfl_sync(0xffffffffu, lse, i * kSeg), bmm2, acc);
  }
  me_mark(kMeStored);
}

// Unit u of the split list (the u / m_group-th split group, lane u % m_group): its geometry into
// *unit and its partials' slots into slots; returns their count, 0 when the request's last
// group has no unit in this lane (nothing to merge). Reads only the plan (every CTA wrote the
// same values) and the inputs, so it may run before the grid barrier completes.
__device__ __forceinline__ int lookup_unit(const MlaParams& p, int u, int* slots, Unit* unit) {
  me_mark(kMeUnit);
  const int grp = p.split_groups[1 + 2 * (u >> p.m_group_log2)], lane_m = u & (p.m_group - 1);
  const int first_set = p.split_groups[2 + 2 * (u >> p.m_group_log2)];
  // Three rounds of dependent loads before the partials (B <= 32, a scan of <= 32 sets): the
  // split list; the set ranges with the request search; the request's lengths (make_unit)
  // while the slots are scanned. Larger batches add a search step each.
  const SetRange first = load_set_range(p, first_set + (threadIdx.x & 31), num_sets(p));
  int prefix;
  const int b = find_request_warp(p, grp, &prefix);
  me_mark(kMeSearched);
  const int m = (grp - prefix) * p.m_group + lane_m;
  *unit = make_unit(p, b, m);
  const int n = m < request_num_units(p, b) ? collect_slots(p, grp, first_set, lane_m, first, slots) : 0;
  me_mark(kMeSlots);
  return n;
}

// Called by every thread of every CTA after its attention work (a CTA with none included).
// Returns whether it passed the grid barrier (every CTA has finished its attention).
__device__ __forceinline__ bool combine_splits(const MlaParams& p) {
  // The plan is the same in every CTA, so either all of them wait at the barrier or none does.
  const int units = p.split_groups[0] * p.m_group;
  if (units == 0 || (kProbe & 4) != 0) return false;
  // Split phases: this CTA's partials are published at the arrival (a release); the scale and
  // its first unit's lookup (plan data only) are loaded while the other CTAs finish, so a CTA
  // waiting at the barrier has them when it is released.
  me_reset();
  const cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  cooperative_groups::grid_group::arrival_token arrival = grid.barrier_arrive();

  extern __shared__ uint8_t smem_raw[];
  CombineSmem& cs = *reinterpret_cast<CombineSmem*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  int* slots = cs.slots[warp];
  float* weight = cs.weight[warp];
  uint4 (*stage)[32] = cs.stage[warp];
  const float bmm2 = load_scale(p.bmm2_scale_ptr, p.bmm2_scale);

  // Items: whole rows, or 128- or 256-column chunks of rows when even the chunks are not more
  // than the warps (a short request split many ways: few rows, many splits each). A unit's rows are
  // counted as q_len * H when a uniform query length makes that fewer than a unit holds (H = 16
  // decode: 16 rows), so that the warps share only rows that exist. A warp's items are
  // contiguous; warps are numbered warp 0 of every CTA first, so that few items still spread
  // over all SMs.
  const int unit_cap = 1 << p.unit_rows_log2;
  const int unit_rows = p.cum_q == nullptr ? max(1, min(unit_cap, p.q_len * p.head_div.d)) : unit_cap;
  // 32-bit: units < num_ctas <= kMaxCtas (a split group per cut), so whole-row items are fewer
  // than 64 kMaxCtas, and chunk items (per_row 2 or 4) no more than the warps.
  const int rows = units * unit_rows;
  const int warps = (int)gridDim.x * kCombineWarps;
  // Few rows (a short request split many ways): 128-column items when four per row are not
  // more than the warps, else 256-column ones when two are not, else rows.
  const int per_row = rows * kCombineQuarters <= warps ? kCombineQuarters
                      : rows * kCombineChunks <= warps ? kCombineChunks
                                                       : 1;
  const int items = rows * per_row, unit_items = unit_rows * per_row;
  const int per_warp = (items + warps - 1) / warps;
  const int item0 = (warp * (int)gridDim.x + (int)blockIdx.x) * per_warp;
  const int item1 = min(items, item0 + per_warp);
  int cur_unit = -1, cur_row = -1, n = 0;
  float lse = -INFINITY;
  Unit unit{};
  if (item0 < item1) {
    cur_unit = item0 / unit_items;
    n = lookup_unit(p, cur_unit, slots, &unit);
  }
  grid.barrier_wait(std::move(arrival));  // every partial is written (and visible: acquire)
  trace_mark(kMarkSynced);
  me_mark(kMeSynced);

  for (int item = item0; item < item1; ++item) {
    const int u = item / unit_items;
    const int r = item / per_row % unit_rows;
    if (u != cur_unit) {
      __syncwarp();  // slots and weight of the previous unit no longer read
      cur_unit = u;
      cur_row = -1;
      n = lookup_unit(p, u, slots, &unit);
    }
    if (n == 0 || r >= unit.rows) continue;
    if (per_row == 1 && n <= kCombineRowLanes) {
      // Whole rows, few splits: up to kCombineRows of this warp's rows of the unit merged
      // together, as many as one round of the staging holds.
      const int k = min(min(kCombineRows, unit.rows - r), min(item1 - item, kStageChunks / (kCombineChunks * n)));
      if (k > 1) {
        merge_rows(p, unit, slots, weight, n, r, k, bmm2, stage);
        item += k - 1;
        cur_row = -1;
        continue;
      }
    }
    // A row's chunks are consecutive: its weights are worked out once, at its first.
    const bool new_row = r != cur_row;
    if (new_row) __syncwarp();  // weight of the previous row no longer read
    cur_row = r;
    // Item's columns: chunk item % per_row of kHeadDimV / per_row.
    const int col0 = item % per_row * (kHeadDimV / per_row);
    if (per_row == kCombineQuarters)
      merge_item<1, true>(p, unit, slots, weight, n, r, col0, new_row, &lse, bmm2, stage);
    else if (per_row == kCombineChunks)
      merge_item<1, false>(p, unit, slots, weight, n, r, col0, new_row, &lse, bmm2, stage);
    else
      merge_row_regs(p, unit, slots, weight, n, r, new_row, &lse, bmm2);
  }
  return true;
}

}  // namespace jit_mla
