// Split merge, the last phase of the attention kernel itself (no second kernel): once every CTA
// has written its partials (a grid-wide barrier; the kernel is launched cooperatively, so all
// its CTAs are resident and the barrier cannot wait for a CTA that never starts), the CTAs share
// the rows of every split unit. One launch per call instead of two saves ~2.5 us of host time
// and the drain-and-launch gap between two kernels on the GPU.
//
// Items of output rows (a whole row, or 128 or 256 columns of one), contiguous per warp: a warp
// weighs a row's n normalized bf16 partials (partial_row) in fp32 and writes bf16, one item after
// another (combine_cols) or, for whole rows with few splits, up to four rows of one unit together
// (combine_rows). Consecutive items mostly share a row (whose weights it works out once) and a
// unit (whose list of partial slots it collects once).
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
constexpr int kCombineQuarters = 4;                          // 128-column items: 4 bf16 per lane
constexpr int kCombineLoadsInFlight = 16;                 // 16-byte loads per lane per step (combine_rows)
// combine_cols: registers per lane that a step's partial loads fill (9 splits of a whole row, 18
// of a 256-column chunk, 36 of a 128-column one): the loop is bound by the latency of these
// loads, so a step takes as many splits as fit.
constexpr int kCombineRegsInFlight = 72;
template <int kChunks, int kLane>
constexpr int kCombineColsSplits = kCombineRegsInFlight / (kChunks * kLane / 2);  // combine_cols' splits per step
constexpr int kCombineRows = 4;                           // whole rows merged together (combine_rows)
constexpr int kCombineRowsSplits = kCombineLoadsInFlight / (kCombineRows * kCombineChunks);  // its splits per step

// Per warp: the current unit's partial slots and the current row's per-split LSE, then weight.
// Lives at the start of the attention kernel's dynamic shared memory (the Q tile or the first KV
// stages, by kernel), free once attention is done: every load into it waited for, every wgmma
// retired, and a CTA barrier (the grid barrier's arrival) behind.
struct CombineSmem {
  int slots[kCombineWarps][kMaxCtas];
  float weight[kCombineWarps][kMaxCtas];
};
static_assert(sizeof(CombineSmem) <= kTileBytes, "the combine reuses the Q tile's shared memory");

// Set s's range [bounds[s], bounds[s + 1]) (an empty one past the last set).
struct SetRange {
  WorkPos a, c;
};
__device__ __forceinline__ SetRange load_set_range(const MlaParams& p, int s, int num_sets) {
  if (s >= num_sets) return SetRange{WorkPos{INT_MAX, 0}, WorkPos{INT_MAX, 0}};
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
  const int num_sets = p.num_ctas / p.m_group;
  int count = 0;
  SetRange r = first;
  for (int base = first_set; base < num_sets; base += 32) {
    const int s = base + lane;
    if (base != first_set) r = load_set_range(p, s, num_sets);
    const bool past = r.a.group > grp;  // past the last set too (INT_MAX)
    const bool in = s < num_sets && !past && !(r.a.group == r.c.group && r.a.block == r.c.block);
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

// Row r's weights 2^(lse_j - lse) into weight[0, n) and its lse = log2 sum_j 2^lse_j.
// The first kHeldLse * 32 LSEs (every split on a 132-SM GPU) are loaded in one round into
// registers: a loop stores each before the next load issues, a round trip per 32 splits.
constexpr int kHeldLse = 4;
__device__ __forceinline__ float row_weights(const MlaParams& p, const int* slots, float* weight,
                                             int n, int r) {
  const int lane = threadIdx.x & 31;
  float x[kHeldLse];
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) {
    const int j = lane + 32 * i;
    x[i] = j < n ? __ldcg(p.partial_lse + slots[j] * kBlockM + r) : -INFINITY;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) mx = fmaxf(mx, x[i]);
  for (int j = lane + 32 * kHeldLse; j < n; j += 32) {
    const float y = __ldcg(p.partial_lse + slots[j] * kBlockM + r);
    weight[j] = y;  // this lane's own entries until the weights replace them
    mx = fmaxf(mx, y);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float lse = -INFINITY;
  if (mx != -INFINITY) {
    float sum = 0.f;  // entries past n are -inf: 0
#pragma unroll
    for (int i = 0; i < kHeldLse; ++i) sum += exp2f(x[i] - mx);
    for (int j = lane + 32 * kHeldLse; j < n; j += 32) sum += exp2f(weight[j] - mx);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    lse = mx + log2f(sum);
  }
#pragma unroll
  for (int i = 0; i < kHeldLse; ++i) {
    const int j = lane + 32 * i;
    if (j < n) weight[j] = lse == -INFINITY ? 0.f : exp2f(x[i] - lse);
  }
  for (int j = lane + 32 * kHeldLse; j < n; j += 32) weight[j] = lse == -INFINITY ? 0.f : exp2f(weight[j] - lse);
  __syncwarp();
  return lse;
}

// Row r's kChunks chunks of 32 kLane columns (kLane bf16 per lane: 8 or 4) from column col0 on,
// of splits j .. j + kSplits - 1 (missing splits read nothing: 0), as kLane / 2 words.
template <int kSplits, int kChunks, int kLane>
__device__ __forceinline__ void load_partials(const MlaParams& p, const int* slots, int n, int j,
                                              int r, int col0, uint32_t (&v)[kSplits][kChunks][kLane / 2]) {
  constexpr int kCols = 32 * kLane;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < kSplits; ++k) {
    const __nv_bfloat16* src = partial_row(p, slots[min(j + k, n - 1)], r) + col0 + kLane * lane;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if constexpr (kLane == 8) {
        const uint4 x = j + k < n ? __ldcg(reinterpret_cast<const uint4*>(src + kCols * c)) : make_uint4(0, 0, 0, 0);
        v[k][c][0] = x.x; v[k][c][1] = x.y; v[k][c][2] = x.z; v[k][c][3] = x.w;
      } else {
        const uint2 x = j + k < n ? __ldcg(reinterpret_cast<const uint2*>(src + kCols * c)) : make_uint2(0, 0);
        v[k][c][0] = x.x; v[k][c][1] = x.y;
      }
    }
  }
}

// acc[0 .. 2 kW) += w * the 2 kW bf16 of u.
template <int kW>
__device__ __forceinline__ void fma_bf16(float (&acc)[2 * kW], float w, const uint32_t (&u)[kW]) {
#pragma unroll
  for (int i = 0; i < kW; ++i) {
    acc[2 * i] = fmaf(w, __uint_as_float(u[i] << 16), acc[2 * i]);
    acc[2 * i + 1] = fmaf(w, __uint_as_float(u[i] & 0xffff0000u), acc[2 * i + 1]);
  }
}

// Row r's kChunks chunks of 32 kLane columns from column col0 on, acc = sum_j weight_j O_j:
// finalized (sink, bmm2_scale) and stored as bf16; its LSE with the first chunk.
template <int kChunks, int kLane>
__device__ __forceinline__ void store_row_cols(const MlaParams& p, const Unit& unit, int r, int col0, float lse,
                                               float bmm2, const float (&acc)[kChunks][kLane]) {
  constexpr int kCols = 32 * kLane;
  const int lane = threadIdx.x & 31;
  const int head = (unit.row0 + r) % p.num_heads;
  const RowFinal fin = finalize_row(lse, p.sinks, head, bmm2);
  const long long row = unit.q_row_base + r;
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + row * kHeadDimV + col0 + kLane * lane;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t w[kLane / 2];
#pragma unroll
    for (int i = 0; i < kLane / 2; ++i) w[i] = pack_bf16x2(acc[c][2 * i] * fin.scale, acc[c][2 * i + 1] * fin.scale);
    if constexpr (kLane == 8)
      *reinterpret_cast<uint4*>(out + kCols * c) = make_uint4(w[0], w[1], w[2], w[3]);
    else
      *reinterpret_cast<uint2*>(out + kCols * c) = make_uint2(w[0], w[1]);
  }
  if (p.lse != nullptr && lane == 0 && col0 == 0) p.lse[row] = fin.lse;
}

// kChunks chunks of 32 kLane columns of row r from column col0 on: sum_j weight_j O_j, finalized.
// Each step loads the chunks of as many splits as fill kCombineRegsInFlight registers per lane.
// new_row: the row's weights (and *lse_io) are not worked out yet;
// that happens while the first partials are in flight (the two sets of loads are independent).
template <int kChunks, int kLane>
__device__ __forceinline__ void combine_cols(const MlaParams& p, const Unit& unit, const int* slots,
                                             float* weight, int n, int r, int col0, bool new_row,
                                             float* lse_io, float bmm2) {
  constexpr int kSplits = kCombineColsSplits<kChunks, kLane>;
  float acc[kChunks][kLane];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < kLane; ++i) acc[c][i] = 0.f;
  uint32_t v[kSplits][kChunks][kLane / 2];
  load_partials<kSplits, kChunks, kLane>(p, slots, n, 0, r, col0, v);
  if (new_row) *lse_io = row_weights(p, slots, weight, n, r);
  const float lse = *lse_io;
  me_mark(kMeWeights);
  for (int j = 0; j < n; j += kSplits) {
    if (j > 0) load_partials<kSplits, kChunks, kLane>(p, slots, n, j, r, col0, v);
#pragma unroll
    for (int k = 0; k < kSplits; ++k) {
      const float w = j + k < n ? weight[j + k] : 0.f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) fma_bf16<kLane / 2>(acc[c], w, v[k][c]);
    }
    me_mark(kMeRound);
  }
  store_row_cols<kChunks, kLane>(p, unit, r, col0, lse, bmm2, acc);
  me_mark(kMeStored);
}

// Whole rows r0 .. r0 + k - 1 (k <= kR) of one unit, n <= 32 / kR splits each, merged together:
// every row's loads in flight at once (one row after another, a warp's rows were a round trip
// each: 4 rows of ~3 splits per warp at B32 H128). The weights stay in registers: lane
// i kSeg + j holds split j of row i, its LSE reduced over the row's kSeg lanes. The same numbers
// as row_weights + combine_cols while a segment has a lane past n (its -inf): with all kSeg
// LSEs NaN, row_weights' fmaxf from -inf gives lse -inf, this NaN. The caller's rounds test
// keeps n <= 6 here.
template <int kR>
__device__ __forceinline__ void combine_rows(const MlaParams& p, const Unit& unit, const int* slots, int n, int r0,
                                             int k, float bmm2) {
  constexpr int kSeg = 32 / kR, kS = kCombineRowsSplits;  // lanes per row, splits per step
  static_assert(kR == kCombineRows, "kCombineRowsSplits is for kCombineRows rows");
  static_assert(kSeg % kS == 0, "a step's splits stay inside a row's lanes");
  const int lane = threadIdx.x & 31;
  auto load_step = [&](int j0, uint32_t (&v)[kS][kR][kCombineChunks][4]) {
#pragma unroll
    for (int s = 0; s < kS; ++s)
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const bool in = j0 + s < n && i < k;
        const __nv_bfloat16* src = partial_row(p, slots[min(j0 + s, n - 1)], r0 + min(i, k - 1)) + 8 * lane;
#pragma unroll
        for (int c = 0; c < kCombineChunks; ++c) {
          const uint4 x = in ? __ldcg(reinterpret_cast<const uint4*>(src + kCombineCols * c)) : make_uint4(0, 0, 0, 0);
          v[s][i][c][0] = x.x; v[s][i][c][1] = x.y; v[s][i][c][2] = x.z; v[s][i][c][3] = x.w;
        }
      }
  };
  uint32_t v[kS][kR][kCombineChunks][4];
  load_step(0, v);
  // Weights while the first partials are in flight: as row_weights, per kSeg-lane segment.
  const int mine_i = lane / kSeg, mine_j = lane % kSeg;
  const float x = mine_i < k && mine_j < n ? __ldcg(p.partial_lse + slots[mine_j] * kBlockM + r0 + mine_i) : -INFINITY;
  float mx = x;
#pragma unroll
  for (int d = kSeg / 2; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float sum = mx == -INFINITY ? 0.f : exp2f(x - mx);
#pragma unroll
  for (int d = kSeg / 2; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
  const float lse = mx == -INFINITY ? -INFINITY : mx + log2f(sum);
  const float weight = lse == -INFINITY ? 0.f : exp2f(x - lse);
  me_mark(kMeWeights);

  float acc[kR][kCombineChunks][8];
#pragma unroll
  for (int i = 0; i < kR; ++i)
#pragma unroll
    for (int c = 0; c < kCombineChunks; ++c)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[i][c][e] = 0.f;
  for (int j0 = 0; j0 < n; j0 += kS) {
    if (j0 > 0) load_step(j0, v);
#pragma unroll
    for (int s = 0; s < kS; ++s)
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const float w = __shfl_sync(0xffffffffu, weight, i * kSeg + j0 + s);  // 0 past n
#pragma unroll
        for (int c = 0; c < kCombineChunks; ++c) fma_bf16<4>(acc[i][c], w, v[s][i][c]);
      }
    me_mark(kMeRound);
  }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const float row_lse = __shfl_sync(0xffffffffu, lse, i * kSeg);
    if (i < k) store_row_cols<kCombineChunks, 8>(p, unit, r0 + i, 0, row_lse, bmm2, acc[i]);
  }
  me_mark(kMeStored);
}

// Unit u of the split list (the u / m_group-th split group, lane u % m_group): its geometry into
// *unit and its partials' slots into slots; returns their count, 0 when the request's last
// group has no unit in this lane (nothing to merge). Reads only the plan (every CTA wrote the
// same values) and the inputs, so it may run before the grid barrier completes.
__device__ __forceinline__ int lookup_unit(const MlaParams& p, int u, int* slots, Unit* unit) {
  me_mark(kMeUnit);
  const int grp = p.split_groups[1 + 2 * (u / p.m_group)], lane_m = u % p.m_group;
  const int first_set = p.split_groups[2 + 2 * (u / p.m_group)];
  // Three rounds of dependent loads before the partials (B <= 32, a scan of <= 32 sets): the
  // split list; the set ranges with the request search; the request's lengths (make_unit)
  // while the slots are scanned. Larger batches add a search step each.
  const SetRange first = load_set_range(p, first_set + (threadIdx.x & 31), p.num_ctas / p.m_group);
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
__device__ __forceinline__ void combine_splits(const MlaParams& p) {
  // The plan is the same in every CTA, so either all of them wait at the barrier or none does.
  const int units = p.split_groups[0] * p.m_group;
  if (units == 0 || (kProbe & 4) != 0) return;
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
  const float bmm2 = load_scale(p.bmm2_scale_ptr, p.bmm2_scale);

  // Items: whole rows, or 128- or 256-column chunks of rows when even the chunks are not more
  // than the warps (a short request split many ways: few rows, many splits each). A unit's rows are
  // counted as q_len * H when a uniform query length makes that fewer than a unit holds (H = 16
  // decode: 16 rows), so that the warps share only rows that exist. A warp's items are
  // contiguous; warps are numbered warp 0 of every CTA first, so that few items still spread
  // over all SMs.
  const int unit_cap = 1 << p.unit_rows_log2;
  const int unit_rows = p.cum_q == nullptr ? max(1, min(unit_cap, p.q_len * p.num_heads)) : unit_cap;
  // 32-bit: units < num_ctas <= kMaxCtas (a split group per cut), so whole-row items are fewer
  // than 64 kMaxCtas, and chunk items (per_row 2 or 4) no more than the warps.
  const int rows = units * unit_rows;
  const int warps = (int)gridDim.x * kCombineWarps;
  // Few rows (a short request split many ways): 128-column items (4 bf16 per lane) when four
  // per row are not more than the warps, else 256-column ones when two are not, else rows.
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
    if (per_row == 1 && n <= 32 / kCombineRows) {
      // Whole rows, few splits: up to kCombineRows of this warp's rows of the unit merged
      // together, where that takes fewer rounds of loads than one row after another.
      const int k = min(min(kCombineRows, unit.rows - r), item1 - item);
      constexpr int kS = kCombineRowsSplits, kRowSplits = kCombineColsSplits<kCombineChunks, 8>;
      const int row_rounds = (n + kRowSplits - 1) / kRowSplits;
      if (k > 1 && (n + kS - 1) / kS < k * row_rounds) {
        combine_rows<kCombineRows>(p, unit, slots, n, r, k, bmm2);
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
      combine_cols<1, kHeadDimV / kCombineQuarters / 32>(p, unit, slots, weight, n, r, col0, new_row, &lse, bmm2);
    else if (per_row == kCombineChunks)
      combine_cols<1, 8>(p, unit, slots, weight, n, r, col0, new_row, &lse, bmm2);
    else
      combine_cols<kCombineChunks, 8>(p, unit, slots, weight, n, r, 0, new_row, &lse, bmm2);
  }
}

}  // namespace jit_mla
