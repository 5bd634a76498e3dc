// Stamps: how a merging warp knows that the partials it reads are written, without a grid-wide
// barrier after the attention (which made every merge wait for the slowest CTA of the call).
//
// The workspace's first words (MlaParams::sync): [0] counts the calls that split; [1 + c] is
// CTA c's stamp. A call that splits takes the next count as its stamp: CTA 0 increments the
// count after the plan, and every CTA arrives at the cooperative grid barrier there (split
// phase: nobody waits yet). After its attention a CTA completes that barrier (every CTA arrived
// long before, so the count is this call's), reads the count and writes it as its stamp (a
// release: its partials before it). A warp merges a unit once the stamps of the CTAs that wrote
// its partials equal the count (relaxed polls, then an acquire fence).
//
// Nothing needs a reset and any initial value works: a stamp left by an earlier call is an
// earlier count, never this call's (until the count wraps after 2^32 splitting calls on one
// workspace); a CUDA graph's replays each take a new count. The count is read only after the
// barrier and incremented only after the PDL wait, so neither the previous nor the next call in
// the stream (PDL lets its CTAs start early) can mix theirs in. Every CTA writes its stamp,
// whether or not it had attention work, so no merge waits forever; the launch is cooperative,
// so every CTA is resident. Workspace bytes another kernel wrote in between that happen to equal
// the next count could pass for a stamp: the workspace must be this function's alone between
// calls, as its partials already require.
#pragma once
#include <cooperative_groups.h>

#include "../config.h"
#include "params.h"

namespace jit_mla {

// Thread 0's arrival token of the grid barrier, from start_cta to the merge. Static shared memory
// (a kernel without any keeps the plain grid barrier: combine_splits<false>).
__shared__ unsigned s_arrival;

__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// After the plan (its last barrier behind it), every thread: a call that splits takes the next
// count and arrives at the grid barrier. Every CTA reads the same split count.
__device__ __forceinline__ void stamp_arrive(const MlaParams& p) {
  if (p.split_groups[0] == 0) return;
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(p.sync, 1u);  // ordered before the arrival's release
  const unsigned token = cooperative_groups::this_grid().barrier_arrive();
  if (threadIdx.x == 0) s_arrival = token;
}

// After the attention, every thread: completes the barrier, stamps this CTA's partials as
// written; returns the call's stamp.
__device__ __forceinline__ unsigned stamp_partials(const MlaParams& p) {
  unsigned token = s_arrival;  // thread 0's is the one used
  cooperative_groups::this_grid().barrier_wait(std::move(token));  // ends in a CTA barrier: all partials written
  const unsigned stamp = ld_relaxed_gpu(p.sync);
  if (threadIdx.x == 0) st_release_gpu(p.sync + 1 + blockIdx.x, stamp);
  return stamp;
}

// Warp-wide: waits until the CTAs that wrote slots[0, n) have stamped them (slot
// (kSlotsPerCta s + which) m_group + lane belongs to CTA s m_group + lane).
__device__ __forceinline__ void wait_stamps(const MlaParams& p, const int* slots, int n, unsigned stamp) {
  constexpr int kHeld = 4;  // stamps polled at once per lane: every split on a 132-SM GPU
  const int lane = threadIdx.x & 31;
  const int per_set = kSlotsPerCta * p.m_group;
  auto stamp_of = [&](int j) {
    const int slot = slots[j];
    return p.sync + 1 + slot / per_set * p.m_group + slot % p.m_group;
  };
  const unsigned* w[kHeld];
  unsigned v[kHeld];
#pragma unroll
  for (int i = 0; i < kHeld; ++i) {
    const int j = lane + 32 * i;
    w[i] = j < n ? stamp_of(j) : p.sync;
    v[i] = j < n ? ld_relaxed_gpu(w[i]) : stamp;
  }
#pragma unroll
  for (int i = 0; i < kHeld; ++i)
    while (v[i] != stamp) {
      __nanosleep(64);
      v[i] = ld_relaxed_gpu(w[i]);
    }
  for (int j = lane + 32 * kHeld; j < n; j += 32)
    while (ld_relaxed_gpu(stamp_of(j)) != stamp) __nanosleep(64);
  __threadfence();  // acquire: the partials behind the stamps this lane saw
  __syncwarp();     // and for the warp's other lanes
}

}  // namespace jit_mla
