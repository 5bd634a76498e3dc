// How fast KV-sized TMA loads land in shared memory on every SM at once, alone, shared by a CTA
// pair, and multicast to a 2-CTA cluster: the bound behind the seesaw's exposed refills.
//
// Question (perf-notes Session 29): `seesaw-multicast.patch` (each KV box loaded once for the
// H 128 CTA pair, TMA multicast in a 2-CTA cluster) ran 1.49-1.56x slower than the pair loading
// each box twice, and the 2-CTA cluster launch alone costs 1.6-2.6%. Is multicast's delivery
// slower than unicast, or the pair's lockstep protocol (each refill waits for the partner's
// release)? And how close does the seesaw's ~20 B per clock per SM (B128 kv4096 H128: 147 KiB per
// block pair every ~7,800 cycles, read twice per pair) come to what L2 delivers?
//
// Each CTA (one per SM: 221 KiB of shared memory) runs the seesaw's load shape with no math: a
// stage is one KV block (9 boxes of 8 KiB), and a stage is refilled as soon as its previous fill
// landed, `stages` (1-3) in flight. Modes:
//   private   every CTA its own blocks (no cluster)
//   pair      CTAs 2s and 2s + 1 load the same blocks, each its own copy (today's seesaw)
//   lockstep  pair, as 2-CTA clusters, each refill waits for both CTAs' release (the multicast
//             patch's protocol without multicast); the release arrivals at the default CTA
//             scope (CUTLASS's ClusterBarrier) or, as the patch had them, `.release.cluster`
//   multicast lockstep, and each CTA issues every second box for both (mask 0b11)
// Footprints: "L2" (each CTA or pair loads one block over and over: L2 hits after the first)
// and "DRAM" (each CTA or pair streams its own part of 288 MiB once). Then, DRAM and private
// only: 1-3 stages on 132 and 128 CTAs (the H16 rows run 128), with the spread over the CTAs;
// and the kernels' own loads (a 3D tensor map of 64x64 boxes, 128-byte swizzle) against the
// bulk copies, with and without evict_first and 256-byte L2 promotion.
//
// Measured (H200, Session 29; B/clk per SM of the median CTA): L2 private 36, pair 54,
// lockstep 42.5 (CTA scope) / 28 (`.release.cluster`), multicast 46 / 29; DRAM private 4.07 /
// 4.21 / 4.16-4.25 TB/s with 1 / 2 / 3 stages (128 CTAs: 4.07-4.11 / 4.18-4.21 / 4.17-4.22),
// every CTA within 3% of the median; pair, lockstep (CTA scope) and multicast alike at ~35
// B/clk; the tensor-map boxes with evict_first 4.20 TB/s (2 stages), evict_normal 3.64, 256B
// promotion 3.80. Another instance streamed 3-5% less (private 3.96-4.09, tensor map 4.00-4.06):
// compare within one run.
//
// Build and run (H200):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I../csrc -o tma_ingest tma_ingest.cu && ./tma_ingest
#include <cuda.h>  // CUtensorMap (the encoder comes through the runtime: no -lcuda)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cluster_ptx.cuh"
#include "kv_map.cuh"
#include "sm90/tma.cuh"  // the kernels' mbarrier, TMA and L2-policy wrappers

namespace {

using namespace jit_mla::sm90;

constexpr int kThreads = 128;
constexpr int kBoxBytes = 8192;  // 64 KV rows x 64 bf16 columns
constexpr int kBoxes = 9;        // 576 columns: a KV block
constexpr int kStageBytes = kBoxes * kBoxBytes;
constexpr int kMaxStages = 3;
constexpr int kSmemBytes = kMaxStages * kStageBytes + 1024;  // one CTA per SM

enum Mode { kPrivate = 0, kPair = 1, kLockstep = 2, kMulticast = 3 };
const char* const kModeNames[] = {"private", "pair", "lockstep", "multicast"};

// An arrival on an mbarrier of either CTA: release at cluster scope (the multicast patch's), or
// at the default CTA scope (CUTLASS's ClusterBarrier::arrive).
__device__ __forceinline__ void arrive_cluster(uint32_t cluster_bar, bool cluster_scope) {
  if (cluster_scope)
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
  else
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

// fills: stage refills per CTA; region_blocks: blocks in this CTA's (or pair's) region, cycled.
__global__ void __launch_bounds__(kThreads, 1) ingest(const uint8_t* kv, int mode, int stages, int fills,
                                                      long long region_blocks, int cluster_scope, long long* cycles,
                                                      int* smids) {
  extern __shared__ __align__(1024) uint8_t raw[];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const bool clustered = mode >= kLockstep;
  const uint32_t rank = clustered ? cluster_rank() : 0u;
  const long long owner = mode == kPrivate ? blockIdx.x : blockIdx.x / 2;  // whose region
  const uint8_t* region = kv + owner * region_blocks * kStageBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), 2);
    }
    fence_mbar_init();
  }
  if (clustered) cluster_sync(); else __syncthreads();
  const long long t0 = clock64();
  if (threadIdx.x == 0) {
    for (int f = 0; f < fills; ++f) {
      const int s = f % stages;
      const uint32_t n = f / stages;  // this stage's fill count before this one
      const uint32_t fb = smem_u32(&full[s]), eb = smem_u32(&empty[s]);
      if (n > 0) {
        wait_cluster(fb, (n - 1) & 1);  // the previous fill landed (and was "consumed")
        if (clustered) {               // release on both CTAs, wait for the partner's release
          arrive_cluster(eb, cluster_scope);
          arrive_cluster(mapa(eb, rank ^ 1u), cluster_scope);
          wait_cluster(eb, (n - 1) & 1);
        }
      }
      mbar_arrive_expect_tx(fb, kStageBytes);
      const uint32_t dst = smem_u32(raw) + s * kStageBytes;
      const uint8_t* src = region + (f % region_blocks) * kStageBytes;
      for (int bx = 0; bx < kBoxes; ++bx) {
        if (mode == kMulticast) {
          if ((uint32_t)(bx & 1) == rank) bulk_load_multicast(dst + bx * kBoxBytes, src + bx * kBoxBytes, kBoxBytes, fb, 0x3);
        } else {
          bulk_load(dst + bx * kBoxBytes, src + bx * kBoxBytes, kBoxBytes, fb);
        }
      }
    }
    for (int f = fills > stages ? fills - stages : 0; f < fills; ++f)  // the last fills land
      wait_cluster(smem_u32(&full[f % stages]), (f / stages) & 1);
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = t1 - t0;
    int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smids[blockIdx.x] = smid;
  }
  if (clustered) cluster_sync();  // the partner may still multicast into this CTA
}

// The attention kernels' loads: KV pages (64 tokens x 576 bf16) as 9 boxes of (64 tokens, 64
// columns) by a 3D tensor map, 128-byte swizzled; each CTA streams its own pages, `stages` in
// flight. evict_first: the kernels' L2 policy for KV read once.
__global__ void __launch_bounds__(kThreads, 1) ingest_tensor(const __grid_constant__ CUtensorMap tmap, int stages,
                                                             int fills, int evict_first, long long* cycles) {
  extern __shared__ __align__(1024) uint8_t raw[];
  __shared__ uint64_t full[kMaxStages];
  const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;  // 128-byte swizzle: 1 KiB aligned boxes
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(smem_u32(&full[s]), 1);
    fence_mbar_init();
  }
  __syncthreads();
  const long long t0 = clock64();
  if (threadIdx.x == 0) {
    const uint64_t policy = evict_first ? createpolicy_evict_first() : createpolicy_evict_normal();
    for (int f = 0; f < fills; ++f) {
      const int s = f % stages;
      const uint32_t n = f / stages, fb = smem_u32(&full[s]);
      if (n > 0) wait_cluster(fb, (n - 1) & 1);
      mbar_arrive_expect_tx(fb, kStageBytes);
      const int page = blockIdx.x * fills + f;
      for (int bx = 0; bx < kBoxes; ++bx)
        tma_load_3d(base + s * kStageBytes + bx * kBoxBytes, &tmap, fb, bx * 64, 0, page, policy);
    }
    for (int f = fills > stages ? fills - stages : 0; f < fills; ++f)  // the last fills land
      wait_cluster(smem_u32(&full[f % stages]), (f / stages) & 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// Median of 5 timed launches in ms; -1 if a launch or the kernel failed (err says which).
template <class Launch>
float median_ms(cudaEvent_t e0, cudaEvent_t e1, Launch&& launch_once, cudaError_t& err) {
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0);
    err = launch_once();
    cudaEventRecord(e1);
    if (err == cudaSuccess) err = cudaEventSynchronize(e1);
    if (err != cudaSuccess) return -1.f;
    float t = 0.f;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

cudaError_t launch(int grid, bool cluster, void** args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cudaLaunchAttribute attr = cluster_dim_attr(2);
  cfg.attrs = &attr;
  cfg.numAttrs = cluster ? 1 : 0;
  return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(ingest), args);
}

}  // namespace

int main() {
  int sms = 0, khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  cudaFuncSetAttribute(ingest, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  const int grid = sms & ~1;
  const long long dram_blocks = (288ll << 20) / kStageBytes / (grid / 2);  // per pair region
  uint8_t* kv;
  const size_t bytes = (size_t)grid * dram_blocks * kStageBytes;  // private regions: 2x the pairs'
  if (cudaMalloc(&kv, bytes) != cudaSuccess) return 1;
  cudaMemset(kv, 1, bytes);
  long long* cycles;
  cudaMalloc(&cycles, grid * sizeof(long long));
  int* smids;
  cudaMalloc(&smids, grid * sizeof(int));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  printf("%d CTAs, one per SM, boxes of %d B, stages of %d B; max SM clock %d MHz\n", grid, kBoxBytes, kStageBytes,
         khz / 1000);
  printf("| footprint | mode | stages | µs | smem ingest TB/s | L2 -> SM TB/s | B/clk per SM (median, min CTA) |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (int dram : {0, 1})
    for (int stages : {2, 3})
      for (int mode = kPrivate; mode <= kMulticast; ++mode)
      for (int cluster_scope = 0; cluster_scope < (mode >= kLockstep ? 2 : 1); ++cluster_scope) {
        // L2: every fill the region's one block (9.4 MiB in all, L2 hits after the first); DRAM:
        // each region once (288 MiB in all).
        long long region = dram ? (mode == kPrivate ? dram_blocks / 2 : dram_blocks) : 1;
        int fills = dram ? (int)region : 2000;
        void* args[] = {&kv, &mode, &stages, &fills, &region, &cluster_scope, &cycles, &smids};
        cudaError_t err;
        const float ms = median_ms(e0, e1, [&] { return launch(grid, mode >= kLockstep, args); }, err);
        if (err != cudaSuccess) {
          printf("| %s | %s | %d | error: %s |\n", dram ? "DRAM" : "L2", kModeNames[mode], stages,
                 cudaGetErrorString(err));
          return 1;
        }
        std::vector<long long> cyc(grid);
        cudaMemcpy(cyc.data(), cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost);
        std::sort(cyc.begin(), cyc.end());
        const double t = ms * 1e-3;
        const double ingest = (double)grid * fills * kStageBytes;      // bytes landed in shared memory
        const double l2 = mode == kMulticast ? ingest / 2 : ingest;    // bytes L2 sent out
        printf("| %s | %s%s | %d | %.1f | %.2f | %.2f | %.1f, %.1f |\n", dram ? "DRAM" : "L2", kModeNames[mode],
               cluster_scope ? " (release.cluster)" : "", stages,
               t * 1e6, ingest / t * 1e-12, l2 / t * 1e-12, (double)fills * kStageBytes / cyc[grid / 2],
               (double)fills * kStageBytes / cyc[grid - 1]);
      }
  // DRAM, private: does each SM's share depend on its bytes in flight (1-3 stages of 72 KiB),
  // and on 4 SMs idle (the H16 rows run 128 one-piece CTAs)? The narrow16 kernel's per-SM
  // attention times are bimodal (~140 / ~153 µs at B64 kv8192 H16, the same SMs across shapes).
  printf("\n| DRAM private: CTAs | stages | µs | TB/s | B/clk per SM: median, min, max | CTAs < 95%% of the median: SM ids |\n");
  printf("|---|---|---|---|---|---|\n");
  for (int ctas : {grid, grid - 4})
    for (int stages : {1, 2, 3}) {
      int mode = kPrivate, cluster_scope = 0;
      long long region = dram_blocks / 2;
      int fills = (int)region;
      void* args[] = {&kv, &mode, &stages, &fills, &region, &cluster_scope, &cycles, &smids};
      cudaError_t err;
      const float ms = median_ms(e0, e1, [&] { return launch(ctas, false, args); }, err);
      if (err != cudaSuccess) return 1;
      std::vector<long long> cyc(ctas);
      std::vector<int> sm(ctas);
      cudaMemcpy(cyc.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
      cudaMemcpy(sm.data(), smids, ctas * sizeof(int), cudaMemcpyDeviceToHost);
      std::vector<double> rate(ctas);
      for (int b = 0; b < ctas; ++b) rate[b] = (double)fills * kStageBytes / cyc[b];
      std::vector<double> sorted = rate;
      std::sort(sorted.begin(), sorted.end());
      const double med = sorted[ctas / 2], t = ms * 1e-3;
      printf("| %d | %d | %.1f | %.2f | %.1f, %.1f, %.1f | ", ctas, stages, t * 1e6,
             (double)ctas * fills * kStageBytes / t * 1e-12, med, sorted[0], sorted[ctas - 1]);
      std::vector<int> slow;
      for (int b = 0; b < ctas; ++b)
        if (rate[b] < 0.95 * med) slow.push_back(sm[b]);
      std::sort(slow.begin(), slow.end());
      printf("%zu:", slow.size());
      for (int id : slow) printf(" %d", id);
      printf(" |\n");
    }
  // DRAM, private, the kernels' tensor-map boxes against the contiguous 8 KiB bulk copies above.
  cudaFuncSetAttribute(ingest_tensor, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  printf("\n| DRAM private, tensor boxes: CTAs | stages | L2 promotion | policy | µs | TB/s | B/clk per SM: median, min |\n");
  printf("|---|---|---|---|---|---|---|\n");
  const long long pages = (long long)(bytes / kStageBytes);
  for (int ctas : {grid, grid - 4})
    for (int stages : {1, 2, 3})
      for (int promo = 0; promo < 2; ++promo)
        for (int evict_first = 0; evict_first < 2; ++evict_first) {
          if (ctas != grid && (promo || !evict_first)) continue;
          CUtensorMap map;
          if (!kv_map(&map, kv, pages, promo ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE)) {
            printf("cuTensorMapEncodeTiled failed\n");
            return 1;
          }
          int fills = (int)(dram_blocks / 2);  // 288 MiB in all, as the private rows above
          cudaError_t err;
          const float ms = median_ms(e0, e1, [&] {
            ingest_tensor<<<ctas, kThreads, kSmemBytes>>>(map, stages, fills, evict_first, cycles);
            return cudaGetLastError();
          }, err);
          if (err != cudaSuccess) return 1;
          std::vector<long long> cyc(ctas);
          cudaMemcpy(cyc.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
          std::sort(cyc.begin(), cyc.end());
          const double t = ms * 1e-3;
          printf("| %d | %d | %s | %s | %.1f | %.2f | %.1f, %.1f |\n", ctas, stages, promo ? "256B" : "none",
                 evict_first ? "evict_first" : "normal", t * 1e6, (double)ctas * fills * kStageBytes / t * 1e-12,
                 (double)fills * kStageBytes / cyc[ctas / 2], (double)fills * kStageBytes / cyc[ctas - 1]);
        }
  return 0;
}
