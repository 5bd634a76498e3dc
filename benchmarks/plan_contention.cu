// Does the planner's pattern cost L2 round trips under contention? Every attention CTA (132, one
// per SM) writes the same plan values to the same workspace words, then reads them back in chains
// of dependent loads (find_request's binary search, the bounds of its set). This times, per CTA,
// the store -> __syncthreads -> 4 dependent loads chain, with the words shared by all CTAs
// (the kernels' layout) or private to each CTA (a copy per CTA), and with no stores at all (the
// words written by an earlier launch). Standalone: nvcc -arch=sm_90a -O3 -o pc plan_contention.cu
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__device__ __forceinline__ long long clk() { long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }

// mode 0: shared words, stored by every CTA; 1: a private copy per CTA; 2: shared, no stores.
__global__ void chain(int* words, long long* cycles, int mode, int steps) {
  int* w = words + (mode == 1 ? blockIdx.x * 64 : 0);
  __syncthreads();
  const long long t0 = clk();
  for (int s = 0; s < steps; ++s) {
    if (mode != 2 && threadIdx.x < 16) w[threadIdx.x] = (threadIdx.x + 1) & 15;  // a ring: w[i] = i + 1
    __syncthreads();
    int i = 0;
    if (threadIdx.x == 0) {
#pragma unroll 1
      for (int k = 0; k < 4; ++k) i = w[i];  // 4 dependent loads
    }
    i = __shfl_sync(0xffffffffu, i, 0);
    if (i == 99) w[0] = 0;  // keep the loads
    __syncthreads();
  }
  const long long t1 = clk();
  if (threadIdx.x == 0) cycles[blockIdx.x] = (t1 - t0) / steps;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int* words;
  long long* cyc;
  cudaMalloc(&words, sms * 64 * sizeof(int));
  cudaMalloc(&cyc, sms * sizeof(long long));
  std::vector<int> init(sms * 64);
  for (int i = 0; i < sms * 64; ++i) init[i] = ((i % 64) + 1) & 15;
  const char* names[3] = {"shared words, every CTA stores", "a private copy per CTA", "shared words, no stores"};
  for (int grid : {1, sms}) {
    for (int mode = 0; mode < 3; ++mode) {
      cudaMemcpy(words, init.data(), init.size() * sizeof(int), cudaMemcpyHostToDevice);
      for (int rep = 0; rep < 3; ++rep) chain<<<grid, 256>>>(words, cyc, mode, 8);
      cudaDeviceSynchronize();
      std::vector<long long> h(grid);
      cudaMemcpy(h.data(), cyc, grid * sizeof(long long), cudaMemcpyDeviceToHost);
      std::sort(h.begin(), h.end());
      printf("%3d CTAs, %-32s: cycles per step (store, barrier, 4 dependent loads, barrier): median %lld, max %lld\n",
             grid, names[mode], h[grid / 2], h[grid - 1]);
    }
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
