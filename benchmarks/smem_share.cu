// What slows the seesaw's wgmmas down on an SM: copies landing in shared memory, or other warps'
// instructions issued beside them? The question behind issue 4's H 128 rows (perf-notes
// Sessions 48-49).
//
// Per block pair the seesaw reads 3,456 wavefronts of 128 B as GMMA operands (QK^T m64n64k16 SS:
// 32 per 32-cycle wgmma, all of shared memory's 128 B per clock; PV m64n256k16: 64 per RS and 80
// per SS wgmma of 128 cycles) against 4,352 tensor cycles, and its refills land 144 KiB (1,152
// wavefronts) in the stages.
//
// One CTA of 384 threads per SM: warpgroups 0 and 1 issue wgmmas on operands in [0, 144 KiB)
// (content: whatever shared memory holds; only time counts). Beside them either one thread of
// warp 8 keeps copies landing (kinds: contiguous bulk copies from L2; the kernels' TMA boxes
// (tensor map, 128B swizzle) from L2, from DRAM with evict_first, from DRAM with 256-byte L2
// promotion; units of 1 box or of a whole 9-box block per mbarrier; landing in a region never
// read or in the K / V operands; waits suspending or polled), or 1 or 4 warps issue one
// instruction kind in 1 or 8 independent chains (Setting). Math modes, per warpgroup iteration
// (then commit, and wait<0> or, "pipe", wait<1>):
//   qk    36 m64n64k16 SS          (QK^T of one block: 1,152 tensor cycles)
//   qk2   qk into two accumulators alternately (two chains of 18)
//   pvrs  4 m64n256k16 RS, B^T      (PV from registers: 512)
//   pvss  4 m64n256k16 SS, B^T      (PV of the other warpgroup's P: 512)
//   pair  36 qk + 4 pvrs + 4 pvss   (one warpgroup's share of a pair: 2,176)
// Prints per mode and setting: cycles per iteration per SM (both warpgroups) against the tensor
// ideal, and the tensor cycles lost per 128 B landed or per instruction an alu warp issued.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc -o /tmp/smem_share \
//       benchmarks/smem_share.cu && /tmp/smem_share
// H200 (Session 49; outputs in benchmarks/results/smem_share-20261203.txt):
// - Landing costs the wgmmas next to nothing: the kernels' boxes 0.00 cycles per 128 B on PV and
//   0.02-0.04 on a pair (wait<1>: -0.23 on qk); bulk copies 0.24-0.57. Session 48's 1.0-1.6 was
//   its copier's 64-bit remainder per copy (rem64 below), not the landing.
// - Instructions beside the wgmmas, tensor cycles lost per warp instruction (pair / qk; PV
//   m64n256 loses nothing to any of them but the multiplies and, 8 chains at once, the pointer
//   adds (0.7-2.0)): IMAD.WIDE 14.7 / 14.8
//   (6-7 issued back to back), IMAD.HI 9.2 / 9.3, a 64-bit remainder by a variable ~165-215;
//   FFMA 0.1-0.3 at a low rate but 1.2-1.5 at 0.2-0.4 per clock on qk, FMUL / FADD 0.4-0.8 there,
//   SHFL 0.5-4; IMAD, MUFU.EX2 / RCP, F2FP, FMNMX, I2F / F2I, LDS.128 at most ~0.3; a warp
//   suspended in try_wait nothing.
// - qk alone reaches 93.2% of the tensor ideal, qk2 98.3%: one chain of 36 dependent m64n64
//   wgmmas cannot keep the pipe full (a pair, whose PV interleaves, reaches 99.8%).
// - One-box units land at most ~8.7 B/clk per SM whatever the count in flight (1-9); 9-box units
//   25 from L2, 17.5 from DRAM (all SMs at once). Not understood.
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
// Warpgroups 0-1 the math, warps 8-11 the copier or the alu warps (384 threads: 168 registers;
// qk2's math warpgroups take 224 by setmaxnreg, the third keeps 56).
constexpr int kThreads = 384;
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

// qk2: qk with the k-steps alternating between two accumulators (two chains of 18 dependent
// wgmmas instead of one of 36). (A pair with it does not fit 384 threads' registers: ptxas
// serializes its wgmmas, also under setmaxnreg, and more than 256 threads cannot have 224.)
enum Math { kNone = 0, kQk = 1, kPvRs = 2, kPvSs = 3, kPair = 4, kQk2 = 5 };
const char* const kMathNames[] = {"none", "qk", "pvrs", "pvss", "pair", "qk2"};
const int kIdeal[] = {0, 1152, 512, 512, 2176, 1152};  // tensor cycles per iteration per warpgroup
const int kGmmaWf[] = {0, 36 * 32, 4 * 64, 4 * 80, 36 * 32 + 4 * 64 + 4 * 80, 36 * 32};  // GMMA reads, 128 B each

template <int MATH>
__device__ __forceinline__ void math_iter(float (&s)[32], float (&o)[128], const uint32_t (&a)[4], uint32_t base, int wg) {
  const uint64_t dq = make_smem_desc(base, 16, 1024), dk = make_smem_desc(base + 72 * 1024, 16, 1024);
  const uint64_t dp = make_smem_desc(base + 64 * 1024, 16, 1024);
  const uint64_t dv = make_smem_desc(base + 72 * 1024 + wg * 32 * 1024, kChunk, 1024);
  wgmma_fence();
  // pair: QK^T accumulates into O's first 32 registers (the values mean nothing), so the
  // warpgroup fits the 168 registers of a 384-thread CTA without serialized wgmmas. qk2: the odd
  // k-steps into O's first 32 registers.
  constexpr bool kPairLike = MATH == kPair;
  float(&sacc)[32] = kPairLike ? *reinterpret_cast<float(*)[32]>(&o[0]) : s;
  float(&sacc2)[32] = *reinterpret_cast<float(*)[32]>(&o[0]);
  if (MATH == kQk || MATH == kPair || MATH == kQk2) {
#pragma unroll
    for (int kk = 0; kk < 36; ++kk) {
      const uint32_t off = (kk / 4) * kChunk + (kk % 4) * 32;
      wgmma_m64n64k16_ss(MATH == kQk2 && kk % 2 ? sacc2 : sacc, desc_add(dq, off), desc_add(dk, off), 1);
    }
  }
  if (MATH == kPvRs || kPairLike) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs_tnspb(o, a, desc_add(dv, kk * 16 * 128), 1);
  }
  if (MATH == kPvSs || kPairLike) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_ss_tnspb(o, desc_add(dp, kk * 32), desc_add(dv, kk * 16 * 128), 1);
  }
  wgmma_commit();
}

// One setting. copy: the copy kind (kCopyNames). inflight: units in flight (negative: waits
// polled). unit: boxes per mbarrier (1 or 9; a unit of 9 is a KV block of 72 KiB issued at once).
// dst: 0 lands in [144, 216) KiB, never read; 1 lands in [72, 144) KiB, the K / V operands the
// wgmmas read. pipe: the warpgroups keep one commit group in flight across iterations (wait<1>)
// instead of draining each (wait<0>). alu: instead of copies, warps 8 .. 8 + alu_warps - 1 (all
// lanes; warp w issues on SM sub-partition w % 4) issue one instruction kind (kAluNames) in
// `chains` independent chains, until the warpgroups are done: what other warps' instructions
// (the seesaw's softmax beside the other warpgroup's wgmmas) cost the tensor pipe.
struct Setting {
  int copy, inflight, unit, dst, pipe, alu = 0, alu_warps = 0, chains = 0;
};

enum Alu { kAluNone = 0, kAlu64, kFfma, kFmul, kImad, kEx2, kCvt, kShfl, kLds, kFmax, kFadd, kI2f, kRcp, kWide,
           kTryWait, kHi, kPtr, kAluKinds };
const char* const kAluNames[] = {"-",    "rem64", "ffma", "fmul",    "imad",  "ex2",      "cvt.bf16x2", "shfl",
                                 "lds.128", "fmax", "fadd", "i2f+f2i", "rcp", "imad.wide", "try_wait", "imad.hi",
                                 "ptr+i*4"};
constexpr int kAluUnroll = 8;  // instructions per chain per loop pass

// One pass of `kAluUnroll` instructions on each of C chains; returns the instructions issued
// (per warp). rem64 is Session 48's copier arithmetic (a 64-bit remainder by a runtime value,
// ~70 instructions through a call): its count is per remainder, not per instruction.
template <int KIND, int C>
__device__ __forceinline__ int alu_pass(float (&f)[8], uint32_t (&u)[8], uint32_t lds_addr, uint32_t bar_addr) {
#pragma unroll
  for (int r = 0; r < kAluUnroll; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (KIND == kFfma) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f[c]) : "f"(f[(c + 1) & 7]), "f"(f[(c + 2) & 7]));
      if (KIND == kFmul) asm volatile("mul.rn.f32 %0, %0, %1;" : "+f"(f[c]) : "f"(f[(c + 1) & 7]));
      if (KIND == kImad) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(u[c]) : "r"(u[(c + 1) & 7]), "r"(u[(c + 2) & 7]));
      if (KIND == kEx2) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(f[c]));
      if (KIND == kCvt) asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "+r"(u[c]) : "f"(f[c]), "f"(__uint_as_float(u[c])));
      if (KIND == kShfl) asm volatile("shfl.sync.bfly.b32 %0, %0, 1, 0x1f, -1;" : "+r"(u[c]));
      if (KIND == kLds) {
        uint32_t x, y, z, w;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(lds_addr + c * 512));
        u[c] ^= x ^ y ^ z ^ w;  // keeps the load live (3 LOP3 per load: counted as 1 instruction)
      }
      if (KIND == kFmax) asm volatile("max.f32 %0, %0, %1;" : "+f"(f[c]) : "f"(f[(c + 1) & 7]));
      if (KIND == kFadd) asm volatile("add.rn.f32 %0, %0, %1;" : "+f"(f[c]) : "f"(f[(c + 1) & 7]));
      if (KIND == kI2f) {  // two instructions: I2F and F2I
        asm volatile("cvt.rn.f32.s32 %0, %1;" : "=f"(f[c]) : "r"(u[c]));
        asm volatile("cvt.rzi.s32.f32 %0, %1;" : "=r"(u[c]) : "f"(f[c]));
      }
      if (KIND == kRcp) asm volatile("rcp.approx.ftz.f32 %0, %0;" : "+f"(f[c]));
      if (KIND == kWide) {
        unsigned long long w;
        asm volatile("mul.wide.u32 %0, %1, %2;" : "=l"(w) : "r"(u[c]), "r"(u[(c + 1) & 7]));
        u[c] = (uint32_t)(w >> 32) ^ (uint32_t)w;  // + one LOP3 (counted as part of it)
      }
      if (KIND == kHi) asm volatile("mul.hi.u32 %0, %0, %1;" : "+r"(u[c]) : "r"(u[(c + 1) & 7]));
      if (KIND == kPtr) {  // what C makes of a pointer plus an int index (IMAD.WIDE with an immediate)
        const uint32_t* q = reinterpret_cast<const uint32_t*>(((unsigned long long)u[(c + 1) & 7] << 32) | u[c]);
        q += (int)u[(c + 2) & 7];
        unsigned long long a = reinterpret_cast<unsigned long long>(q);
        asm volatile("" : "+l"(a));
        u[c] = (uint32_t)a ^ (uint32_t)(a >> 32);
      }
      if (KIND == kTryWait) {  // bar_addr: an mbarrier whose phase never completes; suspends up to the hint
        uint32_t ok;
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok) : "r"(bar_addr), "r"(0u), "r"(jit_mla::kWaitSuspendHintNs) : "memory");
        u[c] += ok;
      }
      if (KIND == kAlu64) {
        unsigned long long x = ((unsigned long long)u[c] << 32) | __float_as_uint(f[c]);
        x = x * 6364136223846793005ull + (x % (unsigned long long)(kDramPages + (u[(c + 1) & 7] & 1)));
        u[c] = (uint32_t)(x >> 32);
        f[c] = __uint_as_float((uint32_t)x);
      }
    }
  }
  return kAluUnroll * C * (KIND == kI2f ? 2 : 1);
}

template <int KIND, int C>
__device__ long long alu_loop(volatile int* done, uint32_t lds_addr, uint32_t bar_addr) {
  float f[8];
  uint32_t u[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    f[c] = 1.0f + 0.001f * (threadIdx.x + c);
    u[c] = threadIdx.x * 2654435761u + c;
  }
  long long n = 0;
  while (!*done) n += alu_pass<KIND, C>(f, u, lds_addr, bar_addr);
  float x = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) x += f[c] + (float)u[c];
  return x == 12345.f ? n + 1 : n;  // keeps the chains live
}

template <int C>
__device__ long long alu_kind(int kind, volatile int* done, uint32_t lds_addr, uint32_t bar_addr) {
  switch (kind) {
    case kAlu64: return alu_loop<kAlu64, C>(done, lds_addr, bar_addr);
    case kFfma: return alu_loop<kFfma, C>(done, lds_addr, bar_addr);
    case kFmul: return alu_loop<kFmul, C>(done, lds_addr, bar_addr);
    case kImad: return alu_loop<kImad, C>(done, lds_addr, bar_addr);
    case kEx2: return alu_loop<kEx2, C>(done, lds_addr, bar_addr);
    case kCvt: return alu_loop<kCvt, C>(done, lds_addr, bar_addr);
    case kShfl: return alu_loop<kShfl, C>(done, lds_addr, bar_addr);
    case kLds: return alu_loop<kLds, C>(done, lds_addr, bar_addr);
    case kFmax: return alu_loop<kFmax, C>(done, lds_addr, bar_addr);
    case kFadd: return alu_loop<kFadd, C>(done, lds_addr, bar_addr);
    case kI2f: return alu_loop<kI2f, C>(done, lds_addr, bar_addr);
    case kRcp: return alu_loop<kRcp, C>(done, lds_addr, bar_addr);
    case kWide: return alu_loop<kWide, C>(done, lds_addr, bar_addr);
    case kTryWait: return alu_loop<kTryWait, C>(done, lds_addr, bar_addr);
    case kHi: return alu_loop<kHi, C>(done, lds_addr, bar_addr);
    default: return alu_loop<kPtr, C>(done, lds_addr, bar_addr);
  }
}

template <int MATH>
__device__ __forceinline__ void math_loop(float (&s)[32], float (&o)[128], const uint32_t (&a)[4], uint32_t base, int wg,
                                          bool pipe) {
  if (pipe) {
    for (int it = 0; it < kIters; ++it) {
      math_iter<MATH>(s, o, a, base, wg);
      wgmma_wait<1>();
    }
  } else {
    for (int it = 0; it < kIters; ++it) {
      math_iter<MATH>(s, o, a, base, wg);
      wgmma_wait<0>();
    }
  }
  wgmma_wait<0>();
  fence_regs(s);
  fence_regs(o);
}

// The copier (one thread): 32-bit counters, slots and phases advanced without division (Session
// 48's copier computed a 64-bit remainder per copy, and those instructions, not the landing, cost
// the wgmmas). Returns the bytes landed by `done`.
__device__ long long copier(const uint8_t* src, const CUtensorMap* tmap, Setting st, uint32_t dst_base, uint64_t* bar,
                            volatile int* done) {
  const bool poll = st.inflight < 0;
  const uint32_t inflight = poll ? -st.inflight : st.inflight, unit = st.unit, slots = kSlots / st.unit;
  const uint8_t* region = src + (long long)blockIdx.x * kSrcChunks * kChunk;
  const uint32_t pages = st.copy == 2 ? kL2Pages : kDramPages;
  const uint64_t policy = st.copy >= 3 ? createpolicy_evict_first() : createpolicy_evict_normal();
  uint32_t issued = 0, landed = 0, islot = 0, lslot = 0, lphase = 0, box = 0, page = 0, chunk = 0;
  long long landed_at_done = -1;
  while (true) {
    if (landed_at_done < 0 && *done) landed_at_done = (long long)landed * unit * kChunk;
    if (landed_at_done >= 0 && landed == issued) break;
    if (landed_at_done < 0 && issued - landed < inflight) {
      const uint32_t b = smem_u32(&bar[islot]);
      mbar_arrive_expect_tx(b, unit * kChunk);
      for (uint32_t u = 0; u < unit; ++u) {
        const uint32_t dst = dst_base + (islot * unit + u) * kChunk;
        if (st.copy == 1) {
          bulk_load(dst, region + chunk * kChunk, kChunk, b);
          chunk = (chunk + 1) & (kSrcChunks - 1);
        } else {
          tma_load_3d(dst, tmap, b, (int)box * 64, 0, (int)(blockIdx.x * pages + page), policy);
          if (++box == 9) {
            box = 0;
            page = page + 1 == pages ? 0 : page + 1;
          }
        }
      }
      islot = islot + 1 == slots ? 0 : islot + 1;
      ++issued;
    } else {
      const uint32_t b = smem_u32(&bar[lslot]);
      if (poll) {
        // Polled with test_wait and a sleep instead of a suspending try_wait.
        uint32_t ok = 0;
        while (!ok) {
          asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                       : "=r"(ok) : "r"(b), "r"(lphase) : "memory");
          if (!ok) __nanosleep(256);
        }
      } else {
        mbar_wait(b, lphase);
      }
      if (++lslot == slots) {
        lslot = 0;
        lphase ^= 1;
      }
      ++landed;
    }
  }
  return landed_at_done;
}

// cyc[4 * cta + {0, 1}]: each warpgroup's cycles; + 2: bytes copied in the window; + 3: the
// instructions the alu warps issued, summed over them.
template <int MATH>
__global__ void __launch_bounds__(kThreads, 1) bench(const uint8_t* src, const __grid_constant__ CUtensorMap tmap,
                                                     Setting st, float* out, long long* cyc) {
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
  constexpr bool kMoreRegs = MATH == kQk2;
  if (warp >= 8) {
    if constexpr (kMoreRegs) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    if (st.alu) {
      if (warp - 8 >= st.alu_warps) return;
      // lds: each warp reads its own 4 KiB of the copy region (no copies run beside it).
      const uint32_t lds = base + kCopyBase + (warp - 8) * 4096 + (threadIdx.x & 31) * 16;
      // try_wait: an mbarrier of the copier's, idle beside the alu warps: its phase 0 never completes.
      const uint32_t idle_bar = smem_u32(&bar[kSlots - 1]);
      const long long n =
          st.chains == 1 ? alu_kind<1>(st.alu, &done, lds, idle_bar) : alu_kind<8>(st.alu, &done, lds, idle_bar);
      // Summed over the alu warps into a slot the host zeroed.
      if ((threadIdx.x & 31) == 0) atomicAdd(reinterpret_cast<unsigned long long*>(&cyc[4 * blockIdx.x + 3]), n);
      return;
    }
    if (threadIdx.x != 256 || !st.copy) return;  // the host zeroed the bytes slot
    const long long t0 = clock64();
    const long long bytes = copier(src, &tmap, st, base + (st.dst ? 72 * 1024 : kCopyBase), bar, &done);
    cyc[4 * blockIdx.x + 2] = bytes;
    if (MATH == kNone) cyc[4 * blockIdx.x] = clock64() - t0;
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
    if constexpr (kMoreRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    float s[32], o[128];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    const uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
    asm volatile("bar.sync 1, 256;" ::: "memory");
    const long long t0 = clock64();
    math_loop<MATH>(s, o, a, base, wg, st.pipe);
    const long long t1 = clock64();
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 0) done = 1;
    float x = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) x += s[i];
#pragma unroll
    for (int i = 0; i < 128; ++i) x += o[i];
    out[blockIdx.x * 256 + threadIdx.x] = x;
    if (threadIdx.x % 128 == 0) cyc[4 * blockIdx.x + wg] = t1 - t0;
  }
}


// One setting, printed; returns the cycles per iteration per SM (0 for copies alone or a failed
// launch). alone: the same math mode's cycles without copies or alu warps, which the cycles lost
// are against.
template <int MATH>
double run(int sms, const uint8_t* src, const CUtensorMap& tmap, Setting st, float* out, long long* cyc,
           double alone = 0) {
  auto k = bench<MATH>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  cudaError_t err = cudaSuccess;
  for (int rep = 0; rep < 2 && err == cudaSuccess; ++rep) {  // warm-up, then timed
    cudaMemset(cyc, 0, sizeof(long long) * 4 * sms);
    k<<<sms, kThreads, kSmemBytes>>>(src, tmap, st, out, cyc);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    cudaFuncAttributes fa = {};
    cudaFuncGetAttributes(&fa, k);
    printf("%s: %s (%d registers, at most %d threads)\n", kMathNames[MATH], cudaGetErrorString(err), fa.numRegs,
           fa.maxThreadsPerBlock);
    return 0;
  }
  long long h[4 * 132] = {};
  cudaMemcpy(h, cyc, sizeof(long long) * 4 * sms, cudaMemcpyDeviceToHost);
  // Mean over the CTAs of the slower warpgroup's cycles (copies alone: the copier's).
  double cyc_sum = 0, bytes_sum = 0, instr_sum = 0, worst = 0;
  for (int i = 0; i < sms; ++i) {
    const double c = MATH == kNone ? h[4 * i] : (h[4 * i] > h[4 * i + 1] ? h[4 * i] : h[4 * i + 1]);
    cyc_sum += c;
    bytes_sum += h[4 * i + 2];
    instr_sum += st.alu ? (double)h[4 * i + 3] / st.alu_warps : 0;
    worst = c > worst ? c : worst;
  }
  const double c = cyc_sum / sms, bpc = bytes_sum / sms / c;
  char tag[64];
  if (st.alu)
    snprintf(tag, sizeof tag, "%-10s x%d warps x%d chains%s", kAluNames[st.alu], st.alu_warps, st.chains,
             st.pipe ? " pipe" : "     ");
  else
    snprintf(tag, sizeof tag, "%-9s %2d x %d %s%s", kCopyNames[st.copy], st.inflight, st.unit,
             st.dst ? "read" : "sep ", st.pipe ? " pipe" : "     ");
  if (MATH == kNone) {
    printf("none  %s: %5.1f B/clk per SM\n", tag, bpc);
    return 0;
  }
  const double per_iter = c / kIters / 2;  // both warpgroups share the SM's tensor pipe
  const double gmma_wf = kGmmaWf[MATH], extra = alone > 0 ? per_iter - alone : 0.0;
  printf("%-5s %s: %7.1f cyc/iter/SM (ideal %4d, tensor %5.1f%%, worst CTA %5.1f%%), %+7.1f cyc/iter, ",
         kMathNames[MATH], tag, per_iter, kIdeal[MATH], 100.0 * kIdeal[MATH] / per_iter,
         100.0 * kIdeal[MATH] * kIters * 2 / worst, extra);
  if (st.alu) {
    // Instructions per alu warp per clock, and the tensor cycles lost per instruction each alu
    // warp issued (its sub-partition's share of the loss).
    const double instr = instr_sum / sms;
    printf("alu %5.3f instr/clk per warp, %5.3f cycles lost per instruction\n", instr / c,
           instr > 0 ? extra * kIters * 2 / instr : 0.0);
  } else {
    // Tensor cycles lost per 128-byte wavefront the copies wrote in the same time.
    const double written = bpc * per_iter / 128;
    printf("copies %5.1f B/clk, gmma %4.2f + copy %4.2f = %4.2f wf/clk, %5.2f lost per wf written\n", bpc,
           gmma_wf / per_iter, bpc / 128, gmma_wf / per_iter + bpc / 128, written > 0 ? extra / written : 0.0);
  }
  return per_iter;
}

// Per math mode and drain style: alone, then the copy settings (kind, in flight, unit, dst).
template <int MATH>
void sweep_copies(int sms, const uint8_t* src, const CUtensorMap (&tmaps)[2], float* out, long long* cyc) {
  const Setting settings[] = {{3, 9, 1, 0, 0}, {3, 9, 1, 1, 0}, {3, 1, 9, 0, 0}, {3, -9, 1, 0, 0},
                              {2, 9, 1, 0, 0}, {1, 9, 1, 0, 0}, {1, 9, 1, 1, 0}};
  for (int pipe = 0; pipe <= 1; ++pipe) {
    const double alone = run<MATH>(sms, src, tmaps[0], {0, 1, 1, 0, pipe}, out, cyc);
    for (Setting st : settings) {
      st.pipe = pipe;
      run<MATH>(sms, src, tmaps[st.copy == 4], st, out, cyc, alone);
    }
  }
}

// Pipelined math beside alu warps: every instruction kind, 1 or 8 chains (a dependent chain
// issues once per latency; 8 chains as fast as the pipe takes them), 1 warp (sub-partition 0) or
// 4 (one per sub-partition).
template <int MATH>
void sweep_alu(int sms, const uint8_t* src, const CUtensorMap (&tmaps)[2], float* out, long long* cyc) {
  const double alone = run<MATH>(sms, src, tmaps[0], {0, 1, 1, 0, 1}, out, cyc);
  for (int kind = 1; kind < kAluKinds; ++kind)
    for (int warps : {1, 4})
      for (int chains : {1, 8}) run<MATH>(sms, src, tmaps[0], {0, 1, 1, 0, 1, kind, warps, chains}, out, cyc, alone);
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
  cudaMalloc(&cyc, sizeof(long long) * 4 * 132);
  for (int copy = 1; copy <= 4; ++copy) {
    for (int inflight : {1, 2, 4, 9, -9}) run<kNone>(sms, src, tmaps[copy == 4], {copy, inflight, 1, 0, 0}, out, cyc);
    run<kNone>(sms, src, tmaps[copy == 4], {copy, 1, 9, 0, 0}, out, cyc);
  }
  sweep_copies<kQk>(sms, src, tmaps, out, cyc);
  sweep_copies<kPvRs>(sms, src, tmaps, out, cyc);
  sweep_copies<kPvSs>(sms, src, tmaps, out, cyc);
  sweep_copies<kPair>(sms, src, tmaps, out, cyc);
  sweep_alu<kPair>(sms, src, tmaps, out, cyc);
  sweep_alu<kQk>(sms, src, tmaps, out, cyc);
  sweep_alu<kQk2>(sms, src, tmaps, out, cyc);
  sweep_alu<kPvRs>(sms, src, tmaps, out, cyc);
  sweep_alu<kPvSs>(sms, src, tmaps, out, cyc);
  return 0;
}
