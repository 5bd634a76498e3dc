// Cycles per wgmma on one SM of sm_90a, for the shapes the fp8 kernels issue (issue 5; notes-fp8
// §27): e4m3 m64n64k32 with both operands in shared memory (SS: QK^T of the wide kernel, A = K,
// B = Q, 64-byte swizzle, K-major) or A from registers (RS: its PV, B = P), and bf16 m64n64k16 SS
// for reference. One CTA per SM (the dynamic shared memory forces it), 1 or 2 warpgroups each
// issuing groups of 18 wgmmas (QK^T's count) into one accumulator (a dependent chain, as the wide
// kernel's S^T) or alternating over two (two chains), then waiting for the group. The operands
// hold whatever shared memory holds: only the time means something.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/wgmma_bench \
//       benchmarks/wgmma_bench.cu && /tmp/wgmma_bench
// Prints, per case, the SM's cycles per wgmma (all warpgroups together) and per warpgroup.
// H200 (session 27, 1.98 GHz; the same after it took the kernels' wrappers): every case 32.0 cycles per wgmma per SM with two warpgroups (64 per
// warpgroup), 34.5-35.1 with one (the group's commit and wait); one chain or two alike. So e4m3
// m64n64k32 SS runs at the dense rate, its operand reads (4 KB per 32 cycles) at 128 bytes per
// clock: all of shared memory's bandwidth, which any other shared traffic then takes from it.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "sm90/attention_narrow_fp8.cuh"  // WgmmaSsE4m3, WgmmaRsE4m3, make_smem_desc_sw64

namespace {

using namespace jit_mla::sm90;  // the kernels' own wgmma wrappers and descriptors

constexpr int kSteps = 18;        // wgmmas per commit group (the wide kernel's QK^T k-steps)
constexpr int kIters = 2000;      // groups per warpgroup
constexpr int kSmemBytes = 160 * 1024;  // > half of the SM's shared memory: one CTA per SM

// KIND 0: SS e4m3, 1: RS e4m3, 2: SS bf16. CHAINS: accumulators the group alternates over.
template <int KIND, int CHAINS>
__global__ void __launch_bounds__(256) bench(float* out, long long* cyc) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int wg = threadIdx.x / 128;
  // Warpgroup w: A at w * 40 KB (K: 9 boxes), B after it (Q), as two blocks of a stage would be.
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem) + wg * 80 * 1024;
  float acc[CHAINS][32];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[c][j] = 0.f;
  uint32_t a_reg[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  const uint64_t da = KIND == 2 ? make_smem_desc(base, 16, 1024) : make_smem_desc_sw64(base);
  const uint64_t db = KIND == 2 ? make_smem_desc(base + 40 * 1024, 16, 1024) : make_smem_desc_sw64(base + 40 * 1024);
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // e4m3: box s / 2, k-step s % 2 (32 bytes); bf16: box s / 4 of 128-byte rows, 32 bytes.
      const uint32_t off = KIND == 2 ? (s / 4) * 8192 + (s % 4) * 32 : (s / 2) * kFp8BoxBytes + (s % 2) * 32;
      if (KIND == 0) WgmmaSsE4m3<64>::mma(acc[s % CHAINS], desc_add(da, off), desc_add(db, off), 1);
      if (KIND == 1) WgmmaRsE4m3<64>::mma(acc[s % CHAINS], a_reg, desc_add(db, off));
      if (KIND == 2) wgmma_m64n64k16_ss(acc[s % CHAINS], desc_add(da, off), desc_add(db, off), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
  }
  const long long t1 = clock64();
  float x = 0.f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int j = 0; j < 32; ++j) x += acc[c][j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
  if (threadIdx.x % 128 == 0) cyc[blockIdx.x * 2 + wg] = t1 - t0;
}

template <int KIND, int CHAINS>
void run(const char* name, int wgs, int sms, float* out, long long* cyc) {
  auto k = bench<KIND, CHAINS>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  k<<<sms, 128 * wgs, kSmemBytes>>>(out, cyc);  // warm-up
  k<<<sms, 128 * wgs, kSmemBytes>>>(out, cyc);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    printf("%s: %s\n", name, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  long long h[2 * 132] = {};
  cudaMemcpy(h, cyc, sizeof(long long) * 2 * sms, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (int i = 0; i < sms; ++i)
    for (int w = 0; w < wgs; ++w) worst = h[2 * i + w] > worst ? h[2 * i + w] : worst;
  const double per_wg = worst / (double(kIters) * kSteps);
  printf("%-44s %d warpgroup(s): %6.1f cycles per wgmma per warpgroup, %6.1f per SM\n", name, wgs, per_wg,
         per_wg / wgs);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  sms = sms > 132 ? 132 : sms;
  float* out;
  long long* cyc;
  cudaMalloc(&out, sizeof(float) * 256 * 132);
  cudaMalloc(&cyc, sizeof(long long) * 2 * 132);
  cudaMemset(cyc, 0, sizeof(long long) * 2 * 132);
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<0, 1>("SS e4m3 m64n64k32, one chain", wgs, sms, out, cyc);
    run<0, 2>("SS e4m3 m64n64k32, two chains", wgs, sms, out, cyc);
    run<1, 1>("RS e4m3 m64n64k32, one chain", wgs, sms, out, cyc);
    run<1, 2>("RS e4m3 m64n64k32, two chains", wgs, sms, out, cyc);
    run<2, 1>("SS bf16 m64n64k16, one chain", wgs, sms, out, cyc);
    run<2, 2>("SS bf16 m64n64k16, two chains", wgs, sms, out, cyc);
  }
  printf("ideal (dense rate): e4m3 m64n64k32 32 cycles per SM, bf16 m64n64k16 32\n");
  return 0;
}
