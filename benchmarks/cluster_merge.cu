// What a merge of split units through distributed shared memory would cost: the K pieces of a
// 64-row unit run on the K CTAs of one cluster, and at the end each CTA still holds its piece's
// unnormalized O (64 x 512 fp32, the seesaw's accumulator layout over two warpgroups) and each
// row's max and sum. Instead of partial rows to global memory, the grid barrier and the merge
// (perf-notes Next 3: ~2.5 + 3.5-5.7 µs at B8-B32 H128), each CTA finalizes a K-th of the rows
// (row octets dealt out in turn):
//   1. every CTA publishes its rows' (max, sum) in its shared memory; cluster barrier;
//   2. each thread reads its two rows' (max, sum) from all K CTAs, weighs its O by
//      2^(m - M) / L, and stores the rows it does not own into their owner's receive slots
//      (st.shared::cluster; fp32, or bf16 as the global partials are now); cluster barrier;
//   3. the owners add the K - 1 received slots to their own rows and store the output (bf16).
// Measured per CTA with clock64 (the whole merge and its phases), the median and the slowest of
// all CTAs, K = 2, 4, 8, with the remote stores as the accumulator holds the values (a column
// pair per store: 8 bytes fp32, 4 bf16) or wide (a lane pair's shuffle first: 4 columns, 16
// bytes fp32, 8 bf16; Session 42 ran the pair stores only); and the
// launch questions: how many K-CTA clusters of one 227 KiB CTA per SM are resident at once, and
// whether a cooperative launch of them is accepted (the kernels' other merges need the grid barrier).
//
// Build and run (H200): nvcc -arch=sm_90a -O3 -std=c++17 -I../csrc -o cluster_merge cluster_merge.cu && ./cluster_merge
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cluster_ptx.cuh"

namespace {

constexpr int kThreads = 256;             // two warpgroups, as the seesaw
constexpr int kRows = 64, kCols = 512;    // a unit's O
constexpr int kSmemBytes = 227 * 1024;    // one CTA per SM, as the attention kernels
constexpr int kMlBytes = kRows * 2 * 4;   // (max, sum) per row

__device__ __forceinline__ float2 ld_cluster_v2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_cluster_v2(uint32_t addr, float a, float b) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_cluster_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared::cluster.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The CTA that finalizes row r, and the row's index among its rows: row octets dealt out in
// turn, so that each thread's two rows (r0, r0 + 8) go to different owners at K = 2 and every
// warp sends its share (contiguous rows would leave half the warps idle).
template <int K>
__device__ __forceinline__ int owner_of(int r) { return (r >> 3) % K; }
template <int K>
__device__ __forceinline__ int owned_index(int r) { return ((r >> 3) / K) * 8 + (r & 7); }

// Byte offset of column `col` (0..511) in row rr of a receive slot. kWide: the columns in chunks
// of 4 (16 bytes fp32, 8 bf16; one remote store each, from a lane pair's shuffle), the chunk
// index XORed with the row so that a warp's 8 rows land in different banks. Otherwise column
// pairs (one 8- or 4-byte store each, straight from the accumulator), 8 pairs per 32-byte group,
// the group XORed with the row.
template <bool kBf16, bool kWide>
__device__ __forceinline__ int slot_offset(int rr, int col) {
  constexpr int kElem = kBf16 ? 2 : 4;
  if constexpr (kWide) return (((col >> 2) ^ (rr & 7)) * 4 + (col & 3)) * kElem;
  const int p = col >> 1;
  return (((p & ~0x38) | ((((p >> 3) ^ rr) & 7) << 3)) * 2 + (col & 1)) * kElem;
}

template <int K, bool kBf16, bool kWide>
__global__ void __launch_bounds__(kThreads, 1) cluster_merge(__nv_bfloat16* out, long long* cycles, int reps) {
  static_assert(K <= 8, "row octets: at most 8 owners");
  constexpr int kOwn = kRows / K;                      // rows a CTA finalizes
  constexpr int kElem = kBf16 ? 2 : 4;                 // bytes per value in a receive slot
  constexpr int kSlotBytes = kOwn * kCols * kElem;     // one sender's rows for one owner
  static_assert(kMlBytes + (K - 1) * kSlotBytes <= kSmemBytes, "fits");
  extern __shared__ __align__(128) uint8_t raw[];
  float* ml = reinterpret_cast<float*>(raw);
  uint8_t* recv = raw + kMlBytes;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int rank = (int)cluster_rank();
  // The wgmma m64n256 accumulator of warpgroup wg: rows r0, r0 + 8, columns 256 wg + 8 j + 2 q
  // + {0, 1} (j < 32) in o[2 (32 h + j) + {0, 1}] for row r0 + 8 h. A warp's rows share their
  // octet, so all its lanes agree on each row's owner.
  const int r0 = 16 * warp + lane / 4, q = lane % 4;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.001f * (i + tid) + rank;
  float m[2], l[2];
  for (int h = 0; h < 2; ++h) {
    m[h] = 0.25f * rank + 0.01f * (r0 + 8 * h);
    l[h] = 1.0f + rank;
  }
  cluster_sync();
  // per phase: (max, sum) published; slots stored; output summed and stored; the last barrier
  long long ph[4] = {0, 0, 0, 0};
  const long long t0 = clock64();
  for (int rep = 0; rep < reps; ++rep) {
    const long long ta = clock64();
    // 1. (max, sum) of every row, by warpgroup 0's quad leaders
    if (wg == 0 && q == 0)
      for (int h = 0; h < 2; ++h) {
        ml[2 * (r0 + 8 * h)] = m[h];
        ml[2 * (r0 + 8 * h) + 1] = l[h];
      }
    cluster_sync();
    const long long tb = clock64();
    ph[0] += tb - ta;
    // 2. weights, then the rows owned elsewhere into their owner's slot
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      float mk[K], lk[K], M = -INFINITY;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float2 v = ld_cluster_v2(mapa(smem_u32(ml + 2 * r), k));
        mk[k] = v.x;
        lk[k] = v.y;
        M = fmaxf(M, v.x);
      }
      float L = 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) L += exp2f(mk[k] - M) * lk[k];
      const float w = exp2f(m[h] - M) / L;
      const int owner = owner_of<K>(r);
      if (owner == rank) {
#pragma unroll
        for (int j = 0; j < 64; ++j) o[64 * h + j] *= w;
        continue;
      }
      const int slot = rank < owner ? rank : rank - 1;
      const int rr = owned_index<K>(r);
      const uint32_t row = mapa(smem_u32(recv + slot * kSlotBytes + rr * kCols * kElem), owner);
      if constexpr (kWide) {
        // Blocks j0 = 2t, j1 = 2t + 1: an even lane keeps its j0 pair and takes its partner's
        // (columns 8 j0 + 2 q .. + 3), an odd lane keeps its j1 pair and takes its partner's.
        const bool odd = q & 1;
#pragma unroll
        for (int t = 0; t < 16; ++t) {
          const float a0 = o[64 * h + 4 * t] * w, b0 = o[64 * h + 4 * t + 1] * w;
          const float a1 = o[64 * h + 4 * t + 2] * w, b1 = o[64 * h + 4 * t + 3] * w;
          const float rx = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 1);
          const float ry = __shfl_xor_sync(0xffffffffu, odd ? b0 : b1, 1);
          const int col = 256 * wg + 8 * (odd ? 2 * t + 1 : 2 * t) + 2 * (q & 2);
          const float4 v = odd ? make_float4(rx, ry, a1, b1) : make_float4(a0, b0, rx, ry);
          const uint32_t addr = row + slot_offset<kBf16, true>(rr, col);
          if constexpr (kBf16) {
            asm volatile("st.shared::cluster.v2.b32 [%0], {%1, %2};" ::"r"(addr), "r"(pack_bf16(v.x, v.y)),
                         "r"(pack_bf16(v.z, v.w)) : "memory");
          } else {
            asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y),
                         "f"(v.z), "f"(v.w) : "memory");
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const uint32_t addr = row + slot_offset<kBf16, false>(rr, 256 * wg + 8 * j + 2 * q);
          const float a = o[64 * h + 2 * j] * w, b = o[64 * h + 2 * j + 1] * w;
          if constexpr (kBf16) st_cluster_b32(addr, pack_bf16(a, b));
          else st_cluster_v2(addr, a, b);
        }
      }
    }
    cluster_sync();
    const long long tc = clock64();
    ph[1] += tc - tb;
    // 3. the owner's rows: its own weighted O plus the received slots, to global memory
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      if (owner_of<K>(r) != rank) continue;
      const int rr = owned_index<K>(r);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = 256 * wg + 8 * j + 2 * q;
        float a = o[64 * h + 2 * j], b = o[64 * h + 2 * j + 1];
#pragma unroll
        for (int s = 0; s < K - 1; ++s) {
          const uint8_t* at = recv + s * kSlotBytes + rr * kCols * kElem + slot_offset<kBf16, kWide>(rr, col);
          if constexpr (kBf16) {
            const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(at);
            a += __bfloat162float(v.x);
            b += __bfloat162float(v.y);
          } else {
            const float2 v = *reinterpret_cast<const float2*>(at);
            a += v.x;
            b += v.y;
          }
        }
        const size_t o_off = ((size_t)(blockIdx.x / K) * kRows + r) * kCols + col;
        *reinterpret_cast<__nv_bfloat162*>(out + o_off) = __floats2bfloat162_rn(a, b);
      }
    }
    const long long td = clock64();
    ph[2] += td - tc;
    cluster_sync();  // the slots are read before the next round writes them (a merge's last step
                     // would not need it: no CTA writes into another after phase 2)
    ph[3] += clock64() - td;
  }
  const long long t1 = clock64();
  if (tid == 0) {
    cycles[5 * blockIdx.x] = (t1 - t0) / max(reps, 1);
    for (int i = 0; i < 4; ++i) cycles[5 * blockIdx.x + 1 + i] = ph[i] / max(reps, 1);
  }
}

template <int K, bool kBf16, bool kWide>
void run(int sms, __nv_bfloat16* out, long long* cycles) {
  const void* fn = reinterpret_cast<const void*>(cluster_merge<K, kBf16, kWide>);
  cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (K > 8) cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaError_t qe;
  const int clusters = resident_clusters(fn, K, kThreads, kSmemBytes, sms, &qe);
  if (qe != cudaSuccess) printf("occupancy K=%d: %s\n", K, cudaGetErrorString(qe));
  const int grid = K * std::max(clusters, 1);
  for (int reps : {1, 16}) {
    void* args[] = {&out, &cycles, &reps};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 3; ++i) e = launch_clusters(fn, grid, kThreads, kSmemBytes, K, true, args);  // as the kernels
    const cudaError_t s = cudaDeviceSynchronize();
    std::vector<long long> all(5 * grid);
    cudaMemcpy(all.data(), cycles, all.size() * sizeof(long long), cudaMemcpyDeviceToHost);
    long long med[5], mx[5];
    for (int i = 0; i < 5; ++i) {
      std::vector<long long> h;
      for (int b = 0; b < grid; ++b) h.push_back(all[5 * b + i]);
      std::sort(h.begin(), h.end());
      med[i] = h[grid / 2];
      mx[i] = h.back();
    }
    printf("K=%d %s %s stores: %d clusters resident (%d CTAs), cooperative launch %s / %s; reps %2d: cycles "
           "per merge median %lld (max %lld); phases (max, sum) %lld, slots %lld, output %lld, last barrier %lld\n",
           K, kBf16 ? "bf16" : "fp32", kWide ? "wide" : "pair", clusters, grid, cudaGetErrorString(e),
           cudaGetErrorString(s), reps, med[0], mx[0], med[1], med[2], med[3], med[4]);
    cudaGetLastError();
  }
}

}  // namespace

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  printf("%d SMs, max SM clock %d MHz\n", sms, clock_khz / 1000);
  __nv_bfloat16* out;
  long long* cycles;
  cudaMalloc(&out, (size_t)2 * sms * kRows * kCols * sizeof(__nv_bfloat16));
  cudaMalloc(&cycles, 5 * 2 * sms * sizeof(long long));
  run<2, false, false>(sms, out, cycles);
  run<2, true, false>(sms, out, cycles);
  run<2, false, true>(sms, out, cycles);
  run<2, true, true>(sms, out, cycles);
  run<4, true, false>(sms, out, cycles);
  run<4, true, true>(sms, out, cycles);
  run<8, true, false>(sms, out, cycles);
  run<8, true, true>(sms, out, cycles);
  return 0;
}
