// The split plan kept in the workspace across calls with the same inputs. A serving step calls us
// once per layer (61 times for DeepSeek-V3) with the same seq_lens and query lengths, and every
// CTA would otherwise re-plan each time (plan.cuh: a serial chain of ~2 µs at small batch).
//
// The workspace holds, at its start, a header (the launcher's key of everything the plan depends
// on besides the input values, then the split count) and a copy of the input values the plan
// was made from (seq_lens, then cum_seq_lens_q); every plan word (group_prefix, bounds,
// split_groups) has a shadow holding its complement, p.plan_shadow ints further on. A CTA
// reuses the plan when
//   1. the header's key equals this call's and the copies equal the inputs (one round of loads,
//      beside the inputs), and
//   2. every plan word this call reads equals the complement of its shadow (a second round).
// Otherwise it plans (plan.cuh writes each word and its shadow), then publishes: the copies and
// the header, after a release fence.
//
// Why a match is this call's plan: calls do not overlap (each waits for the previous grid at the
// PDL wait), so at a call's start the header, copies and plan words are those the last call that
// planned left, complete and consistent, or something else wrote over them. Within a call every
// CTA has the same inputs, and a CTA that plans writes the same words as any other; a header or
// copy word that one of them publishes is written after its complete plan (release), and a CTA
// that reads it fences before it reads the plan (acquire). Another kernel writing into a
// workspace shared with us between our calls breaks the header or the copies (then we plan) or
// the plan words (then a word and its shadow disagree: zeros or any one fill value never give a
// word and its complement). Not checked: what no plan word is, the partials, rewritten by every call.
#pragma once
#include "../config.h"
#include "params.h"
#include "units.cuh"

namespace jit_mla {

// The key's words (the launcher fills MlaParams::plan_key), then the split count.
constexpr int kPlanHeaderWords = kPlanKeyWords + 1;

// Loads and stores of the header and the copies: the words another CTA's publish may write
// while we read them (relaxed, gpu scope: their fences order them; plain loads would not).
__device__ __forceinline__ int ld_relaxed_gpu(const int* a) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(a));
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(int* a, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// A plan word and its shadow (plan.cuh's stores).
__device__ __forceinline__ void plan_store(const MlaParams& p, int* a, int v) {
  a[0] = v;
  a[p.plan_shadow] = ~v;
}
__device__ __forceinline__ void plan_store(const MlaParams& p, WorkPos* a, WorkPos v) {
  plan_store(p, &a->group, v.group);
  plan_store(p, &a->block, v.block);
}

// The input words the plan is made from, in the copy's order: seq_lens [B], then cum_q [B+1].
__device__ __forceinline__ int plan_input_words(const MlaParams& p) {
  return p.cum_q == nullptr ? p.batch : 2 * p.batch + 1;
}
__device__ __forceinline__ int plan_input_word(const MlaParams& p, int i) {
  return i < p.batch ? p.seq_lens[i] : p.cum_q[i - p.batch];
}

// Step 1, by every thread of the CTA: the header's key and the copies against this call's.
// *count: the header's split count (shared memory; valid after the barrier).
template <int NT>
__device__ __forceinline__ bool plan_key_matches(const MlaParams& p, int* count) {
  const int tid = threadIdx.x;
  bool ok = true;
  if (tid < kPlanHeaderWords) {
    const int h = ld_relaxed_gpu(p.plan_header + tid);
    if (tid < kPlanKeyWords) ok = h == p.plan_key[tid];
    else *count = h;
  }
  const int n = plan_input_words(p);
#pragma unroll 2
  for (int i = tid; i < n; i += NT) ok &= plan_input_word(p, i) == ld_relaxed_gpu(p.plan_input_copy + i);
  fence_acq_rel_gpu();  // acquire: a published word seen above makes its CTA's plan visible below
  return __syncthreads_and(ok) != 0;
}

// Step 2, by every thread: the plan words the call reads against their shadows. Plain loads
// (after the acquire, and no line of them was read through this SM's L1 in this kernel before):
// the lines stay in L1 for cta_range and the request searches that read them next. (Keeping the
// CTA's bounds in shared memory instead made ptxas serialize the wgmmas, its note C7520, as any
// plan value read from shared memory has: perf-notes Session 6.)
template <int NT>
__device__ __forceinline__ bool plan_words_intact(const MlaParams& p, int count) {
  const int S = num_sets(p);
  const bool sane = count >= 0 && count < max(S, 1);  // a plan's count: cuts 1..S-1
  const int tid = threadIdx.x;
  const int n_split = sane ? 1 + 2 * count : 1, n_bounds = 2 * (S + 1), n = n_split + n_bounds + p.batch + 1;
  const int* bounds = reinterpret_cast<const int*>(p.bounds);
  bool ok = sane;
#pragma unroll 2
  for (int i = tid; i < n; i += NT) {
    const int* a = i < n_split ? p.split_groups + i
                 : i < n_split + n_bounds ? bounds + (i - n_split)
                                          : p.group_prefix + (i - n_split - n_bounds);
    const int w = *a, shadow = a[p.plan_shadow];
    ok &= w == ~shadow && (i != 0 || w == count);
  }
  return __syncthreads_and(ok) != 0;
}

// After a plan (its split list included), by every thread: the copies, then the header.
template <int NT>
__device__ __forceinline__ void publish_plan(const MlaParams& p) {
  __syncthreads();      // every thread's plan words written
  fence_acq_rel_gpu();  // release: they are visible before any word below
  const int tid = threadIdx.x, n = plan_input_words(p);
#pragma unroll 1
  for (int i = tid; i < n; i += NT) st_relaxed_gpu(p.plan_input_copy + i, plan_input_word(p, i));
  if (tid < kPlanHeaderWords)
    st_relaxed_gpu(p.plan_header + tid, tid < kPlanKeyWords ? p.plan_key[tid] : p.split_groups[0]);
}

}  // namespace jit_mla
