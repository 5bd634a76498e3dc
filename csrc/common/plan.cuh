// Split-KV planner: one CTA of kPlanThreads threads, run on the device from seq_lens (no host
// sync, so it is safe inside CUDA-graph capture and independent of max_seq_len).
//
// Work order: units (64-row tiles) request by request; unit u costs kUnitOverheadBlocks + its KV
// blocks. The total cost W is cut into num_ctas' equal ranges; a cut falling inside a unit's KV
// blocks splits that unit (its partials are merged by the combine kernel), a cut falling in its
// overhead snaps to the unit's start. Deterministic: the same inputs give the same plan.
#pragma once
#include "../config.h"
#include "params.h"
#include "units.cuh"

namespace jit_mla {

// Exclusive block-wide scan of one int64 per thread; returns the thread's prefix, *total the sum.
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* total) {
  __shared__ long long s_warp[kPlanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    long long w = lane < kPlanThreads / 32 ? s_warp[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    if (lane < kPlanThreads / 32) s_warp[lane] = w;  // inclusive warp totals
  }
  __syncthreads();
  const long long warp_base = warp > 0 ? s_warp[warp - 1] : 0;
  *total = s_warp[kPlanThreads / 32 - 1];
  __syncthreads();  // s_warp is reused by the next scan
  return warp_base + x - v;
}

__device__ void plan_splits(const MlaParams& p) {
  const int tid = threadIdx.x;
  const int B = p.batch;

  // 1. unit_prefix[b]: first unit of request b. Each thread scans a contiguous chunk serially.
  {
    const int chunk = (B + kPlanThreads - 1) / kPlanThreads;
    const int b0 = min(B, tid * chunk), b1 = min(B, b0 + chunk);
    long long local = 0;
    for (int b = b0; b < b1; ++b) local += request_num_units(p, b);
    long long total;
    long long run = block_exclusive_scan(local, &total);
    for (int b = b0; b < b1; ++b) {
      p.unit_prefix[b] = (int)run;
      run += request_num_units(p, b);
    }
    if (tid == 0) p.unit_prefix[B] = (int)total;
  }
  __syncthreads();
  const int U = p.unit_prefix[B];

  // 2. cost_prefix[u+1] = cost of units 0..u.
  long long W;
  {
    const int chunk = (U + kPlanThreads - 1) / kPlanThreads;
    const int u0 = min(U, tid * chunk), u1 = min(U, u0 + chunk);
    long long local = 0;
    int b = u0 < u1 ? find_request(p, u0) : 0;
    for (int u = u0; u < u1; ++u) {
      while (p.unit_prefix[b + 1] <= u) ++b;
      local += kUnitOverheadBlocks + make_unit(p, b, u - p.unit_prefix[b]).num_blocks;
    }
    long long run = block_exclusive_scan(local, &W);
    b = u0 < u1 ? find_request(p, u0) : 0;
    for (int u = u0; u < u1; ++u) {
      while (p.unit_prefix[b + 1] <= u) ++b;
      run += kUnitOverheadBlocks + make_unit(p, b, u - p.unit_prefix[b]).num_blocks;
      p.cost_prefix[u + 1] = run;
    }
    if (tid == 0) p.cost_prefix[0] = 0;
  }
  __syncthreads();

  // 3. CTA boundaries. Few CTAs for little work: each gets >= kMinBlocksPerCta blocks' worth.
  const int G = p.num_ctas;
  const long long per_cta_min = kMinBlocksPerCta + kUnitOverheadBlocks;
  const int g_eff = (int)max(1LL, min((long long)G, (W + per_cta_min - 1) / per_cta_min));
  for (int g = tid; g <= G; g += kPlanThreads) {
    const long long x = g >= g_eff ? W : (long long)g * W / g_eff;
    WorkPos pos{U, 0};
    if (x < W) {
      int lo = 0, hi = U - 1;  // largest u with cost_prefix[u] <= x
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.cost_prefix[mid] <= x) lo = mid; else hi = mid - 1;
      }
      const long long k = x - p.cost_prefix[lo] - kUnitOverheadBlocks;
      pos = WorkPos{lo, k > 0 ? (int)k : 0};
    }
    p.bounds[g] = pos;
  }
  __syncthreads();

  // 4. Units split by at least one cut, listed once each (at their first cut) for the combine.
  {
    bool first_cut = false;
    int unit = 0;
    if (tid >= 1 && tid < G) {
      const WorkPos cur = p.bounds[tid], prev = p.bounds[tid - 1];
      first_cut = cur.block > 0 && !(prev.unit == cur.unit && prev.block > 0);
      unit = cur.unit;
    }
    long long count;
    const long long idx = block_exclusive_scan(first_cut ? 1 : 0, &count);
    if (first_cut) p.split_units[1 + idx] = unit;
    if (tid == 0) p.split_units[0] = (int)count;
  }
}

}  // namespace jit_mla
