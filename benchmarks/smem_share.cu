// Do copies landing in shared memory slow the seesaw's wgmmas down? The question behind issue
// 4's H 128 rows (perf-notes Session 48).
//
// Per block pair the seesaw reads 3,456 wavefronts of 128 B as GMMA operands (QK^T m64n64k16 SS:
// 32 per 32-cycle wgmma, all of shared memory's 128 B per clock; PV m64n256k16: 64 per RS and 80
// per SS wgmma of 128 cycles) against 4,352 tensor cycles, and its refills land 144 KiB (1,152
// wavefronts) in the stages.
//
// One CTA per SM: warpgroups 0 and 1 issue wgmmas on operands in [0, 144 KiB) (content: whatever
// shared memory holds; only time counts); one thread of warp 8 keeps `inflight` 8 KiB copies
// landing in [144, 216) KiB until the warpgroups are done (a negative count: its waits poll with
// test_wait and a sleep instead of a suspending try_wait). Copy kinds: contiguous bulk copies
// from L2; the kernels' TMA boxes (tensor map, 128B swizzle) from L2, from DRAM with
// evict_first, and from DRAM with 256-byte L2 promotion. Math modes, per warpgroup iteration
// (then commit and wait):
//   qk    36 m64n64k16 SS          (QK^T of one block: 1,152 tensor cycles)
//   pvrs  4 m64n256k16 RS, B^T      (PV from registers: 512)
//   pvss  4 m64n256k16 SS, B^T      (PV of the other warpgroup's P: 512)
//   pair  36 qk + 4 pvrs + 4 pvss   (one warpgroup's share of a pair: 2,176)
// Prints per mode and copy setting: cycles per iteration per SM (both warpgroups) against the
// tensor ideal, the copies' bytes per clock per SM over the same window, wavefronts per clock
// (GMMA reads + copies) and the tensor cycles lost per 128 B landed.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/smem_share \
//       benchmarks/smem_share.cu && /tmp/smem_share
// H200 (Session 48, four runs): every shape loses 1.0-1.6 tensor cycles per 128 B landed, for
// every copy kind and either wait (qk 1,235 -> 1,285-1,315 cycles per iteration at 4.2-5.6 B/clk;
// pvrs 512 -> 549-567; pvss 512 -> 550-561; pair 2,177 -> 2,352-2,387 at 6.1-7.8 B/clk), also
// where the wgmmas read only half of shared memory's bandwidth (pvrs: 0.50 wavefronts per
// clock). The copies alone land only 9-12 B/clk per SM here (tma_ingest's stages: 36 from L2),
// and cuBLAS's matmul lands 42.4 B/clk at 93.65% tensor busy while reading 0.94 GMMA wavefronts
// per clock (ncu): landing need not cost read cycles. Open, see perf-notes Session 48.
// Outputs and the ncu counters: benchmarks/results/smem_share-20261203.txt.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "cluster_ptx.cuh"  // bulk_load, smem_u32
#include "kv_map.cuh"       // the kernels' KV tensor map
#include "sm90/tma.cuh"    // mbarrier, TMA and L2-policy wrappers
#include "sm90/wgmma.cuh"  // the kernels' wgmma wrappers and descriptors

namespace {

using namespace jit_mla::sm90;

constexpr int kIters = 400;                // iterations per warpgroup
constexpr int kChunk = 8192;               // one KV box
constexpr int kCopyBase = 144 * 1024;      // copy destination: 9 chunks
constexpr int kSlots = 9;
constexpr int kSmemBytes = kCopyBase + kSlots * kChunk + 1024;
constexpr int kSrcChunks = 16;             // bulk source: 128 KiB per CTA, L2-resident after the warm-up
constexpr int kL2Pages = 2;                // tensor-map source from L2: 2 KV pages (144 KiB) per CTA
constexpr int kDramPages = 64;             // from DRAM: 64 pages (4.5 MiB) per CTA, 594 MiB in all
constexpr int kPages = 132 * kDramPages;
// Copy kinds: 0 none; 1 contiguous bulk copies from L2; 2 the kernels' TMA boxes (64 tokens x 64
// columns, 128B swizzle) from L2; 3 the same boxes streamed from DRAM with evict_first; 4 as 3 with
// the tensor map's 256-byte L2 promotion.
const char* const kCopyNames[] = {"off", "bulk L2", "tmap L2", "tmap DRAM", "tmap 256B"};

enum Math { kNone = 0, kQk = 1, kPvRs = 2, kPvSs = 3, kPair = 4 };
const char* const kMathNames[] = {"none", "qk", "pvrs", "pvss", "pair"};
const int kIdeal[] = {0, 1152, 512, 512, 2176};  // tensor cycles per iteration per warpgroup
const int kGmmaWf[] = {0, 36 * 32, 4 * 64, 4 * 80, 36 * 32 + 4 * 64 + 4 * 80};  // its GMMA reads, 128 B each

template <int MATH>
__device__ __forceinline__ void math_iter(float (&s)[32], float (&o)[128], const uint32_t (&a)[4], uint32_t base, int wg) {
  const uint64_t dq = make_smem_desc(base, 16, 1024), dk = make_smem_desc(base + 72 * 1024, 16, 1024);
  const uint64_t dp = make_smem_desc(base + 64 * 1024, 16, 1024);
  const uint64_t dv = make_smem_desc(base + 72 * 1024 + wg * 32 * 1024, kChunk, 1024);
  wgmma_fence();
  // pair: QK^T accumulates into O's first 32 registers (the values mean nothing), so the
  // warpgroup fits the 168 registers of a 288-thread CTA without serialized wgmmas.
  float(&sacc)[32] = MATH == kPair ? *reinterpret_cast<float(*)[32]>(&o[0]) : s;
  if (MATH == kQk || MATH == kPair) {
#pragma unroll
    for (int kk = 0; kk < 36; ++kk) {
      const uint32_t off = (kk / 4) * kChunk + (kk % 4) * 32;
      wgmma_m64n64k16_ss(sacc, desc_add(dq, off), desc_add(dk, off), 1);
    }
  }
  if (MATH == kPvRs || MATH == kPair) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs_tnspb(o, a, desc_add(dv, kk * 16 * 128), 1);
  }
  if (MATH == kPvSs || MATH == kPair) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_ss_tnspb(o, desc_add(dp, kk * 32), desc_add(dv, kk * 16 * 128), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(s);
  fence_regs(o);
}

// cyc[3 * cta + {0, 1}]: each warpgroup's cycles; cyc[3 * cta + 2]: bytes copied in the window.
template <int MATH>
__global__ void __launch_bounds__(288) bench(const uint8_t* src, const __grid_constant__ CUtensorMap tmap, int copy,
                                             int inflight, float* out, long long* cyc) {
  const bool copy_poll = inflight < 0;  // a negative count: |inflight|, waits polled
  inflight = inflight < 0 ? -inflight : inflight;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t bar[kSlots];
  __shared__ volatile int done;
  const uint32_t base = (smem_u32(smem) + 1023) & ~1023u;
  const int warp = threadIdx.x / 32, wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSlots; ++i) mbar_init(smem_u32(&bar[i]), 1);
    fence_mbar_init();
    done = 0;
  }
  __syncthreads();
  if (warp == 8) {
    if ((threadIdx.x & 31) != 0) return;
    if (!copy) {
      cyc[3 * blockIdx.x + 2] = 0;
      return;
    }
    // Copier: slot i % 9 is reused once its previous chunk landed; at most `inflight` out.
    const uint8_t* region = src + (long long)blockIdx.x * kSrcChunks * kChunk;
    const int pages = copy == 2 ? kL2Pages : kDramPages;
    const uint64_t policy = copy >= 3 ? createpolicy_evict_first() : createpolicy_evict_normal();
    long long issued = 0, landed = 0, landed_at_done = -1;
    const long long t0 = clock64();
    while (true) {
      if (landed_at_done < 0 && done) landed_at_done = landed;
      if (landed_at_done >= 0 && landed == issued) break;
      if (landed_at_done < 0 && issued - landed < inflight) {
        const int slot = (int)(issued % kSlots);
        const uint32_t b = smem_u32(&bar[slot]);
        mbar_arrive_expect_tx(b, kChunk);
        const uint32_t dst = base + kCopyBase + slot * kChunk;
        if (copy == 1) {
          bulk_load(dst, region + (issued % kSrcChunks) * kChunk, kChunk, b);
        } else {
          const int page = blockIdx.x * pages + (int)((issued / 9) % pages);
          tma_load_3d(dst, &tmap, b, (int)(issued % 9) * 64, 0, page, policy);
        }
        ++issued;
      } else {
        const int slot = (int)(landed % kSlots);
        const uint32_t b = smem_u32(&bar[slot]), par = (uint32_t)((landed / kSlots) & 1);
        if (copy_poll) {
          // Polled with test_wait and a sleep instead of a suspending try_wait.
          uint32_t ok = 0;
          while (!ok) {
            asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(ok) : "r"(b), "r"(par) : "memory");
            if (!ok) __nanosleep(256);
          }
        } else {
          mbar_wait(b, par);
        }
        ++landed;
      }
    }
    if (MATH == kNone) landed_at_done = landed;
    cyc[3 * blockIdx.x + 2] = landed_at_done * kChunk;
    if (MATH == kNone) cyc[3 * blockIdx.x] = clock64() - t0;
    return;
  }
  if constexpr (MATH == kNone) {
    // Copies alone: run them for a fixed time.
    if (threadIdx.x == 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < 2000000) {
      }
      done = 1;
    }
  } else {
    float s[32], o[128];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
    asm volatile("bar.sync 1, 256;" ::: "memory");
    const long long t0 = clock64();
    for (int it = 0; it < kIters; ++it) math_iter<MATH>(s, o, a, base, wg);
    const long long t1 = clock64();
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 0) done = 1;
    float x = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) x += s[i];
#pragma unroll
    for (int i = 0; i < 128; ++i) x += o[i];
    out[blockIdx.x * 256 + threadIdx.x] = x;
    if (threadIdx.x % 128 == 0) cyc[3 * blockIdx.x + wg] = t1 - t0;
  }
}

// One setting, printed; returns the cycles per iteration per SM (0 for copies alone or a failed
// launch). alone: the same math mode's cycles without copies, which the cycles lost are against.
template <int MATH>
double run(int sms, const uint8_t* src, const CUtensorMap& tmap, int copy, int inflight, float* out, long long* cyc,
           double alone = 0) {
  auto k = bench<MATH>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  for (int rep = 0; rep < 2; ++rep) k<<<sms, 288, kSmemBytes>>>(src, tmap, copy, inflight, out, cyc);  // warm-up, then timed
  if (cudaDeviceSynchronize() != cudaSuccess) {
    printf("%s: %s\n", kMathNames[MATH], cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  long long h[3 * 132] = {};
  cudaMemcpy(h, cyc, sizeof(long long) * 3 * sms, cudaMemcpyDeviceToHost);
  // Mean over the CTAs of the slower warpgroup's cycles (copies alone: the copier's).
  double cyc_sum = 0, bytes_sum = 0, worst = 0;
  for (int i = 0; i < sms; ++i) {
    const double c = MATH == kNone ? h[3 * i] : (h[3 * i] > h[3 * i + 1] ? h[3 * i] : h[3 * i + 1]);
    cyc_sum += c;
    bytes_sum += h[3 * i + 2];
    worst = c > worst ? c : worst;
  }
  const double c = cyc_sum / sms, bpc = bytes_sum / sms / c;
  if (MATH == kNone) {
    printf("none  copies %-9s (%d in flight): %5.1f B/clk per SM\n", kCopyNames[copy], inflight, bpc);
    return 0;
  }
  const double per_iter = c / kIters / 2;  // both warpgroups share the SM's tensor pipe
  const double gmma_wf = kGmmaWf[MATH];
  // Tensor cycles lost per 128-byte wavefront the copies wrote in the same time.
  const double written = bpc * per_iter / 128, lost = copy ? (per_iter - alone) / written : 0;
  printf("%-5s copies %-9s (%d in flight): %7.1f cyc/iter/SM (ideal %4d, tensor %5.1f%%, worst CTA %5.1f%%), "
         "copies %5.1f B/clk, gmma %4.2f + copy %4.2f = %4.2f wf/clk, %4.2f cycles lost per wf written\n",
         kMathNames[MATH], kCopyNames[copy], inflight, per_iter, kIdeal[MATH], 100.0 * kIdeal[MATH] / per_iter,
         100.0 * kIdeal[MATH] * kIters * 2 / worst, bpc, gmma_wf / per_iter, bpc / 128, gmma_wf / per_iter + bpc / 128,
         lost);
  return per_iter;
}

template <int MATH>
void sweep(int sms, const uint8_t* src, const CUtensorMap (&tmaps)[2], float* out, long long* cyc) {
  const double alone = run<MATH>(sms, src, tmaps[0], 0, 1, out, cyc);
  for (int copy = 1; copy <= 4; ++copy)
    for (int inflight : {2, 9, -9}) run<MATH>(sms, src, tmaps[copy == 4], copy, inflight, out, cyc, alone);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  sms = sms > 132 ? 132 : sms;
  uint8_t *src, *kv;
  float* out;
  long long* cyc;
  cudaMalloc(&src, 132LL * kSrcChunks * kChunk);
  cudaMemset(src, 0x3c, 132LL * kSrcChunks * kChunk);
  cudaMalloc(&kv, (long long)kPages * 9 * kChunk);
  cudaMemset(kv, 0x3c, (long long)kPages * 9 * kChunk);
  CUtensorMap tmaps[2];  // L2 promotion none, 256 bytes
  if (!kv_map(&tmaps[0], kv, kPages, CU_TENSOR_MAP_L2_PROMOTION_NONE) ||
      !kv_map(&tmaps[1], kv, kPages, CU_TENSOR_MAP_L2_PROMOTION_L2_256B)) {
    printf("tensor map: encode failed\n");
    return 1;
  }
  cudaMalloc(&out, sizeof(float) * 256 * 132);
  cudaMalloc(&cyc, sizeof(long long) * 3 * 132);
  cudaMemset(cyc, 0, sizeof(long long) * 3 * 132);
  for (int copy = 1; copy <= 4; ++copy)
    for (int inflight : {1, 2, 9, -9}) run<kNone>(sms, src, tmaps[copy == 4], copy, inflight, out, cyc);
  sweep<kQk>(sms, src, tmaps, out, cyc);
  sweep<kPvRs>(sms, src, tmaps, out, cyc);
  sweep<kPvSs>(sms, src, tmaps, out, cyc);
  sweep<kPair>(sms, src, tmaps, out, cyc);
  return 0;
}
