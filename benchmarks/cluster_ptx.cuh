// PTX helpers shared by the standalone cluster microbenchmarks (dsmem_exchange.cu,
// tma_ingest.cu, cluster_merge.cu; all build with -I csrc): a CTA's rank and its partner's addresses in a
// cluster, the cluster barrier, an mbarrier wait that acquires at cluster scope, and the
// cluster launch attribute.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_utils.cuh"  // smem_u32

// The launch attribute for clusters of n CTAs along x (host side).
inline cudaLaunchAttribute cluster_dim_attr(unsigned n) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = n;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

using jit_mla::smem_u32;
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t mapa(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Spin until the mbarrier's phase with this parity completed (arrivals from either CTA).
__device__ __forceinline__ void wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nW_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra W_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
