// Combine kernel: merges the split-KV partials of every unit the plan split. One CTA per unit of
// a split group (grid = num_ctas, an upper bound of their count), one warp per row.
#pragma once
#include "../config.h"
#include "device_utils.cuh"
#include "finalize.cuh"
#include "params.h"
#include "units.cuh"

namespace jit_mla {

__device__ void combine_splits(const MlaParams& p) {
  // The partials come from the attention kernel just before us (PDL: wait for its memory).
  pdl_wait_primary();
  // Block e merges lane (e % m_group) of the (e / m_group)-th split group.
  const int e = blockIdx.x / p.m_group, lane_m = blockIdx.x % p.m_group;
  if (e >= p.split_groups[0]) return;
  const int grp = p.split_groups[1 + e];
  const int b = find_request(p, grp);
  const int m = (grp - p.group_prefix[b]) * p.m_group + lane_m;
  if (m >= request_num_units(p, b)) return;  // the group's last set has no unit in this lane
  const Unit unit = make_unit(p, b, m);

  __shared__ int s_slots[kMaxCtas];
  __shared__ int s_num_slots;
  if (threadIdx.x == 0) {
    // The sets whose ranges [bounds[s], bounds[s+1]) meet the group are consecutive, starting at
    // the last s with bounds[s] <= (grp, 0); empty ranges (equal bounds) wrote nothing.
    const int num_sets = p.num_ctas / p.m_group;
    const WorkPos start{grp, 0};
    int lo = 0, hi = num_sets;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (!pos_less(start, p.bounds[mid])) lo = mid; else hi = mid - 1;
    }
    int n = 0;
    for (int s = lo; s < num_sets && p.bounds[s].group <= grp; ++s) {
      const WorkPos a = p.bounds[s], c = p.bounds[s + 1];
      if (a.group == c.group && a.block == c.block) continue;
      s_slots[n++] = partial_slot(p, s, grp, lane_m);
    }
    s_num_slots = n;
  }
  __syncthreads();
  const int n = s_num_slots;
  const float bmm2 = load_scale(p.bmm2_scale_ptr, p.bmm2_scale);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kCombineThreads / 32;

  for (int r = warp; r < unit.rows; r += kWarps) {
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
    const int head = (unit.row0 + r) % p.num_heads;
    const RowFinal fin = finalize_row(lse, p.sinks, head, bmm2);

    // Each lane owns 4 x 4 columns: lane*4 + 128*i (float4 loads, 8-byte bf16 stores).
    float4 acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lse != -INFINITY) {
      for (int j = 0; j < n; ++j) {
        const int slot = s_slots[j];
        const float w = exp2f(p.partial_lse[slot * kBlockM + r] - lse);
        const float4* src = reinterpret_cast<const float4*>(
            p.partial_o + ((long long)slot * kBlockM + r) * kHeadDimV);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 v = src[lane + 32 * i];
          acc[i].x += w * v.x; acc[i].y += w * v.y; acc[i].z += w * v.z; acc[i].w += w * v.w;
        }
      }
    }
    const long long row = unit.q_row_base + r;
    uint2* dst = reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.out) + row * kHeadDimV);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dst[lane + 32 * i] = make_uint2(pack_bf16x2(acc[i].x * fin.scale, acc[i].y * fin.scale),
                                      pack_bf16x2(acc[i].z * fin.scale, acc[i].w * fin.scale));
    }
    if (p.lse != nullptr && lane == 0) p.lse[row] = fin.lse;
  }
}

}  // namespace jit_mla
