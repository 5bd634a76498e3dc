// Throughput of e4m3 -> f16 conversion routes on sm_90a (issue 5, docs/notes-fp8.md §10): one
// 1,024-thread block per SM, 8 registers per thread updated in turn (each step also reads the
// next one: a ring, 32 warps hide its latency); prints items per clock per SM.
//   nvcc -O3 -arch=sm_90a -o /tmp/cvt_bench benchmarks/cvt_bench.cu && /tmp/cvt_bench
// H200 (session 9): cvt + LOP 31.5, PRMT 62.0, bit route (AND, SHR, LOP3) + LOP 15.9, half and
// half 20.9: the hardware cvt is the cheaper route. (The "lop3 only" row is no pipe rate: ptxas
// merges the chained XORs into 3-input LOP3s.)
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__device__ __forceinline__ uint32_t cvt2(uint32_t w) {  // two e4m3 (low 16 bits) -> f16x2
  uint32_t d; asm volatile("{.reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(d) : "r"(w)); return d; }
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d; asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s)); return d; }
__device__ __forceinline__ uint32_t alu2(uint32_t p) {  // high bytes of each half -> f16x2 (x 2^-8)
  uint32_t t, d;
  asm volatile("and.b32 %0, %1, 0x7f007f00;" : "=r"(t) : "r"(p));
  asm volatile("shr.b32 %0, %0, 1;" : "+r"(t));
  asm volatile("lop3.b32 %0, %1, %2, 0x80008000, 0xf8;" : "=r"(d) : "r"(p), "r"(t));  // (a & c) | b
  return d; }
template <int MODE>
__global__ void k(uint32_t* out, int iters, long long* cyc) {
  uint32_t r[8];
  for (int i = 0; i < 8; ++i) r[i] = threadIdx.x * 0x01010101u + i * 0x3c3c3c3cu;
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (MODE == 0) r[i] = cvt2(r[i]) ^ r[(i + 1) & 7];          // 1 cvt + 1 lop
      if (MODE == 1) r[i] = prmt(r[i], r[(i + 1) & 7], 0x5140);   // 1 prmt
      if (MODE == 2) r[i] = alu2(r[i]) ^ r[(i + 1) & 7];          // 3 alu + 1 lop
      if (MODE == 3) { r[i] = (i & 1) ? (alu2(r[i]) ^ r[(i + 1) & 7]) : (cvt2(r[i]) ^ r[(i + 1) & 7]); }
      if (MODE == 4) r[i] = r[i] ^ r[(i + 1) & 7];                // 1 lop
      if (MODE == 5) { r[i] = (i % 3 == 0) ? (alu2(r[i]) ^ r[(i + 1) & 7]) : (cvt2(r[i]) ^ r[(i + 1) & 7]); }
    }
  }
  long long t1 = clock64();
  uint32_t x = 0; for (int i = 0; i < 8; ++i) x ^= r[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = x;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}
template <int MODE>
void run(const char* name, double ops_per_elem, uint32_t* out, long long* cyc, int sms) {
  const int iters = 4096, threads = 1024;  // 32 warps per SM, one block per SM
  k<MODE><<<sms, threads>>>(out, iters, cyc);
  cudaDeviceSynchronize();
  k<MODE><<<sms, threads>>>(out, iters, cyc);
  cudaDeviceSynchronize();
  long long h[256]; cudaMemcpy(h, cyc, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  double c = 0; for (int i = 0; i < sms; ++i) c += h[i]; c /= sms;
  const double items = (double)threads * iters * 8;  // per SM
  printf("%-34s %8.2f items/clk/SM  (%.2f instr/item)\n", name, items / c, ops_per_elem);
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint32_t* out; long long* cyc;
  cudaMalloc(&out, sms * 1024 * 4); cudaMalloc(&cyc, sms * 8);
  run<4>("lop3 only (baseline pipe)", 1, out, cyc, sms);
  run<1>("prmt", 1, out, cyc, sms);
  run<0>("cvt.f16x2.e4m3x2 + lop", 2, out, cyc, sms);
  run<2>("alu route (and, shr, lop3) + lop", 4, out, cyc, sms);
  run<3>("half cvt, half alu", 3, out, cyc, sms);
  run<5>("1/3 alu, 2/3 cvt", 2.67, out, cyc, sms);
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
}
