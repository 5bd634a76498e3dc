// PTX helpers shared by the standalone cluster microbenchmarks (dsmem_exchange.cu,
// tma_ingest.cu, cluster_merge.cu, smem_share.cu; all build with -I csrc): a CTA's rank and its
// partner's addresses in a cluster, the cluster barrier, an mbarrier wait that acquires at cluster
// scope, bulk copies (unicast and multicast), and on the host the cluster launch attribute, a
// (cooperative) cluster launch and the resident cluster count.
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

// Launch fn with `threads` threads and `smem` bytes of dynamic shared memory per CTA, in clusters
// of `cluster` CTAs along x (none when 1), cooperatively (all CTAs resident) if asked.
inline cudaError_t launch_clusters(const void* fn, int grid, int threads, int smem, int cluster, bool cooperative,
                                   void** args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 1) attr[n++] = cluster_dim_attr(cluster);
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelExC(&cfg, fn, args);
}

// How many clusters of `cluster` CTAs of fn (threads, smem as above) are resident at once; -1
// and *err set when the query fails.
inline int resident_clusters(const void* fn, int cluster, int threads, int smem, int sms, cudaError_t* err) {
  cudaLaunchConfig_t occ = {};
  occ.gridDim = dim3(cluster * sms);
  occ.blockDim = dim3(threads);
  occ.dynamicSmemBytes = smem;
  cudaLaunchAttribute ca = cluster_dim_attr(cluster);
  occ.attrs = &ca;
  occ.numAttrs = 1;
  int clusters = -1;
  *err = cudaOccupancyMaxActiveClusters(&clusters, fn, &occ);
  return clusters;
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

// Contiguous bulk copy of `bytes` from global memory into this CTA's shared memory at dst,
// completing on mbarrier bar (tma_ingest.cu, smem_share.cu); the multicast form lands it in every
// CTA of `mask` at the same offset.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_load_multicast(uint32_t dst, const void* src, int bytes, uint32_t bar,
                                                    uint16_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;" ::
          "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}
