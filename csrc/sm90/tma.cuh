// Bulk tensor copies (TMA) and the mbarriers they complete on (sm_90).
#pragma once
#include <cstdint>

#include "../config.h"

namespace jit_mla::sm90 {

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

// Makes initialized mbarriers visible to the async proxy (the TMA unit) before first use.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic completing on this barrier's phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// One plain arrival (release, CTA scope): the producer side of a hand-off between warpgroups.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Wait until the phase with parity `parity` has completed (acquire: the TMA's writes are
// visible); between tries the warp may be suspended for up to kWaitSuspendHintNs.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity), "r"(kWaitSuspendHintNs)
      : "memory");
}

// 3-D tile load: box at coordinates (c0, c1, c2) of `tmap` into shared memory at `dst`,
// completing `bytes of the box` on mbarrier `bar`, with L2 cache policy `policy` (e.g.
// createpolicy_evict_first). Out-of-bounds elements are written as zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1,
                                            int c2, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}

// An L2 policy that evicts the lines it loads first.
__device__ __forceinline__ uint64_t createpolicy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// An L2 policy of normal priority: lines that other CTAs read again later in the call.
__device__ __forceinline__ uint64_t createpolicy_evict_normal() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

}  // namespace jit_mla::sm90
