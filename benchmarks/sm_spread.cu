// Which SMs stream KV slower when each stage is held for a while after it lands (perf-notes,
// Session 41): the narrow16 kernel's per-SM attention times at B64 kv8192 H16 are bimodal
// (~135 / ~148 us), the slow half the same SM ids in every run whatever CTA lands there, while
// pure streaming (tma_ingest.cu) has every SM within 3% of the median.
//
// Model of narrow16: each of `consumers` warps owns one stage (a KV block, 9 tensor-map boxes
// of (64 tokens, 64 columns) bf16, 128-byte swizzle, evict_first, as the kernels load them),
// loads its next block into it, waits for it to land, holds it `hold` cycles (its QK^T, softmax
// and PV), and only then loads the next: a warpgroup refills its stage after its PV. Each CTA
// (one per SM, 128 of them, as the H16 rows run) streams 64 contiguous pages (604 MB in all).
// Per configuration: time, TB/s, the per-SM rate (median, min, max) and which SM ids fall below
// 95% of the median.
//
// Build and run (H200):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -I../csrc -o sm_spread sm_spread.cu && ./sm_spread
#include <cuda.h>  // CUtensorMap (the encoder comes through the runtime: no -lcuda)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cluster_ptx.cuh"
#include "kv_map.cuh"
#include "sm90/tma.cuh"

namespace {

using namespace jit_mla::sm90;

constexpr int kBoxBytes = 8192;
constexpr int kBoxes = 9;
constexpr int kStageBytes = kBoxes * kBoxBytes;
constexpr int kMaxConsumers = 3;
constexpr int kThreads = 32 * kMaxConsumers;
constexpr int kSmemBytes = kMaxConsumers * kStageBytes + 1024;
constexpr int kPagesPerCta = 64;

__global__ void __launch_bounds__(kThreads, 1) held_stream(const __grid_constant__ CUtensorMap tmap, int consumers,
                                                           long long hold, long long* cycles, int* smids) {
  extern __shared__ __align__(1024) uint8_t raw[];
  __shared__ uint64_t full[kMaxConsumers];
  const uint32_t base = (smem_u32(raw) + 1023) & ~1023u;
  const int c = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMaxConsumers; ++s) mbar_init(smem_u32(&full[s]), 1);
    fence_mbar_init();
  }
  __syncthreads();
  const long long t0 = clock64();
  if (c < consumers && (threadIdx.x & 31) == 0) {
    const uint64_t policy = createpolicy_evict_first();
    const uint32_t fb = smem_u32(&full[c]), dst = base + c * kStageBytes;
    uint32_t n = 0;
    for (int f = c; f < kPagesPerCta; f += consumers, ++n) {
      mbar_arrive_expect_tx(fb, kStageBytes);
      const int page = blockIdx.x * kPagesPerCta + f;
      for (int bx = 0; bx < kBoxes; ++bx) tma_load_3d(dst + bx * kBoxBytes, &tmap, fb, bx * 64, 0, page, policy);
      wait_cluster(fb, n & 1);
      const long long landed = clock64();
      while (clock64() - landed < hold) {
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = clock64() - t0;
    int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smids[blockIdx.x] = smid;
  }
}

}  // namespace

int main() {
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  cudaFuncSetAttribute(held_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  const int ctas = 128;
  const long long pages = (long long)ctas * kPagesPerCta;
  uint8_t* kv;
  if (cudaMalloc(&kv, pages * kStageBytes) != cudaSuccess) return 1;
  cudaMemset(kv, 1, pages * kStageBytes);
  // An L2-sized buffer written between launches, so that no launch finds the last one's KV in L2.
  uint8_t* flush;
  const size_t flush_bytes = 256u << 20;
  cudaMalloc(&flush, flush_bytes);
  CUtensorMap map;
  if (!kv_map(&map, kv, pages, CU_TENSOR_MAP_L2_PROMOTION_NONE)) {
    printf("cuTensorMapEncodeTiled failed\n");
    return 1;
  }
  long long* cycles;
  int* smids;
  cudaMalloc(&cycles, ctas * sizeof(long long));
  cudaMalloc(&smids, ctas * sizeof(int));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  printf("%d CTAs x %d pages of %d B (%.0f MB); max SM clock %d MHz\n", ctas, kPagesPerCta, kStageBytes,
         pages * kStageBytes / 1e6, khz / 1000);
  printf("| consumers | hold cycles | us (median of 5) | TB/s | per-SM MB/s x1000: median, min, max | SMs < 95%% of median |\n");
  printf("|---|---|---|---|---|---|\n");
  for (int consumers : {2, 3, 1})
    for (long long hold : {0LL, 1000LL, 2000LL, 3000LL, 4000LL, 5000LL}) {
      std::vector<float> ms;
      std::vector<double> per_sm_sum(1024, 0.0);
      std::vector<int> per_sm_n(1024, 0);
      for (int rep = 0; rep < 5; ++rep) {
        cudaMemsetAsync(flush, rep, flush_bytes);
        cudaEventRecord(e0);
        held_stream<<<ctas, kThreads, kSmemBytes>>>(map, consumers, hold, cycles, smids);
        cudaEventRecord(e1);
        if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) {
          printf("launch failed\n");
          return 1;
        }
        float t = 0.f;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
        std::vector<long long> cyc(ctas);
        std::vector<int> sm(ctas);
        cudaMemcpy(cyc.data(), cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
        cudaMemcpy(sm.data(), smids, ctas * sizeof(int), cudaMemcpyDeviceToHost);
        for (int b = 0; b < ctas; ++b) {
          // bytes per cycle at the max clock -> MB/s
          per_sm_sum[sm[b]] += (double)kPagesPerCta * kStageBytes / cyc[b] * khz * 1e3 / 1e6;
          per_sm_n[sm[b]] += 1;
        }
      }
      std::sort(ms.begin(), ms.end());
      std::vector<std::pair<int, double>> rate;
      for (int s = 0; s < 1024; ++s)
        if (per_sm_n[s] > 0) rate.push_back({s, per_sm_sum[s] / per_sm_n[s]});
      std::vector<double> sorted;
      for (auto& r : rate) sorted.push_back(r.second);
      std::sort(sorted.begin(), sorted.end());
      const double med = sorted[sorted.size() / 2];
      const double t = ms[2] * 1e-3;
      printf("| %d | %lld | %.1f | %.2f | %.1f, %.1f, %.1f | ", consumers, hold, t * 1e6,
             (double)pages * kStageBytes / t * 1e-12, med / 1e3, sorted.front() / 1e3, sorted.back() / 1e3);
      int n_slow = 0;
      for (auto& r : rate) n_slow += r.second < 0.95 * med;
      printf("%d:", n_slow);
      for (auto& r : rate)
        if (r.second < 0.95 * med) printf(" %d", r.first);
      printf(" |\n");
    }
  return 0;
}
