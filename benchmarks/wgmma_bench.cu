// Cycles per wgmma on one SM of sm_90a, for the shapes the fp8 kernels issue (issue 5; notes-fp8
// §27): e4m3 m64n64k32 with both operands in shared memory (SS: QK^T of the wide kernel, A = K,
// B = Q, 64-byte swizzle, K-major) or A from registers (RS: its PV, B = P), and bf16 m64n64k16 SS
// for reference. One CTA per SM (the dynamic shared memory forces it), 1 or 2 warpgroups each
// issuing groups of 18 wgmmas (QK^T's count) into one accumulator (a dependent chain, as the wide
// kernel's S^T) or alternating over two (two chains), then waiting for the group. The operands
// hold whatever shared memory holds: only the time means something.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_bench benchmarks/wgmma_bench.cu && /tmp/wgmma_bench
// Prints, per case, the SM's cycles per wgmma (all warpgroups together) and per warpgroup.
// H200 (session 27, 1.98 GHz): every case 32.0 cycles per wgmma per SM with two warpgroups (64 per
// warpgroup), 34.5-35.1 with one (the group's commit and wait); one chain or two alike. So e4m3
// m64n64k32 SS runs at the dense rate, its operand reads (4 KB per 32 cycles) at 128 bytes per
// clock: all of shared memory's bandwidth, which any other shared traffic then takes from it.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int kSteps = 18;        // wgmmas per commit group (the wide kernel's QK^T k-steps)
constexpr int kIters = 2000;      // groups per warpgroup
constexpr int kSmemBytes = 160 * 1024;  // > half of the SM's shared memory: one CTA per SM
constexpr uint32_t kBoxBytes = 64 * 64;  // an e4m3 box: 64 rows x 64 bytes (two k32 steps)

__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t layout) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
         (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)layout << 62;
}
__device__ __forceinline__ uint64_t add(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

#define ACC32(d)                                                                                      \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),      \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),      \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define REGS32                                                                                        \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

__device__ __forceinline__ void ss_e4m3(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " REGS32 ", %32, %33, p, 1, 1;\n}\n"
               : ACC32(d) : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void rs_e4m3(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " REGS32
               ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
               : ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
__device__ __forceinline__ void ss_bf16(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : ACC32(d) : "l"(a), "l"(b), "r"(1));
}

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
  const uint64_t da = KIND == 2 ? desc(base, 16, 1024, 1) : desc(base, 16, 512, 2);
  const uint64_t db = KIND == 2 ? desc(base + 40 * 1024, 16, 1024, 1) : desc(base + 40 * 1024, 16, 512, 2);
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      // e4m3: box s / 2, k-step s % 2 (32 bytes); bf16: box s / 4 of 128-byte rows, 32 bytes.
      const uint32_t off = KIND == 2 ? (s / 4) * 8192 + (s % 4) * 32 : (s / 2) * kBoxBytes + (s % 2) * 32;
      if (KIND == 0) ss_e4m3(acc[s % CHAINS], add(da, off), add(db, off));
      if (KIND == 1) rs_e4m3(acc[s % CHAINS], a_reg, add(db, off));
      if (KIND == 2) ss_bf16(acc[s % CHAINS], add(da, off), add(db, off));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
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
