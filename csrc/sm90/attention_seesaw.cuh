// Split-KV MLA attention for sm_90a, "seesaw" schedule: two math warpgroups, TMA, wgmma.
//
// Work: as the plan assigns (units = 64 rows of (query token x head) of one request, each over a
// run of 64-token KV blocks; see plan.cuh). Per pair of KV blocks (b, b+1):
//   WG0 owns block b:   S0 = Q K_b^T (64x64, m64n64k16 x 36), softmax, O_L += P0 V_b,L (registers)
//   WG1 owns block b+1: S1 = Q K_b+1^T, softmax (after WG0's max), O_R += P1 V_b+1,R (registers)
//   then the exchange:  O_L += P1 V_b+1,L (P1 via smem), O_R += P0 V_b,R (P0 via smem)
// WG w holds output columns [256w, 256w+256) (64x256 fp32 = 128 registers/thread). One warpgroup's
// softmax runs while the other's wgmmas keep the tensor cores busy. The running max is shared in
// smem; WG0 hands its P over as it is (relative to its max m0) and WG1 rescales it to its own new
// max m1 (P0' = P0 * scale1) in the rare pair where block b+1 moved the lazy max, so both halves
// end each pair relative to the same max m1.
//
// KV tiles arrive by TMA in two halves (boxes 0-3 = V_L; boxes 4-8 = V_R + rope), one mbarrier per
// 8 KB box so QK^T starts on the first box that lands, and a half is refilled with block b+2 / b+3
// as soon as its last reader is done.
#pragma once
#include <cuda_bf16.h>

#include <type_traits>

#include "../common/device_utils.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "../common/probe.h"
#include "../common/units.cuh"
#include "../config.h"
#include "epilogue.cuh"
#include "tile_utils.cuh"
#include "smem_size.h"
#include "tma.cuh"
#include "wgmma.cuh"

namespace jit_mla::sm90 {

// Hand-offs between the warpgroups: mbarriers in smem (ss.hand), 128 arrivals each (every thread
// of the producing warpgroup, release), waited on by the other warpgroup (acquire). Each completes
// exactly once per block pair, so its phase parity is the pair count's. Not named barriers with
// bar.arrive on the producer side: compute-sanitizer racecheck does not see bar.arrive as ordering
// and reports every hand-off as a hazard, and bar.sync on both sides would make the producer wait.
constexpr int kHandScale0 = 0;  // WG0 -> WG1: m0 and scale0 published
constexpr int kHandScale1 = 1;  // WG1 -> WG0: m1 and scale1 published
constexpr int kHandP1 = 2;      // WG1 -> WG0: P1 in sP1
constexpr int kHandP0 = 3;      // WG0 -> WG1: P0 (relative to m0) in box 8 of block b's stage
constexpr int kNumHand = 4;
static_assert(sizeof(SeesawSmem::hand) / sizeof(uint64_t) == kNumHand, "one mbarrier per hand-off");
// Named barrier (id 0 is __syncthreads): +wg, 128 threads, one warpgroup's smem stores before its
// own wgmma reads them.
constexpr int kBarWg = 1;

constexpr bool kProbeNoLoads = (kProbe & 1) != 0;
constexpr bool kProbeNoSoftmax = (kProbe & 2) != 0;

// Wait for a TMA box to land (a no-op in the no-loads probe); the wait probe files its cycles
// under `site`.
__device__ __forceinline__ void kv_wait(uint32_t bar, uint32_t parity, int site) {
  if constexpr (!kProbeNoLoads) {
    const long long t0 = probe_clock();
    mbar_wait(bar, parity);
    probe_file(site, t0);
  }
}

// Wait for the other warpgroup's hand-off.
__device__ __forceinline__ void hand_wait(uint32_t bar, uint32_t parity) {
  const long long t0 = probe_clock();
  mbar_wait(bar, parity);
  probe_file(kSiteHand, t0);
}

// Wait until at most N of this warpgroup's wgmma groups are in flight.
template <int N>
__device__ __forceinline__ void mma_wait() {
  const long long t0 = probe_clock();
  wgmma_wait<N>();
  probe_file(kSiteMma, t0);
}

// A running max that is finite: fully masked rows stay at it and give 2^(-inf - m) = 0 with
// scale 2^(m - m) = 1, never NaN.
constexpr float kMaxInit = -1e30f;

// The running max only moves when a block's max exceeds it by more than kLazyMax (log2 domain):
// P = 2^(s - m) then stays <= 2^kLazyMax (exact in fp32, and in bf16 as relative precision),
// and O and the row sums are rescaled (128 multiplies per thread) only on those rare steps, not
// every time a row's max grows a little. The result is the same: O and l share the stale max.
constexpr float kLazyMax = 8.f;
__device__ __forceinline__ float lazy_max(float m_old, float blk_max) {
  return blk_max > m_old + kLazyMax ? blk_max : m_old;
}

// Page id of TMA chunk `chunk` (box_rows tokens) of KV block `block`, or num_pages for chunks past
// the request: out of bounds, so the TMA writes zeros. Rows past kv_len inside the last page are
// zeroed later (zero_v_tail).
__device__ __forceinline__ int chunk_page(const MlaParams& p, const int* bt_row, int block, int chunk,
                                          int kv_len) {
  const int tok = block * kBlockN + chunk * p.kv_box_rows;
  // The byte offset in 32 bits (TMA pages hold >= 8 tokens: index < 2^28): bt_row + index would
  // be an IMAD.WIDE, ~15 cycles off the other warpgroup's running wgmmas (smem_share.cu).
  const uint32_t off = static_cast<uint32_t>(fast_div_pow2(tok, p.page_div)) << 2;
  return tok < kv_len ? __ldg(reinterpret_cast<const int*>(reinterpret_cast<const char*>(bt_row) + off)) : p.num_pages;
}

// Warp-collective: one half of KV block `block` -> a stage, by TMA. Half 0: boxes 0-3 (V columns
// 0-255); half 1: boxes 4-8 (V columns 256-511 and the rope part). Box bx completes on mbarrier
// bars + 8 bx. Lane lane0 + c issues chunk c with the page id it holds in `page` (loaded long
// before, so no lane waits on the block table here: the next wgmma of the warpgroup would wait).
// kReread: the KV at L2's normal priority (see attention_seesaw; the narrow kernels never).
template <bool kReread = false>
__device__ __forceinline__ void issue_kv_half(const MlaParams& p, uint32_t stage, uint32_t bars, int block,
                                              int half, int page, int lane0) {
  if constexpr (kProbeNoLoads) return;
  const int lane = threadIdx.x & 31, box0 = half == 0 ? 0 : 4, nbox = half == 0 ? 4 : 5;
  const int c = lane - lane0;
  if (lane == 0)
    for (int bx = box0; bx < box0 + nbox; ++bx) mbar_arrive_expect_tx(bars + 8 * bx, kBoxBytes);
  // kv_box_rows is 8, 16, 32 or 64: chunks per block by a shift, not a division.
  if (c >= 0 && c < (kBlockN >> (31 - __clz(p.kv_box_rows)))) {
    const int r0 = c * p.kv_box_rows;
    const int row = fast_mod_pow2(block * kBlockN + r0, p.page_div);
    // KV is read by the m_group CTAs of a set close together in time and, but for kReread,
    // never again in this call: evict-first keeps Q, the block tables and the partner's
    // lines in L2 (measured: B64 kv8192 H16 202 -> 191 µs, B8 kv4096 H128 52 -> 49 µs).
    const uint64_t policy = kReread ? createpolicy_evict_normal() : createpolicy_evict_first();
    for (int bx = box0; bx < box0 + nbox; ++bx)
      tma_load_3d(stage + bx * kBoxBytes + r0 * 128, &p.kv_tmap, bars + 8 * bx, bx * kBoxCols, row, page, policy);
  }
}

// Wait for boxes [b0, b1) of a stage (their mbarriers at bars + 8 bx).
__device__ __forceinline__ void kv_wait_boxes(uint32_t bars, int b0, int b1, uint32_t parity) {
  for (int bx = b0; bx < b1; ++bx) kv_wait(bars + 8 * bx, parity, kSiteVBox);
}

// Zero V rows [first_row, 64) of this warpgroup's four V boxes (4wg .. 4wg+3) of a stage: a page's
// rows past kv_len hold anything (NaN included), and P = 0 there does not cancel 0 * NaN.
__device__ __forceinline__ void zero_v_tail(uint8_t* stage, int first_row, int wg) {
  const int tw = threadIdx.x & 127;
  const int n = (kBlockN - first_row) * 4 * 8;  // 16-byte chunks
  for (int i = tw; i < n; i += 128) {
    const int r = first_row + i / 32, bx = 4 * wg + (i / 8) % 4, c = i % 8;
    *reinterpret_cast<uint4*>(stage + bx * kBoxBytes + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_smem();
  named_barrier_sync(kBarWg + wg, 128);
}

// S (+)= Q K^T over boxes [kB0, kB1) of one 64-token block (4 k-steps of 16 columns per box),
// waiting for each box as it is needed. kFirst: the first k-step overwrites S.
template <int kB0, int kB1, bool kFirst>
__device__ __forceinline__ void qk_boxes(float (&s)[32], uint32_t sQ, uint32_t stage, uint32_t bars,
                                         uint32_t parity) {
  const uint64_t dq = make_smem_desc(sQ, 16, 1024), dk = make_smem_desc(stage, 16, 1024);
#pragma unroll
  for (int bx = kB0; bx < kB1; ++bx) {
    kv_wait(bars + 8 * bx, parity, kSiteQkBox);
#pragma unroll
    for (int kk = 4 * bx; kk < 4 * bx + 4; ++kk) {
      const uint32_t koff = (kk / 4) * kBoxBytes + (kk % 4) * 32;
      wgmma_m64n64k16_ss(s, desc_add(dq, koff), desc_add(dk, koff), kFirst && kk == 4 * kB0 ? 0 : 1);
    }
  }
}

// S = Q K^T for one 64-token block: (64 x 64) fp32. kHalf1First: start on half 1 (boxes 4-8).
// Each warpgroup starts on the half it refilled itself, which was issued first.
template <bool kHalf1First>
__device__ __forceinline__ void qk_block(float (&s)[32], uint32_t sQ, uint32_t stage, uint32_t bars,
                                         uint32_t parity) {
  wgmma_fence();
  if (kHalf1First) {
    qk_boxes<4, kNumBoxesQK, true>(s, sQ, stage, bars, parity);
    qk_boxes<0, 4, false>(s, sQ, stage, bars, parity);
  } else {
    qk_boxes<0, kNumBoxesQK, true>(s, sQ, stage, bars, parity);
  }
  wgmma_commit();
  mma_wait<0>();
  fence_regs(s);
}

// Accumulator layout (m64nN, per warpgroup): thread (warp wq, lane) holds rows r_a = 16 wq + lane/4
// and r_b = r_a + 8; element 4t+e is column 8t + 2(lane%4) + (e&1), row r_a for e < 2, r_b else.
struct Rows {
  int r_a, r_b, q4;
};

// A warpgroup's new running max of rows r_a, r_b and the factor that rescales the old one, into
// smem (lane 0 of each quad writes), then its arrival on hand-off mbarrier `hand`.
__device__ __forceinline__ void publish_max(float* m, float* scale, const Rows& rw, float m_a, float m_b,
                                            float sc_a, float sc_b, uint32_t hand) {
  __syncwarp();  // every lane of the quad has read m before lane 0 overwrites it
  if (rw.q4 == 0) {
    m[rw.r_a] = m_a; m[rw.r_b] = m_b;
    scale[rw.r_a] = sc_a; scale[rw.r_b] = sc_b;
  }
  mbar_arrive(hand);
}

// Two rows' eight values each (ra, rb) combined with op as trees of depth 3, results in ra[0],
// rb[0]: independent instructions the scheduler can overlap, not a chain of 7 dependent ones.
template <class Op>
__device__ __forceinline__ void tree_reduce8(float (&ra)[8], float (&rb)[8], Op op) {
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int t = 0; t < w; ++t) {
      ra[t] = op(ra[t], ra[t + w]);
      rb[t] = op(rb[t], rb[t + w]);
    }
}

// The rows' maxima of S in the log2 domain (over the quad), masking tokens at or past each row's
// limit to -inf. S stays unscaled unless ps (p_exp_scale) is not the call's scale, then it is
// scaled here; exp_rows applies ps in its FFMA (32 FMULs per block fewer than scaling S).
// Only blocks that reach a limit pay for the mask: a thread's two rows need none when the whole
// block [blk0, blk0 + 64) lies below both limits.
// kMaybeMask false: the caller knows the block lies below both limits (a steady pair).
template <bool kMaybeMask = true>
__device__ __forceinline__ void block_max(float (&s)[32], int blk0, int q4, int lim_a, int lim_b,
                                          float scale_log2, float ps, float& mx_a, float& mx_b) {
  if constexpr (kProbeNoSoftmax) {
    mx_a = mx_b = 0.f;
    return;
  }
  if (ps != scale_log2) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] *= scale_log2;
  }
  if (kMaybeMask && blk0 + kBlockN > min(lim_a, lim_b)) {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = blk0 + 2 * q4 + 8 * t + (e & 1);
        float& x = s[4 * t + e];
        x = tok < (e < 2 ? lim_a : lim_b) ? x : -INFINITY;
      }
    }
  }
  // Row maxima as trees (depth 4, not a chain of 16 dependent max instructions).
  float ra[8], rb[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    ra[t] = fmaxf(s[4 * t + 0], s[4 * t + 1]);
    rb[t] = fmaxf(s[4 * t + 2], s[4 * t + 3]);
  }
  tree_reduce8(ra, rb, [](float x, float y) { return fmaxf(x, y); });
  mx_a = ra[0] * ps;
  mx_b = rb[0] * ps;
  // The shuffles stay outside the branch: lanes of one warp may take different sides of it.
  mx_a = quad_max(mx_a);
  mx_b = quad_max(mx_b);
}

// P = 2^(s ps - m) in place (one FFMA and one MUFU each); returns this thread's row sums.
__device__ __forceinline__ void exp_rows(float (&s)[32], float ps, float m_a, float m_b, float& sum_a, float& sum_b) {
  if constexpr (kProbeNoSoftmax) {
    sum_a = sum_b = 1.f;
    return;
  }
  float ra[8], rb[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    s[4 * t + 0] = exp2_approx(fmaf(s[4 * t + 0], ps, -m_a));
    s[4 * t + 1] = exp2_approx(fmaf(s[4 * t + 1], ps, -m_a));
    s[4 * t + 2] = exp2_approx(fmaf(s[4 * t + 2], ps, -m_b));
    s[4 * t + 3] = exp2_approx(fmaf(s[4 * t + 3], ps, -m_b));
    ra[t] = s[4 * t + 0] + s[4 * t + 1];
    rb[t] = s[4 * t + 2] + s[4 * t + 3];
  }
  // Sums as trees (depth 3 after the pairs, not a chain of 16 dependent adds).
  tree_reduce8(ra, rb, [](float x, float y) { return x + y; });
  sum_a = ra[0];
  sum_b = rb[0];
}

// P (fp32 accumulator layout) -> bf16 pairs, once for both of its uses (PV from registers and
// the copy in shared memory for the other warpgroup): pk[2 t] holds row r_a's tokens 8 t + 2 q4
// + {0, 1}, pk[2 t + 1] row r_b's. pk[4 kk .. 4 kk + 3] is the A fragment of PV's k-step kk.
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&pk)[16]) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    pk[2 * t] = pack_bf16x2(s[4 * t], s[4 * t + 1]);
    pk[2 * t + 1] = pack_bf16x2(s[4 * t + 2], s[4 * t + 3]);
  }
}

// A P box's address of this thread's first word (row r_a, chunk 0; the box is 1024-byte aligned,
// as every box): chunk t of row r sits at r * 128 + ((t ^ (r & 7)) << 4), so with r_a & 7 in bits
// 4-6 chunk t of row r_a is this base XOR (t << 4), and of row r_b = r_a + 8 1024 bytes past it.
__device__ __forceinline__ uint32_t p_box_base(const uint8_t* box, const Rows& rw) {
  return smem_u32(box) + swizzled(rw.r_a, 0) + 4 * rw.q4;
}

// Rows r and r + 8 of chunk (base's bits 4-6) ^ T of a swizzled box, see store_p.
template <int T>
__device__ __forceinline__ void store_p_chunk(uint32_t base, uint32_t v_a, uint32_t v_b) {
  asm volatile("{\n .reg .b32 a;\n xor.b32 a, %0, %1;\n st.shared.b32 [a], %2;\n st.shared.b32 [a+1024], %3;\n}\n"
               ::"r"(base), "n"(T << 4), "r"(v_a), "r"(v_b) : "memory");
}

// Packed P -> a 128B-swizzled (64, 64) box. Each store's address is p_box_base XOR (t << 4), one
// instruction into a register used once, not eight addresses computed ahead beside O, S and P.
__device__ __forceinline__ void store_p(uint8_t* box, const uint32_t (&pk)[16], const Rows& rw) {
  const uint32_t base = p_box_base(box, rw);
  store_p_chunk<0>(base, pk[0], pk[1]);
  store_p_chunk<1>(base, pk[2], pk[3]);
  store_p_chunk<2>(base, pk[4], pk[5]);
  store_p_chunk<3>(base, pk[6], pk[7]);
  store_p_chunk<4>(base, pk[8], pk[9]);
  store_p_chunk<5>(base, pk[10], pk[11]);
  store_p_chunk<6>(base, pk[12], pk[13]);
  store_p_chunk<7>(base, pk[14], pk[15]);
}

// The packed P of this thread's rows in a swizzled (64, 64) box (as store_p wrote them) *= per-row
// factors, rounded to bf16 again; false (nothing written) when they are 1 for the whole warp. A
// rare step (a block moved the lazy max), so a rolled loop: no registers held beside O and P1.
__device__ __forceinline__ bool scale_p_box(uint8_t* box, const Rows& rw, float f_a, float f_b) {
  if (!__any_sync(0xffffffffu, f_a != 1.f || f_b != 1.f)) return false;
  const uint32_t base = p_box_base(box, rw);
#pragma unroll 1
  for (int t = 0; t < 8; ++t) {
    const uint32_t a = base ^ (t << 4);
    uint32_t x_a, x_b;
    asm volatile("ld.shared.b32 %0, [%2];\n ld.shared.b32 %1, [%2+1024];\n" : "=r"(x_a), "=r"(x_b) : "r"(a) : "memory");
    x_a = pack_bf16x2(__uint_as_float(x_a << 16) * f_a, __uint_as_float(x_a & 0xffff0000u) * f_a);
    x_b = pack_bf16x2(__uint_as_float(x_b << 16) * f_b, __uint_as_float(x_b & 0xffff0000u) * f_b);
    asm volatile("st.shared.b32 [%0], %1;\n st.shared.b32 [%0+1024], %2;\n" ::"r"(a), "r"(x_a), "r"(x_b) : "memory");
  }
  return true;
}

// O *= per-row factors; skipped when they are 1 for the whole warp (the running max did not grow
// in any of its rows, the common case once a request's first blocks are done): exact either way.
__device__ __forceinline__ void scale_o(float (&o)[128], float f_a, float f_b) {
  if (!__any_sync(0xffffffffu, f_a != 1.f || f_b != 1.f)) return;
#pragma unroll
  for (int t = 0; t < 32; ++t) {
    o[4 * t + 0] *= f_a; o[4 * t + 1] *= f_a;
    o[4 * t + 2] *= f_b; o[4 * t + 3] *= f_b;
  }
}

// O_half += P V_half with P from registers: the m64n64 accumulator fragment of 16 columns is
// exactly the A fragment of one k16 step (pack_p). v_boxes: shared address of this half's first V box.
__device__ __forceinline__ void pv_rs(float (&o)[128], const uint32_t (&pk)[16], uint32_t v_boxes) {
  const uint64_t dv = make_smem_desc(v_boxes, kBoxBytes, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_rs_tnspb(o, reinterpret_cast<const uint32_t(&)[4]>(pk[4 * kk]), desc_add(dv, kk * 16 * 128), 1);
  wgmma_commit();
}

// O_half += P V_half with P from a swizzled (64, 64) smem box.
__device__ __forceinline__ void pv_ss(float (&o)[128], uint32_t p_box, uint32_t v_boxes) {
  const uint64_t dp = make_smem_desc(p_box, 16, 1024), dv = make_smem_desc(v_boxes, kBoxBytes, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_ss_tnspb(o, desc_add(dp, kk * 32), desc_add(dv, kk * 16 * 128), 1);
  wgmma_commit();
}

// kReread: a request has more rows than the whole grid holds at once (a chunked prefill), so
// the CTA sets come back to its KV unit after unit: loaded at L2's normal priority, not
// evict-first, it stays in L2 between them (4 x 2048 query tokens on 8192 KV tokens, H 128:
// 5.5% faster; a run-time choice of the policy cost decode rows ~0.8%, hence a template).
// kSteadyBody: the steady pair body below is compiled in. Without it (the _short twin, for calls
// with few blocks per CTA) every pair runs the general body: at B8 kv4096 H128 (~4 pairs per
// CTA) the second body's code cost more than it saved (instruction fetch: ncu's no_instruction
// stall 5.9 against 4.8 cycles per issued instruction, Session 22, caches flushed between
// launches; 33.4 against 31.9 µs), also when it was compiled in but not run, while B128 runs 5%
// faster with it.
template <bool kReread, bool kSteadyBody = true>
__device__ bool attention_seesaw(const MlaParams& p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  SeesawSmem& ss = *reinterpret_cast<SeesawSmem*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  const uint32_t sQ = smem_u32(ss.q), sP1 = smem_u32(ss.p1);
  const uint32_t sKV[2] = {smem_u32(ss.kv[0]), smem_u32(ss.kv[1])};
  const uint32_t bars[2] = {smem_u32(&ss.bar[0][0]), smem_u32(&ss.bar[1][0])};  // box bx: + 8 bx
  const uint32_t hand0 = smem_u32(&ss.hand[0]);  // hand-off i: hand0 + 8 i

  const int tid = threadIdx.x, tw = tid % 128, lane = tid & 31;
  // Broadcast from lane 0 so the compiler sees a warp-uniform value: wgmma under a branch on it
  // is then not serialized (C7520).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const Rows rw{16 * (tw / 32) + lane / 4, 16 * (tw / 32) + lane / 4 + 8, lane & 3};

  if (tid == 0) {
    for (int st = 0; st < 2; ++st)
      for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_init(bars[st] + 8 * bx, 1);
    for (int i = 0; i < kNumHand; ++i) mbar_init(hand0 + 8 * i, kNumThreads / kNumWarpgroups);
    fence_mbar_init();
  }
  __syncthreads();

  const CtaRange cr = start_cta<kNumThreads>(p);
  if (cr.group0 == cr.group_end) return cr.planned;

  const auto [scale_log2, bmm2] = call_scales(p);
  const float ps = p_exp_scale(scale_log2);
  uint32_t loads[2] = {0, 0};  // blocks loaded into each stage so far: the mbarrier phase count
  uint32_t pairs = 0;          // block pairs done so far: the hand-offs' phase count

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    const long long t_unit = probe_clock();
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1, kv_len = unit.kv_len;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;
    const int lim_a = unit_row_limit(p, unit, rw.r_a), lim_b = unit_row_limit(p, unit, rw.r_b);

    // ---- prologue: Q by cp.async, first two blocks by TMA, running max reset ----------------
    // Q first, from every warp: the first QK^T needs all of Q but only its block's boxes one by
    // one, so Q must not queue behind 144 KB of KV (warp 0 would otherwise send its part of Q
    // after the TMA, which waits on the block table). Warp 0's page loads go out before it.
    // Lanes 0-7 hold block kb0's chunk pages, lanes 8-15 block kb0+1's.
    const int first_pages =
        tid < 16 && kb0 < kb1 ? chunk_page(p, bt_row, kb0 + (lane >> 3), lane & 7, kv_len) : p.num_pages;
    if (kb0 < kb1) load_q_tile(sQ, p, unit.q_row_base, unit.rows);
    cp_async_commit();
    if (tid < 32 && kb0 < kb1) {
      issue_kv_half<kReread>(p, sKV[0], bars[0], kb0, 0, first_pages, 0);
      issue_kv_half<kReread>(p, sKV[0], bars[0], kb0, 1, first_pages, 0);
      if (kb0 + 1 < kb1) {
        issue_kv_half<kReread>(p, sKV[1], bars[1], kb0 + 1, 1, first_pages, 8);
        issue_kv_half<kReread>(p, sKV[1], bars[1], kb0 + 1, 0, first_pages, 8);
      }
    }
    if (tid < kBlockM) ss.m[tid] = kMaxInit;
    cp_async_wait_all();
    fence_proxy_async_smem();
    __syncthreads();

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float l_a = 0.f, l_b = 0.f;  // this thread's row sums of its own blocks' P
    float s[32];
    if (kb0 < kb1) {
      if (wg == 0) qk_block<false>(s, sQ, sKV[0], bars[0], loads[0] & 1);
      else if (kb0 + 1 < kb1) qk_block<true>(s, sQ, sKV[1], bars[1], loads[1] & 1);
    }

    probe_file(kSiteProlog, t_unit);
    const long long t_loop = probe_clock();
    // One block pair. kSteady: a pair with blocks kb + 2 and kb + 3 after it, whose rows see
    // every token of kb and kb + 1 (no mask, no V tail): its own instantiation, without the
    // tail's branches, so that the loop that runs most pairs is small (FlashMLA's hot loops are
    // about a third of this kernel's; docs/notes-flashmla.md item 5).
    auto run_pair = [&](const int kb, auto steady) {
      probe_count(kSitePairs);
      tl_mark(kTlPairStart, pairs);
      constexpr bool kSteady = decltype(steady)::value;
      const bool has1 = kSteady || kb + 1 < kb1, has2 = kSteady || kb + 2 < kb1, has3 = kSteady || kb + 3 < kb1;
      const uint32_t par0 = loads[0] & 1, par1 = loads[1] & 1, hpar = pairs & 1;
      // Warp 0 of each warpgroup issues this pair's refills: lanes 0-7 hold block kb+2's chunk
      // pages, lanes 8-15 block kb+3's; loaded now, used after a softmax and a PV.
      int page = p.num_pages;
      if (tw < 16 && has2) page = chunk_page(p, bt_row, kb + 2 + (lane >> 3), lane & 7, kv_len);
      if (wg == 0) {
        // ---- block kb: softmax against the running max m, O_L += P0 V_L -------------------
        float mx_a, mx_b;
        block_max<!kSteady>(s, kb * kBlockN, rw.q4, lim_a, lim_b, scale_log2, ps, mx_a, mx_b);
        const float mp_a = ss.m[rw.r_a], mp_b = ss.m[rw.r_b];
        const float m0_a = lazy_max(mp_a, mx_a), m0_b = lazy_max(mp_b, mx_b);
        const float sc0_a = exp2_approx(mp_a - m0_a), sc0_b = exp2_approx(mp_b - m0_b);
        // WG1's softmax needs only m0: publish it before the exps.
        publish_max(ss.m, ss.scale0, rw, m0_a, m0_b, sc0_a, sc0_b, hand0 + 8 * kHandScale0);
        tl_mark(kTlMaxDone, pairs);
        float sum_a, sum_b;
        exp_rows(s, ps, m0_a, m0_b, sum_a, sum_b);
        uint32_t pk[16];
        pack_p(s, pk);
        tl_mark(kTlExpDone, pairs);
        l_a = l_a * sc0_a + sum_a;
        l_b = l_b * sc0_b + sum_b;
        scale_o(o, sc0_a, sc0_b);
        if (!kSteady && (kb + 1) * kBlockN > kv_len) zero_v_tail(ss.kv[0], kv_len - kb * kBlockN, 0);
        // P0 (relative to m0) to WG1 now, into block b's rope box (its QK^T is done): WG1
        // rescales it to m1 itself in the rare pair whose block b+1 moved the lazy max, so this
        // hand-off does not wait for WG1's softmax. Stored before the RS PV that takes pk as its
        // A fragment: PTX leaves any access to those registers undefined until the wgmma is
        // waited for (reads included).
        store_p(ss.kv[0] + 8 * kBoxBytes, pk, rw);
        pv_rs(o, pk, sKV[0]);
        tl_mark(kTlPv1Issued, pairs);
        fence_proxy_async_smem();
        mbar_arrive(hand0 + 8 * kHandP0);
        tl_mark(kTlPStored, pairs);
        // V_L(b) has no reader after this PV: refill it with block b+2 now, not after WG1's
        // softmax (the wait below would wait for this PV anyway).
        mma_wait<0>();
        fence_regs(o);
        tl_mark(kTlPv1Done, pairs);
        if (has2 && tw < 32) issue_kv_half<kReread>(p, sKV[0], bars[0], kb + 2, 0, page, 0);
        tl_mark(kTlLoadsIssued, pairs);

        // ---- WG1's max is in: rescale O_L to it, O_L += P1 V_L(b+1) -------------------------
        hand_wait(hand0 + 8 * kHandScale1, hpar);
        tl_mark(kTlScaleGot, pairs);
        const float sc1_a = ss.scale1[rw.r_a], sc1_b = ss.scale1[rw.r_b];
        scale_o(o, sc1_a, sc1_b);
        l_a *= sc1_a;
        l_b *= sc1_b;
        // Every phase of a hand-off is waited for, P1 or not (synccheck: "missing wait").
        if (has1) {
          kv_wait_boxes(bars[1], 0, 4, par1);
          tl_mark(kTlVReady, pairs);
          if (!kSteady && (kb + 2) * kBlockN > kv_len) zero_v_tail(ss.kv[1], kv_len - (kb + 1) * kBlockN, 0);
          hand_wait(hand0 + 8 * kHandP1, hpar);
          tl_mark(kTlPGot, pairs);
          pv_ss(o, sP1, sKV[1]);
          tl_mark(kTlPv2Issued, pairs);
        } else {
          hand_wait(hand0 + 8 * kHandP1, hpar);
        }
        // QK^T of block b+2 queues right behind that PV; V_L(b+1) is refilled with b+3 as soon as
        // the PV is done (wait<1>: only the QK^T group of boxes 0-3 may still run).
        if (has2) {
          wgmma_fence();
          qk_boxes<0, 4, true>(s, sQ, sKV[0], bars[0], par0 ^ 1);
          wgmma_commit();
          tl_mark(kTlQkHalfIssued, pairs);
          if (has1) {
            mma_wait<1>();
            tl_mark(kTlPv2Done, pairs);
            if (has3 && tw < 32) issue_kv_half<kReread>(p, sKV[1], bars[1], kb + 3, 0, page, 8);
          }
          qk_boxes<4, kNumBoxesQK, false>(s, sQ, sKV[0], bars[0], par0 ^ 1);
          wgmma_commit();
          tl_mark(kTlQkIssued, pairs);
        }
        mma_wait<0>();
        fence_regs(o);
        fence_regs(s);
        tl_mark(kTlQkDone, pairs);
      } else {
        uint32_t pk[16];  // P1, packed once for sP1 and this warpgroup's PV
        // ---- block kb+1: its max first (WG0 needs only that), then P1 and O_R += P1 V_R ----
        hand_wait(hand0 + 8 * kHandScale0, hpar);
        tl_mark(kTlScaleGot, pairs);
        const float m0_a = ss.m[rw.r_a], m0_b = ss.m[rw.r_b];
        const float sc0_a = ss.scale0[rw.r_a], sc0_b = ss.scale0[rw.r_b];
        float m1_a = m0_a, m1_b = m0_b, sc1_a = 1.f, sc1_b = 1.f;
        if (has1) {
          float mx_a, mx_b;
          block_max<!kSteady>(s, (kb + 1) * kBlockN, rw.q4, lim_a, lim_b, scale_log2, ps, mx_a, mx_b);
          m1_a = lazy_max(m0_a, mx_a);
          m1_b = lazy_max(m0_b, mx_b);
          sc1_a = exp2_approx(m0_a - m1_a);
          sc1_b = exp2_approx(m0_b - m1_b);
        }
        publish_max(ss.m, ss.scale1, rw, m1_a, m1_b, sc1_a, sc1_b, hand0 + 8 * kHandScale1);
        tl_mark(kTlMaxDone, pairs);
        if (has1) {
          float sum_a, sum_b;
          exp_rows(s, ps, m1_a, m1_b, sum_a, sum_b);
          l_a = l_a * sc0_a * sc1_a + sum_a;
          l_b = l_b * sc0_b * sc1_b + sum_b;
          pack_p(s, pk);
          store_p(ss.p1, pk, rw);
        } else {
          l_a *= sc0_a;
          l_b *= sc0_b;
        }
        tl_mark(kTlExpDone, pairs);
        scale_o(o, sc0_a * sc1_a, sc0_b * sc1_b);

        // ---- O_R += P1 V_R(b+1) (needs nothing from WG0), then O_R += P0' V_R(b) ------------
        if (has1) {
          if (!kSteady && (kb + 2) * kBlockN > kv_len) zero_v_tail(ss.kv[1], kv_len - (kb + 1) * kBlockN, 1);
          pv_rs(o, pk, sKV[1] + 4 * kBoxBytes);
          // P1's stores before WG0's SS PV reads them (the P1 hand-off, after this warpgroup's
          // SS PV): fenced after this PV's issue, not inside the softmax.
          fence_proxy_async_smem();
          tl_mark(kTlPv1Issued, pairs);
        }
        hand_wait(hand0 + 8 * kHandP0, hpar);
        tl_mark(kTlPGot, pairs);
        // P0 is relative to m0: P0' = P0 * scale1, in place. Each thread rescales the entries its
        // WG0 twin stored, so warp w writes exactly A rows 16w .. 16w+15 of the SS PV below, which
        // its own fence orders before its own part of that wgmma: no warpgroup barrier. (A named
        // barrier here, run by WG1 alone every pair, made racecheck report the epilogue's row
        // sums, which a __syncthreads orders: it pairs named-barrier instances by count,
        // docs/experiments/racecheck_repro.cu.)
        if (scale_p_box(ss.kv[0] + 8 * kBoxBytes, rw, sc1_a, sc1_b)) fence_proxy_async_smem();
        kv_wait_boxes(bars[0], 4, 8, par0);
        tl_mark(kTlVReady, pairs);
        if (!kSteady && (kb + 1) * kBlockN > kv_len) zero_v_tail(ss.kv[0], kv_len - kb * kBlockN, 1);
        pv_ss(o, sKV[0] + 8 * kBoxBytes, sKV[0] + 4 * kBoxBytes);
        tl_mark(kTlPv2Issued, pairs);
        // P1 handed to WG0 only now, every pair (the phase stays the pair count's): both of WG1's
        // PVs reach the tensor pipe before WG0's SS PV and next QK^T, as in FlashMLA, so V_R(b) is
        // refilled a PV earlier. Measured neutral (0.997-1.006, perf-notes Session 20).
        mbar_arrive(hand0 + 8 * kHandP1);
        if (has1) {
          mma_wait<1>();
          tl_mark(kTlPv1Done, pairs);
          if (has3 && tw < 32) issue_kv_half<kReread>(p, sKV[1], bars[1], kb + 3, 1, page, 8);
        }
        mma_wait<0>();
        fence_regs(o);
        tl_mark(kTlPv2Done, pairs);
        if (has2 && tw < 32) issue_kv_half<kReread>(p, sKV[0], bars[0], kb + 2, 1, page, 0);
        if (has3) qk_block<true>(s, sQ, sKV[1], bars[1], par1 ^ 1);
        tl_mark(kTlQkDone, pairs);
      }
      loads[0] += 1;
      loads[1] += has1 ? 1 : 0;
      pairs += 1;
    };
    // Pairs (kb, kb + 1) with kb + 3 < kb1 and (kb + 2) * 64 <= the unit's smallest row limit
    // (its first row's: a later token sees more; padding rows get the last row's) run steady;
    // the rest as before. Row limits never exceed kv_len (row_kv_limit clamps), so a steady
    // pair has no V tail to zero either.
    int kb = kb0;
    if constexpr (kSteadyBody) {
      const int lim_min = unit_row_limit(p, unit, 0);
      const int steady_end = min(kb1 - 3, lim_min / kBlockN - 1);  // steady: kb < steady_end
      for (; kb < steady_end; kb += 2) run_pair(kb, std::true_type{});
    }
    for (; kb < kb1; kb += 2) run_pair(kb, std::false_type{});

    probe_file(kSiteLoop, t_loop);
    // ---- epilogue: full row sums, normalize, write the output or this split's partial ------
    const long long t_epilog = probe_clock();
    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    if (rw.q4 == 0) {
      ss.row_sum[wg][rw.r_a] = l_a;
      ss.row_sum[wg][rw.r_b] = l_b;
    }
    __syncthreads();
    store_unit_result(p, w, partial_slot(p, cr.set, grp, cr.lane_m), wg, rw.r_a, rw.r_b, rw.q4, o,
                      ss.m[rw.r_a], ss.m[rw.r_b], ss.row_sum[0][rw.r_a] + ss.row_sum[1][rw.r_a],
                      ss.row_sum[0][rw.r_b] + ss.row_sum[1][rw.r_b], bmm2);
    // The next unit reuses sQ, the stages, m and row_sum: everyone must be past this one's reads.
    __syncthreads();
    probe_file(kSiteEpilog, t_epilog);
  }
  return cr.planned;
}

}  // namespace jit_mla::sm90
