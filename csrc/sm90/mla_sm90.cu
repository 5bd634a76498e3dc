// The sm_90a cubin: the attention kernels with C symbols, so the launcher finds them by name
// (cudaLibraryGetKernel; its kKernelInfo table lists them). Each CTA plans the splits first, runs its
// share, then merges split units with the other CTAs (cooperative launch). Built by
// `python -m jit_mla build --cubins`.
#include <algorithm>

#include "../common/combine.cuh"
#include "../common/params.h"
#include "../common/probe.h"
#include "attention_any_page.cuh"
#include "attention_narrow.cuh"
#include "attention_narrow_fp8.cuh"
#include "attention_seesaw.cuh"
#include "attention_wide_fp8.cuh"

using jit_mla::MlaParams;

// The merge's shared memory (CombineSmem, from the dynamic base on) fits in every kernel's.
static_assert(sizeof(jit_mla::CombineSmem) <=
                  std::min({jit_mla::sm90::narrow_smem_bytes<16>(), jit_mla::sm90::narrow_fp8_smem_bytes<16>(),
                            jit_mla::sm90::kWideFp8SmemBytes, jit_mla::sm90::kAttentionSmemBytes,
                            jit_mla::sm90::kSeesawSmemBytes}),
              "the merge's staging does not fit a kernel's shared memory");

namespace {
// What both kernels run: attention by `Attend`, then the merge of split units, between the
// trace probe's marks (no code in the shipped cubin).
template <bool (*Attend)(const MlaParams&)>
__device__ __forceinline__ void attend_then_merge(const MlaParams& p) {
  jit_mla::trace_mark(jit_mla::kMarkEntry);
  jit_mla::probe_waits_reset();  // read after the kernels' first __syncthreads
  jit_mla::tl_reset();
  // Attend: true when this CTA planned (did not reuse the workspace's plan)
  const bool planned = __shfl_sync(0xffffffffu, Attend(p), 0);  // uniform, so ptxas knows it is
  jit_mla::trace_mark(jit_mla::kMarkAttended);
  // A plan made here is published once every CTA has checked for one, by the last CTA (the
  // fewest merge rows: warps take them CTA by CTA): after the merge's grid barrier, or in a call
  // without splits after the other CTAs' arrivals (plan_cache.cuh).
  const bool synced = jit_mla::combine_splits(p);
  if (jit_mla::is_plan_publisher()) {
    const bool unsplit = !synced && p.split_groups[0] == 0;  // (not a probe build without the merge)
    if (unsplit) jit_mla::unsplit_arrive_and_wait();
    if (planned && (synced || unsplit)) jit_mla::publish_plan(p);
  }
  jit_mla::trace_mark(jit_mla::kMarkDone);
  // Records last (to global memory, printed by mla_probe_dump: a printf here would make ptxas
  // serialize the wgmmas).
  jit_mla::trace_print();
  jit_mla::probe_waits_print();
  jit_mla::tl_print();
}
}  // namespace

#if (JIT_MLA_PROBE & 120) != 0
// Probe builds: prints what the last attention launch recorded (the launcher's probe_dump).
extern "C" __global__ void mla_probe_dump() { jit_mla::probe_dump(); }
#endif

// One entry point: a C symbol `name` running `attend_then_merge<Attend>` (C symbols cannot be
// templates; the attention functions can).
#define MLA_ATTENTION_KERNEL(name, ...)                                                     \
  extern "C" __global__ void __launch_bounds__(jit_mla::kNumThreads, 1)                     \
      name(const __grid_constant__ MlaParams p) {                                           \
    attend_then_merge<__VA_ARGS__>(p);                                                      \
  }

MLA_ATTENTION_KERNEL(mla_sm90_attention, jit_mla::sm90::attention_seesaw<false>)
// The same for a request with more rows than the grid holds at once (chunked prefill): its KV at
// L2's normal priority, since later units read it again.
MLA_ATTENTION_KERNEL(mla_sm90_attention_reread, jit_mla::sm90::attention_seesaw<true>)
// The same without the steady pair body, for calls with few KV blocks per CTA (its code costs
// them more in instruction fetch than it saves).
MLA_ATTENTION_KERNEL(mla_sm90_attention_short, jit_mla::sm90::attention_seesaw<false, false>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_any_page, jit_mla::sm90::attention_any_page)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow16, jit_mla::sm90::attention_narrow<16>)
// fp8 (e4m3) KV cache, bf16 query: the narrow kernel with the cache fp8 in shared memory; by TMA
// (the TMA page sizes), or by cp.async (_any: every other page size).
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow16_fp8, jit_mla::sm90::attention_narrow_fp8<16, true, false>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow32_fp8, jit_mla::sm90::attention_narrow_fp8<32, true, false>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow16_fp8_any, jit_mla::sm90::attention_narrow_fp8<16, false, false>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow32_fp8_any, jit_mla::sm90::attention_narrow_fp8<32, false, false>)
// e4m3 query and cache (mode 2): both matmuls on e4m3 wgmmas (_fp8q; _fp8q_any by cp.async).
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow16_fp8q, jit_mla::sm90::attention_narrow_fp8<16, true, true>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow32_fp8q, jit_mla::sm90::attention_narrow_fp8<32, true, true>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow16_fp8q_any, jit_mla::sm90::attention_narrow_fp8<16, false, true>)
MLA_ATTENTION_KERNEL(mla_sm90_attention_narrow32_fp8q_any, jit_mla::sm90::attention_narrow_fp8<32, false, true>)
// e4m3 query and cache, units of 64 rows (H 64 / 128, MTP, ragged: more than 32 rows), TMA pages.
MLA_ATTENTION_KERNEL(mla_sm90_attention_wide_fp8q, jit_mla::sm90::attention_wide_fp8<true, true>)
// fp8 cache, bf16 query, the same 64-row units (Q and P as hi + lo e4m3 rows), TMA pages.
MLA_ATTENTION_KERNEL(mla_sm90_attention_wide_fp8, jit_mla::sm90::attention_wide_fp8<true, false>)
