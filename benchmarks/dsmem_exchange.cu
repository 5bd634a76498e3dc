// What a CTA pair (a 2-CTA cluster) pays to swap a 64x64 fp32 tile through distributed shared
// memory, and whether the attention kernel could run as 66 such pairs with a grid barrier.
//
// Question (perf-notes, Session 28, "a D-split pair"): at H 128 two CTAs that split each KV row
// by columns (one the first 256 latent columns + 32 rope, the other the rest) would each hold
// half of every block (36 KiB a stage: 3 stages where 2 fit now) and read each KV byte once from
// L2 (twice today), but every block's S = Q K^T is then two partial sums, one per CTA, that the
// pair must swap before the softmax: per warpgroup 64 x 64 fp32 = 16 KiB each way per block.
// Measured here, per warpgroup and iteration (every thread stores its 32 floats into the
// partner's buffer, arrives on the partner's mbarrier, waits for the partner's tile, adds it,
// hands the buffer back), with one and with both warpgroups swapping at once; the launch
// questions: how many 2-CTA clusters of one 227 KiB CTA per SM are resident at once, and does a
// cooperative launch take a cluster dimension (the grid barrier of the merge needs it).
//
// Build and run (H200): nvcc -arch=sm_90a -O3 -std=c++17 -I../csrc -o dsmem dsmem_exchange.cu && ./dsmem
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cluster_ptx.cuh"
#include "sm90/tma.cuh"  // mbar_init, fence_mbar_init

namespace {

using jit_mla::sm90::fence_mbar_init;
using jit_mla::sm90::mbar_init;

constexpr int kThreads = 256;         // two warpgroups
constexpr int kTileFloats = 64 * 64;  // one warpgroup's S tile
constexpr int kSmemBytes = 200 * 1024;  // one CTA per SM, as the attention kernels

struct Smem {
  float recv[2][kTileFloats];  // per warpgroup: the partner's partial S lands here
  uint64_t full[2];            // per warpgroup: the partner's tile is in recv (128 arrivals)
  uint64_t free_[2];           // per warpgroup: the partner has read my last tile (128 arrivals)
};

__device__ __forceinline__ void arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w) : "memory");
}

// active_wgs: 1 (warpgroup 0 swaps, warpgroup 1 idles) or 2.
// stream: stores only, `iters` tiles back to back into the partner's buffer, one hand-off at
// the end (the one-way rate, no round trip per tile).
__global__ void __launch_bounds__(kThreads, 1) exchange(int iters, int active_wgs, int stream, long long* cycles,
                                                        float* sink) {
  extern __shared__ __align__(16) uint8_t raw[];
  Smem& s = *reinterpret_cast<Smem*>(raw);
  const int tid = threadIdx.x, wg = tid / 128, tw = tid % 128;
  const uint32_t peer = cluster_rank() ^ 1u;
  if (tid == 0) {
    for (int w = 0; w < 2; ++w) {
      mbar_init(smem_u32(&s.full[w]), 128);
      mbar_init(smem_u32(&s.free_[w]), 128);
    }
    fence_mbar_init();
  }
  cluster_sync();
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = tid * 0.001f + i;
  long long t0 = clock64();
  if (wg < active_wgs) {
    // Chunk j of thread tw at 16 (128 j + tw) bytes: a warp's 16-byte stores and loads cover
    // 512 contiguous bytes, no bank conflicts (at 128 tw + 16 j they were 8-way: 2x slower).
    const uint32_t my_recv = smem_u32(&s.recv[wg][0]) + tw * 16;
    const uint32_t peer_recv = mapa(my_recv, peer);
    const uint32_t peer_full = mapa(smem_u32(&s.full[wg]), peer), peer_free = mapa(smem_u32(&s.free_[wg]), peer);
    for (int it = 0; it < iters && stream; ++it) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        st_cluster_v4(peer_recv + 2048 * j, make_float4(acc[4 * j] + it, acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    }
    if (stream) {
      arrive_remote(peer_full);
      wait_cluster(smem_u32(&s.full[wg]), 0);
    }
    for (int it = 0; it < iters && !stream; ++it) {
      if (it > 0) wait_cluster(smem_u32(&s.free_[wg]), (it - 1) & 1);  // the partner read my last tile
#pragma unroll
      for (int j = 0; j < 8; ++j)
        st_cluster_v4(peer_recv + 2048 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
      arrive_remote(peer_full);
      wait_cluster(smem_u32(&s.full[wg]), it & 1);
      const float4* mine = reinterpret_cast<const float4*>(&s.recv[wg][0]) + tw;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 v = mine[128 * j];
        acc[4 * j] += v.x * 1e-6f; acc[4 * j + 1] += v.y * 1e-6f;
        acc[4 * j + 2] += v.z * 1e-6f; acc[4 * j + 3] += v.w * 1e-6f;
      }
      arrive_remote(peer_free);
    }
    if (iters > 0 && !stream) wait_cluster(smem_u32(&s.free_[wg]), (iters - 1) & 1);
  }
  const long long t1 = clock64();
  float x = 0.f;
  for (int i = 0; i < 32; ++i) x += acc[i];
  sink[blockIdx.x * kThreads + tid] = x;
  if (tw == 0) cycles[blockIdx.x * 2 + wg] = (t1 - t0);
  cluster_sync();  // no CTA leaves while its partner may still write into its shared memory
}

__global__ void __launch_bounds__(kThreads, 1) empty_kernel(int* flag) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *flag = 1;
}

cudaError_t launch(const void* fn, int grid, int cluster, bool cooperative, void** args) {
  return launch_clusters(fn, grid, kThreads, kSmemBytes, cluster, cooperative, args);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(exchange, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);

  cudaError_t e;
  int clusters = resident_clusters(reinterpret_cast<const void*>(exchange), 2, kThreads, kSmemBytes, sms, &e);
  printf("%d SMs; 2-CTA clusters of one %d KiB CTA per SM resident at once: %d (%s)\n", sms, kSmemBytes / 1024,
         clusters, cudaGetErrorString(e));
  const int grid = 2 * std::max(clusters, 1);

  int* flag;
  cudaMalloc(&flag, sizeof(int));
  void* eargs[] = {&flag};
  for (bool coop : {false, true}) {
    e = launch(reinterpret_cast<const void*>(empty_kernel), grid, 2, coop, eargs);
    cudaError_t s = cudaDeviceSynchronize();
    printf("launch of %d CTAs in 2-CTA clusters, cooperative %d: %s / %s\n", grid, coop, cudaGetErrorString(e),
           cudaGetErrorString(s));
    cudaGetLastError();
  }

  long long* cycles;
  float* sink;
  cudaMalloc(&cycles, 2 * grid * sizeof(long long));
  cudaMalloc(&sink, grid * kThreads * sizeof(float));
  for (int stream : {0, 1})
  for (int wgs : {1, 2}) {
    for (int iters : {1, 64}) {
      if (stream && iters == 1) continue;
      void* args[] = {&iters, &wgs, &stream, &cycles, &sink};
      for (int rep = 0; rep < 3; ++rep) launch(reinterpret_cast<const void*>(exchange), grid, 2, false, args);
      e = cudaDeviceSynchronize();
      std::vector<long long> h(2 * grid);
      cudaMemcpy(h.data(), cycles, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
      std::vector<long long> wg0;
      for (int b = 0; b < grid; ++b) wg0.push_back(h[2 * b]);
      std::sort(wg0.begin(), wg0.end());
      printf("%d CTAs, %d warpgroup(s) %s 16 KiB tiles, %2d iterations: cycles per tile (warpgroup 0) "
             "median %lld, max %lld (%s)\n",
             grid, wgs, stream ? "streaming" : "swapping", iters, wg0[grid / 2] / iters, wg0.back() / iters,
             cudaGetErrorString(e));
    }
  }
  return 0;
}
