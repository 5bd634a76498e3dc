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
// checked (after the merge's grid barrier), the last CTA publishes if it planned: shadows,
// copies, header. A call without a split has no grid barrier and does not publish.
//
// Why a match is this call's plan, without fences: calls do not overlap (each waits for the
// previous grid at the PDL wait, which also makes its writes visible), and within a call nothing
// writes the header, the copies or the shadows before every CTA has passed the grid barrier, so
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

// By every thread of the last CTA, after the merge's grid barrier (every CTA has checked), when
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

}  // namespace jit_mla
