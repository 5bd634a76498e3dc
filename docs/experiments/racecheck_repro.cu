// Is the kN 32 racecheck report (perf-notes, Sessions 8-9) racecheck's model or a real race? The
// narrow kernels' shape without attention: two warpgroups, each looping over its own blocks with
// a warpgroup barrier (bar.sync 1 / 2, 128 threads) per block, then an end-of-unit merge through
// shared memory across a __syncthreads: warpgroup 0 stores, the barrier, warpgroup 1 loads. The
// loads are checked, so a real race shows as a wrong value, not only as a report.
//   nvcc -O3 -arch=sm_90a -lineinfo -o /tmp/rr docs/experiments/racecheck_repro.cu
// Modes: bit 0: the warpgroups run different block counts per unit (3 and 2, as an odd-length
// unit does), else equal (2 and 2); bit 1: a full warp writes the merge row sums (kN 32), else
// half a warp (kN 16); bit 2: each block also waits on an mbarrier (all 128 threads of the
// warpgroup arrive, then wait on its phase), as the kernels wait for TMA boxes. If only the
// unequal-count modes are flagged, racecheck pairs barrier instances by count per warp (a tool
// artefact); a wrong value, or a flag in mode 0, is a real bug.
//   for m in 0 1 2 3 4 5 6 7; do compute-sanitizer --tool racecheck /tmp/rr $m | tail -2; done
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ void wg_bar(int wg) {
  if (wg == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
  else asm volatile("bar.sync 2, 128;" ::: "memory");
}

__global__ void merge_like(int mode, int units, int* bad) {
  __shared__ float work[2][128];  // each warpgroup's per-block scratch
  __shared__ float merged[2][128];  // end of unit: each warpgroup's result, read by the other
  __shared__ float sums[2][32];
  __shared__ unsigned long long mbar[2];
  const int tid = threadIdx.x, tw = tid & 127, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int writers = (mode & 2) ? 32 : 16;
  if (tid == 0)
    for (int w = 0; w < 2; ++w)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;" ::"r"((unsigned)__cvta_generic_to_shared(&mbar[w])));
  __syncthreads();
  unsigned phase = 0;
  for (int u = 0; u < units; ++u) {
    const int blocks = (mode & 1) && wg == 0 ? 3 : 2;
    float acc = 0.f;
    for (int b = 0; b < blocks; ++b) {  // warpgroup-local exchange, as the softmax's column max
      work[wg][tw] = float(u * 7 + b + tw);
      wg_bar(wg);
      acc += work[wg][127 - tw];
      wg_bar(wg);
      if (mode & 4) {
        const unsigned a = (unsigned)__cvta_generic_to_shared(&mbar[wg]);
        asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(a) : "memory");
        asm volatile(
            "{\n.reg .pred P;\nW: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n@!P bra W;\n}" ::"r"(a),
            "r"(phase & 1) : "memory");
        ++phase;
      }
    }
    merged[wg][tw] = acc + float(1000 * wg + u);
    if (tw < writers) sums[wg][tw] = float(u + wg + tw);
    __syncthreads();
    // The other warpgroup's values, as they must be for this unit.
    const int o = 1 - wg, ob = (mode & 1) && o == 0 ? 3 : 2;
    float want = 0.f;
    for (int b = 0; b < ob; ++b) want += float(u * 7 + b + 127 - tw);
    want += float(1000 * o + u);
    if (merged[o][tw] != want) atomicAdd(bad, 1);
    if (tw < writers && sums[o][tw] != float(u + o + tw)) atomicAdd(bad, 1);
    __syncthreads();  // the next unit rewrites merged and sums
  }
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  int* bad;
  cudaMalloc(&bad, sizeof(int));
  cudaMemset(bad, 0, sizeof(int));
  merge_like<<<132, 256>>>(mode, 8, bad);
  int h = -1;
  cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost);
  printf("mode %d: %d wrong values (%s)\n", mode, h, cudaGetErrorString(cudaGetLastError()));
  return h != 0;
}
