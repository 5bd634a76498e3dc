// Combine kernel: merges the split-KV partials of every unit the plan split.
//
// Persistent: grid = num_ctas CTAs share the items of all split units evenly. An item is
// kCombineRows rows x kCombineCols columns of one unit (one warp per row, one float4 per lane per
// split), so even one long request's partials are read by every SM, not by the two CTAs its
// units would get with a CTA per unit. A CTA's items are contiguous, so consecutive items mostly
// share a unit and its list of partial slots.
#pragma once
#include "../config.h"
#include "device_utils.cuh"
#include "finalize.cuh"
#include "params.h"
#include "units.cuh"

namespace jit_mla {

constexpr int kCombineRows = kCombineThreads / 32;                  // 8: one warp per row
constexpr int kCombineCols = 128;                                    // 32 lanes x float4
constexpr int kCombineItemsPerUnit = (kBlockM / kCombineRows) * (kHeadDimV / kCombineCols);  // 32

// Slots holding the partials of (lane) unit of group grp, in order, into s_slots; returns count.
// The sets whose ranges [bounds[s], bounds[s+1]) meet the group are consecutive, starting at the
// last s with bounds[s] <= (grp, 0); empty ranges (equal bounds) wrote nothing. Warp 0 scans 32
// sets per step.
__device__ __forceinline__ int collect_slots(const MlaParams& p, int grp, int lane_m, int* s_slots) {
  __shared__ int s_count;
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    const int num_sets = p.num_ctas / p.m_group;
    int lo = 0, hi = num_sets;
    const WorkPos start{grp, 0};
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (!pos_less(start, p.bounds[mid])) lo = mid; else hi = mid - 1;
    }
    int count = 0;
    for (int base = lo; base < num_sets; base += 32) {
      const int s = base + lane;
      bool in = false, past = false;
      if (s < num_sets) {
        const WorkPos a = p.bounds[s], c = p.bounds[s + 1];
        past = a.group > grp;
        in = !past && !(a.group == c.group && a.block == c.block);
      }
      const unsigned take = __ballot_sync(0xffffffffu, in);
      if (in) s_slots[count + __popc(take & ((1u << lane) - 1))] = partial_slot(p, s, grp, lane_m);
      count += __popc(take);
      if (__any_sync(0xffffffffu, past)) break;
    }
    if (lane == 0) s_count = count;
  }
  __syncthreads();
  return s_count;
}

__device__ void combine_splits(const MlaParams& p) {
  __shared__ int s_slots[kMaxCtas];
  __shared__ float s_weight[kCombineRows][kMaxCtas];  // per row: 2^(lse_j - lse) of each split

  // Everything read below is written by the attention kernel just before us (PDL).
  pdl_wait_primary();
  const int units = p.split_groups[0] * p.m_group;
  const int items = units * kCombineItemsPerUnit;
  const int per_cta = (items + gridDim.x - 1) / gridDim.x;
  const int item0 = blockIdx.x * per_cta, item1 = min(items, item0 + per_cta);
  const float bmm2 = load_scale(p.bmm2_scale_ptr, p.bmm2_scale);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  int cur = -1, n = 0;
  Unit unit{};
  for (int item = item0; item < item1; ++item) {
    const int u = item / kCombineItemsPerUnit, rest = item % kCombineItemsPerUnit;
    if (u != cur) {
      __syncthreads();  // s_slots of the previous unit no longer read
      cur = u;
      const int grp = p.split_groups[1 + u / p.m_group], lane_m = u % p.m_group;
      const int b = find_request(p, grp);
      const int m = (grp - p.group_prefix[b]) * p.m_group + lane_m;
      // The request's last group may have no unit in this lane: nothing to merge.
      n = m < request_num_units(p, b) ? collect_slots(p, grp, lane_m, s_slots) : 0;
      if (n > 0) unit = make_unit(p, b, m);
    }
    const int r = (rest / (kHeadDimV / kCombineCols)) * kCombineRows + warp;
    const int col = (rest % (kHeadDimV / kCombineCols)) * kCombineCols + 4 * lane;
    if (n == 0 || r >= unit.rows) continue;

    // Row LSE over the splits (lanes stride the splits), then each split's weight.
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, p.partial_lse[s_slots[j] * kBlockM + r]);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
    float lse = -INFINITY;
    if (mx != -INFINITY) {
      float sum = 0.f;
      for (int j = lane; j < n; j += 32) sum += exp2f(p.partial_lse[s_slots[j] * kBlockM + r] - mx);
#pragma unroll
      for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
      lse = mx + log2f(sum);
    }
    for (int j = lane; j < n; j += 32)
      s_weight[warp][j] = lse == -INFINITY ? 0.f : exp2f(p.partial_lse[s_slots[j] * kBlockM + r] - lse);
    __syncwarp();

    // Four splits' loads in flight per step: the loop is bound by load latency, not arithmetic.
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      float4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        v[k] = *reinterpret_cast<const float4*>(p.partial_o + ((long long)s_slots[j + k] * kBlockM + r) * kHeadDimV + col);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float w = s_weight[warp][j + k];
        acc.x += w * v[k].x; acc.y += w * v[k].y; acc.z += w * v[k].z; acc.w += w * v[k].w;
      }
    }
    for (; j < n; ++j) {
      const float4 v = *reinterpret_cast<const float4*>(p.partial_o + ((long long)s_slots[j] * kBlockM + r) * kHeadDimV + col);
      const float w = s_weight[warp][j];
      acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
    }
    __syncwarp();  // s_weight is rewritten by this warp's next item

    const int head = (unit.row0 + r) % p.num_heads;
    const RowFinal fin = finalize_row(lse, p.sinks, head, bmm2);
    const long long row = unit.q_row_base + r;
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.out) + row * kHeadDimV + col) =
        make_uint2(pack_bf16x2(acc.x * fin.scale, acc.y * fin.scale),
                   pack_bf16x2(acc.z * fin.scale, acc.w * fin.scale));
    if (p.lse != nullptr && col == 0) p.lse[row] = fin.lse;
  }
}

}  // namespace jit_mla
