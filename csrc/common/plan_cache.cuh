// The split plan kept in the workspace across calls with the same inputs. A serving step calls us
// once per layer (61 times for DeepSeek-V3) with the same seq_lens and query lengths, and every
// CTA would otherwise re-plan each time (plan.cuh: a serial chain of ~2-3 µs at small batch).
//
// The workspace holds, at its start, a header (the launcher's key: everything the plan depends on
// besides the input values, and the layout it is kept in) and a copy of the input values the
// plan was made from (seq_lens, then cum_seq_lens_q). The plan words read after the plan
// (group_prefix, bounds, split_groups, with their padding) lie in one span, and a span of the
// same size after it holds each word's complement, its shadow. A CTA reuses the plan when, in
// one round of loads, the header equals this call's key, the copies equal the inputs and every
// word of the span equals the complement of its shadow; otherwise it plans. Once every CTA has
// checked, the last CTA publishes if it planned: shadows, copies, header. "Every CTA has checked"
// is the merge's grid barrier in a call with splits; a call without one arrives at the same
// barrier word once per CTA after its check and only the publisher waits (unsplit_arrive below).
//
// Why a match is this call's plan, without fences: calls do not overlap (each waits for the
// previous grid at the PDL wait, which also makes its writes visible), and within a call nothing
// writes the header, the copies or the shadows before every CTA has checked (above), so
// every CTA reads them as the last publish left them (or as something else wrote over them).
// The plan words may change under a reader: CTAs that plan write them, but only with this
// call's plan, the same values in every CTA. So a word read is either the value the call started
// with or this call's plan word. A header and copies that match say the shadows are the
// complements of this call's plan words (the publish wrote them from that plan), so a word that
// matches its shadow is this call's plan word, whichever version was read. After the call the
// span still matches its shadows: a CTA that reused saw every word match, and words written since
// are the same values. Another kernel writing into a workspace shared with us between our calls
// breaks the header or the copies (then we plan) or the span (then a word and its shadow
// disagree: zeros or any one fill value never give a word and its complement). Not checked: the
// partials and cost_prefix (no call reads them before writing them).
#pragma once
#include <cooperative_groups.h>

#include "../config.h"
#include "params.h"
#include "units.cuh"

namespace jit_mla {

// The input words the plan is made from, in the copy's order: seq_lens [B], then cum_q [B+1].
__device__ __forceinline__ int plan_input_words(const MlaParams& p) {
  return p.cum_q == nullptr ? p.batch : 2 * p.batch + 1;
}
__device__ __forceinline__ int plan_input_word(const MlaParams& p, int i) {
  return i < p.batch ? p.seq_lens[i] : p.cum_q[i - p.batch];
}

// The span's int4 i against its shadow.
__device__ __forceinline__ bool plan_span_intact(const int4 w, const int4 s) {
  return (w.x ^ s.x) == -1 && (w.y ^ s.y) == -1 && (w.z ^ s.z) == -1 && (w.w ^ s.w) == -1;
}

// By every thread of the CTA: whether the workspace holds this call's plan. Plain loads, one
// round of them per NT int4s of the span and NT input words (one round up to B ~ 300), which
// leave the plan's lines in L1 for cta_range and the request searches, and seq_lens in L1 for a
// plan that follows.
template <int NT>
__device__ __forceinline__ bool plan_in_workspace(const MlaParams& p) {
  if (!p.plan_check) return false;  // the launcher's hint: the last call here had another key
  const int tid = threadIdx.x, n4 = p.plan_span4, n = plan_input_words(p);
  const int4* span = reinterpret_cast<const int4*>(p.group_prefix);
  bool ok = tid >= kPlanKeyWords || p.plan_header[tid] == p.plan_key[tid];
#pragma unroll 1
  for (int i = tid; i < max(n4, n); i += NT) {
    if (i < n4) ok &= plan_span_intact(span[i], span[i + n4]);
    if (i < n) ok &= plan_input_word(p, i) == p.plan_input_copy[i];
  }
  return __syncthreads_and(ok) != 0;
}

// By every thread of the last CTA once every CTA has checked (unsplit_arrive below), when
// it planned: the shadows, the copies, the header. Plain stores, no fence: the next call reads
// them after our grid completes.
__device__ __forceinline__ void publish_plan(const MlaParams& p) {
  const int tid = threadIdx.x, nt = blockDim.x, n4 = p.plan_span4, n = plan_input_words(p);
  int4* span = reinterpret_cast<int4*>(p.group_prefix);
#pragma unroll 1
  for (int i = tid; i < n4; i += nt) {
    const int4 w = span[i];
    span[i + n4] = make_int4(~w.x, ~w.y, ~w.z, ~w.w);
  }
#pragma unroll 1
  for (int i = tid; i < n; i += nt) p.plan_input_copy[i] = plan_input_word(p, i);
  if (tid < kPlanKeyWords) p.plan_header[tid] = p.plan_key[tid];
}

// A call without splits (every uniform batch that fills whole sets: B128 decode) has no grid
// barrier, yet re-planning costs it ~2.3 us a call at B128 (3.8 us from entry to its first unit
// against 1.5 with the plan reused; Session 45's trace). So every CTA but the publisher (the last)
// arrives, once its check is done, at the cooperative launch's grid barrier word, the one
// cooperative_groups' grid barrier uses (the driver's: no kernel writes it but through its phases);
// the publisher arrives at its end and waits for the phase to complete before it publishes. One
// phase adds 2^31 in all (CTA 0 adds 2^31 - (grid - 1), the others 1): with the low 31 bits at
// zero when it starts (every phase, ours or the grid barrier's, leaves them so), its top bit flips
// at the last arrival. Calls with splits never arrive here (only at the merge's grid barrier).
// Arrival: a release after the barrier that consumed the CTA's check; the wait: an acquire. The
// `.global` ops take the word's global-space address (cvta.to.global of the driver's pointer).
__device__ __forceinline__ size_t grid_barrier_word() {
  return __cvta_generic_to_global(&cooperative_groups::details::get_grid_workspace()->barrier);
}
__device__ __forceinline__ unsigned grid_phase_share() {
  return blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
}
__device__ __forceinline__ bool is_plan_publisher() { return blockIdx.x == gridDim.x - 1; }

// By every thread of a CTA after its check (and the split list's count is known): one thread of
// the last warp (warp 0 issues the first loads) arrives, when the call has no split.
__device__ __forceinline__ void unsplit_arrive(const MlaParams& p) {
  if (threadIdx.x == blockDim.x - 32 && !is_plan_publisher() && p.split_groups[0] == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(grid_barrier_word()), "r"(grid_phase_share())
                 : "memory");
  }
}

// By every thread of the publisher CTA, at its end in a call without splits: arrives and waits
// for every other CTA's arrival.
__device__ __forceinline__ void unsplit_arrive_and_wait() {
  if (threadIdx.x == 0) {
    const size_t word = grid_barrier_word();
    unsigned old, now;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(grid_phase_share())
                 : "memory");
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
    } while (((old ^ now) & 0x80000000u) == 0);
  }
  __syncthreads();
}

}  // namespace jit_mla
