// The wide fp8 kernel: units of 64 rows for an e4m3 query and an e4m3 cache (mode 2), in the
// narrow fp8 kernels' transposed tiles (attention_narrow_fp8.cuh: its header gives the fragment
// layouts and token permutations used here too). A request of more than 32 rows (H 64 / 128, MTP,
// ragged) ran as several 32-row units on the narrow kernels, each with its own softmax, P and
// barriers per KV block (ncu, perf-notes Session 10: latency-bound at H 128 on 2.2x the bf16
// kernel's instructions). Here one 64-row unit per CTA (H 128: CTA pairs, as the bf16 seesaw),
// and each block's softmax is done once:
//   - the two warpgroups take the unit's blocks in pairs: warpgroup w computes S^T = K Q^T of
//     block kb0 + 2k + w (m64n64k32 e4m3 wgmmas, both operands from shared memory) and its column
//     maxima; after a CTA barrier both know the pair's running max per row (the same value in
//     both: each reads all eight warps' maxima; lazy, see kWLazyMax);
//   - each writes its block's P (2^8 P in e4m3) to shared memory; after a second barrier both
//     run PV over both blocks of the pair: O^T = V^T P^T split by V columns, warpgroup w holding
//     columns [256 w, 256 w + 256) for all 64 rows (4 tiles of m64n64: 128 registers), A = V^T
//     from the stage by ldmatrix .trans + byte permutes, B = the block's P;
//   - the next pair's QK^T is issued right behind this pair's PV; a stage is refilled as soon as
//     all 256 threads have issued their PV reads of it (an mbarrier per stage, no third barrier).
// The running max, sums and O^T columns are disjoint or shared per row, so the unit ends without a
// merge of the two warpgroups' O: a row's sum is the two warpgroups' sums added.
// A bf16 query (!kQ8, mode 1) keeps bf16's precision with two e4m3 rows of the same scale for
// each of Q and P: S^T = K Q_hi^T + K Q_lo^T into the one accumulator (36 k-steps), O^T += V^T
// P_hi^T + V^T P_lo^T (two passes over the same V^T fragments); the tensor work of bf16, half its
// bytes. Its shared memory (WideFp8BSmem) puts P hi into its block's stage, so a stage is free
// only when the PV wgmmas reading it have retired, not when they are issued.
// TMA pages only (the launcher sends other page sizes to the narrow _fp8_any / _fp8q_any kernels).
// Tried and dropped (session 11): a seesaw schedule (each warpgroup's max handed to the other by
// mbarriers, no CTA barrier): 1.24x slower; ptxas needed more registers than there are for its
// rescale-between-PVs paths, and serialized the wgmmas (C7512) unless PV ran one tile per group.
#pragma once
#include <type_traits>

#include "attention_narrow_fp8.cuh"

namespace jit_mla::sm90 {

// The first k-step of S^T = K Q^T (m64n64k32 e4m3, both operands in shared memory): D = A B^T,
// D written only ("=f": the previous block's S^T is dead here, which frees its registers).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_ss_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
        "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
        "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}

// e4m3 Q rows [row_base, row_base + rows) -> sQ as 9 boxes of (64 rows, 64 bytes) in the 64B
// swizzle, rows past `rows` zero. All 256 threads, 16 bytes each step (consecutive threads take
// consecutive chunks of a row): kQ8Steps loads per thread into v first (the caller issues its TMA
// while they are in flight), then the stores.
constexpr int kQ8RowChunks = kHeadDimQK / 16;                    // 36
constexpr int kQ8Steps = kBlockM * kQ8RowChunks / kNumThreads;   // 9
static_assert(kQ8Steps * kNumThreads == kBlockM * kQ8RowChunks, "whole steps");
__device__ __forceinline__ void load_q_rows_wide(const MlaParams& p, long long row_base, int rows,
                                                 uint4 (&v)[kQ8Steps]) {
  const uint8_t* q = static_cast<const uint8_t*>(p.q);
#pragma unroll
  for (int s = 0; s < kQ8Steps; ++s) {
    const int i = threadIdx.x + s * kNumThreads, c = i / kQ8RowChunks, k = i % kQ8RowChunks;
    v[s] = c < rows ? __ldg(reinterpret_cast<const uint4*>(q + (row_base + c) * kHeadDimQK) + k)
                    : make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void store_q_rows_wide(uint8_t* sQ, const uint4 (&v)[kQ8Steps]) {
#pragma unroll
  for (int s = 0; s < kQ8Steps; ++s) {
    const int i = threadIdx.x + s * kNumThreads, c = i / kQ8RowChunks, k = i % kQ8RowChunks;  // box k / 4, chunk k % 4
    *reinterpret_cast<uint4*>(sQ + (k >> 2) * kFp8BoxBytes + sw64(c, k & 3)) = v[s];
  }
}

// bf16 Q rows [row_base, row_base + rows) -> two e4m3 rows each, hi = e4m3(q 2^-e_c) and lo =
// e4m3(q 2^-e_c - hi) at the same scale (S^T sums both into one accumulator; wgmma has no scale
// for an operand), e_c putting the row's largest |q| in [2^7, 2^8): hi keeps 4 significant bits,
// the residual the rest of bf16's 8, exact where |q 2^-e_c| >= 2^-2 (from ~2^-10 of the row's
// largest; lo then is a normal e4m3); below, lo is an e4m3 subnormal (steps of 2^-9), so the
// error stays under 2^-10, 2^-17 of the row's largest. Rows past `rows` zero. Row c's score
// scale, rsc = the call's x 2^e_c (NaN for a row holding inf or NaN: e4m3 saturates, the
// reference gives NaN), and its P-exponent scale psc (rsc where in (0, inf); else 1 and S^T is
// scaled first) go to shared memory. All 256 threads, four per row (row c = thread / 4): the
// loads (load_q_row_bf16_raw) first, the caller's TMA, then this.
constexpr int kHiloP = 4, kHiloChunks = kHeadDimQK / 8 / kHiloP;  // threads per row, 16-byte chunks per thread
static_assert(kHiloP * kBlockM == kNumThreads, "four threads per row");
__device__ __forceinline__ void store_q_rows_wide_hilo(WideFp8BSmem& ss, const uint4 (&v)[kHiloChunks],
                                                       float scale_log2) {
  const int c = threadIdx.x / kHiloP, part = threadIdx.x % kHiloP;
  const uint32_t amax = q_row_amax<kHiloP>(v);
  const bool finite = amax < 0x7f800000u;
  const int e = q_row_exponent(amax);
  if (part == 0) {
    const float f = finite ? scale_log2 * exp2_int(e) : __int_as_float(0x7fffffff);
    ss.rsc[c] = f;
    ss.psc[c] = f > 0.f && f < INFINITY ? f : 1.f;
  }
  const float down = exp2_int(-e);
#pragma unroll
  for (int k = 0; k < kHiloChunks; ++k) {
    const int col = 8 * (part + kHiloP * k), b = col >> 6, j0 = col & 63;  // box b, in-box bytes j0 .. j0 + 7
    uint2 hi, lo;
    split_e4m3_hilo(v[k], down, 1.f, hi, lo);
    const int off = sw64(c, j0 >> 4) + (j0 & 15);
    *reinterpret_cast<uint2*>(&ss.q[0][b][off]) = hi;
    *reinterpret_cast<uint2*>(&ss.q[1][b][off]) = lo;
  }
}

// Warp reduce-scatter over the 8 row lanes (lane bits 2-4): v[j] (j = 2 t + e: column 8 t + 2 q4
// + e of the accumulator layout) reduced by `op` over the lanes of the same q4; lane (r8, q4) ends
// with columns 8 r8 + 2 q4 + {0, 1} in out[0], out[1]. 14 shuffles instead of 48.
template <typename Op>
__device__ __forceinline__ void reduce_scatter16(const float (&v)[16], float (&out)[2], Op op) {
  const int lane = threadIdx.x & 31;
  float v1[8], v2[4];
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // keep half j + 8 b4, send the other half
    const float send = b4 ? v[j] : v[j + 8];
    v1[j] = op(b4 ? v[j + 8] : v[j], __shfl_xor_sync(0xffffffffu, send, 16));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float send = b3 ? v1[j] : v1[j + 4];
    v2[j] = op(b3 ? v1[j + 4] : v1[j], __shfl_xor_sync(0xffffffffu, send, 8));
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float send = b2 ? v2[j] : v2[j + 2];
    out[j] = op(b2 ? v2[j + 2] : v2[j], __shfl_xor_sync(0xffffffffu, send, 4));
  }
}

// The inverse: lane (r8, q4) holds in[e] for column 8 r8 + 2 q4 + e; every lane gets v[2 t + e]
// = column 8 t + 2 q4 + e, straight from lane 4 t + q4 (16 shuffles, no selects).
__device__ __forceinline__ void all_gather16(const float (&in)[2], float (&v)[16]) {
  const int q4 = threadIdx.x & 3;
#pragma unroll
  for (int t = 0; t < 8; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) v[2 * t + e] = __shfl_sync(0xffffffffu, in[e], 4 * t + q4);
}

struct FMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct FAdd {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// The running max moves only when a block's max exceeds it by more than kWLazyMax (log2 units):
// P = 2^(s - m + kPShift) then stays below 2^(8 + 0.75) < 448, within e4m3, and O^T is rescaled
// only on those steps (for random data a few times per row), not after most blocks (before: the
// rescale's FMULs were 18% of the kernel's instructions at B128 H128).
constexpr float kWLazyMax = 0.75f;

// O^T is promoted every kPromoteBlocks blocks (attention_narrow_fp8.cuh: fp8 wgmma accumulation).
static_assert(kPromoteBlocks % 2 == 0, "promotion happens after a block pair");

// The wide kernel's promotion (promote_o, attention_narrow_fp8.cuh): rows c = 8 t + 2 q4 + e of
// the slot, V columns 256 wg + 64 warp + 16 i + 2 r8; the earlier chains relative to the row
// maxima `mp` (when `have`), the current ones `m` (both in the scattered layout).
template <bool kStore>
__device__ __forceinline__ void promote_o_wide(float (&acc)[4][32], float* po, bool have, const float (&mp)[2],
                                               const float (&m)[2]) {
  const int tw = threadIdx.x % 128, r8 = (threadIdx.x & 31) >> 2;
  const float f2[2] = {exp2_approx(mp[0] - m[0]), exp2_approx(mp[1] - m[1])};
  float f[8][2];
  all_gather16(f2, reinterpret_cast<float(&)[16]>(f));
  promote_o<4, 8, kStore>(acc, po, (threadIdx.x / 128) * kOCols + 16 * 4 * (tw / 32) + 2 * r8, have, f);
}

template <bool kTma, bool kQ8>
__device__ bool attention_wide_fp8(const MlaParams& p) {
  static_assert(kTma, "the wide fp8 kernel is written for TMA pages");
  // P is stored as 2^kPShift P in e4m3 (as the narrow fp8 kernels: e4m3 keeps P down to 2^-17 of
  // the row max); the row sums and O carry the factor, the row max handed to the store drops it.
  constexpr float kPShift = 8.f;
  // PV: commit groups per k-step (4 / kG tiles each), at most two in flight, so that a group's A
  // registers are free when they are rewritten (kQ8: kG 1 2% faster than 2 at B128 H128, same
  // run). A bf16 query issues two wgmmas per tile (P hi, lo): kG 2, for the registers (the A
  // fragments of two groups in flight).
  constexpr int kG = kQ8 ? 1 : 2, kTiles = 4 / kG;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  using Smem = std::conditional_t<kQ8, WideFp8Smem, WideFp8BSmem>;
  uint32_t pad = (1024 - (raw_addr & 1023)) & 1023;
  if constexpr (!kQ8) {
    // No room for a re-alignment pad of 1 KiB (smem_size.h): the base, with no static shared
    // memory before it, starts the CTA's shared window. Checked, never assumed: a misaligned
    // swizzle would be silently wrong.
    pad = (512 - (raw_addr & 511)) & 511;
    if (pad + sizeof(Smem) > (size_t)kWideFp8BSmemBytes) __trap();
  }
  Smem& ss = *reinterpret_cast<Smem*>(smem_raw + pad);

  const int tid = threadIdx.x, tw = tid % 128, lane = tid & 31, q4 = lane & 3, r8 = lane >> 2;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform: wgmma under it is not serialized
  const int warp = tw / 32;
  const int r_a = 16 * warp + r8, r_b = r_a + 8;  // S^T accumulator rows: tokens
  // V^T by ldmatrix: warp w of warpgroup g holds V columns 256 g + 64 w + [0, 64) = V box 4 g + w;
  // tile i reads chunk i of it (its 16 columns); lane l gives token row l of a k-step's 32.
  const int vbox = (4 * wg + warp) * kFp8BoxBytes;
  int voff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) voff[i] = vbox + sw64(lane, i);

  if (tid == 0) {
    for (int st = 0; st < 4; ++st) {
      for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_init(smem_u32(&ss.bar[st][bx]), 1);
      mbar_init(smem_u32(&ss.vfree[st]), kNumThreads);  // both warpgroups read every block
    }
    fence_mbar_init();
  }
  __syncthreads();

  CtaRange cr;
  if constexpr (kQ8) {
    cr = start_cta<kNumThreads>(p);
  } else {  // the planner's scratch in colmax (first written after the plan's last barrier)
    static_assert(sizeof(PlanScratch<kNumThreads>) <= sizeof(ss.colmax), "the plan's scratch fits in colmax");
    cr = start_cta<kNumThreads>(p, *reinterpret_cast<PlanScratch<kNumThreads>*>(&ss.colmax[0][0][0]));
  }
  if (cr.group0 == cr.group_end) return cr.planned;

  const auto [scale_log2, bmm2] = call_scales(p);
  const float ps = p_exp_scale(scale_log2);  // kQ8; a bf16 query has a scale per row (psc)
  // Blocks warpgroup w consumed so far (each warpgroup counts both: PV reads the partner's
  // stage): w's j-th block is in stage 2 w + loads_w % 2, its TMA phase (loads_w / 2) % 2.
  uint32_t loads0 = 0, loads1 = 0;
  // Q (kQ8) or Q hi; Q lo; P (kQ8) or P lo of warpgroup 0's / 1's block.
  uint64_t dq, dql = 0, dp0, dp1;
  if constexpr (kQ8) {
    dq = make_smem_desc_sw64(smem_u32(&ss.q[0][0]));
    dp0 = make_smem_desc_sw64(smem_u32(ss.p[0]));
    dp1 = make_smem_desc_sw64(smem_u32(ss.p[1]));
  } else {
    // Q lo and the second P lo at fixed offsets (one add to the descriptor, no registers).
    dq = make_smem_desc_sw64(smem_u32(&ss.q[0][0][0]));
    dql = desc_add(dq, sizeof(ss.q[0]));
    dp0 = make_smem_desc_sw64(smem_u32(ss.plo[0]));
    dp1 = desc_add(dp0, sizeof(ss.plo[0]));
  }

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1, kv_len = unit.kv_len;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;
    const uint32_t loads = wg == 0 ? loads0 : loads1;  // this warpgroup's count at the unit's start

    // Each warpgroup's first two blocks, one per stage, and Q. In flight together: warp 0's two
    // block-table loads and every thread's Q loads, then warp 0's TMA (it waits on the block
    // table, not behind its own share of Q), then Q into shared memory.
    int pages[2] = {p.num_pages, p.num_pages};
    if (tw < 32) first_block_pages_fp8(p, bt_row, kb0, kb1, kv_len, wg, pages);
    if constexpr (kQ8) {
      uint4 v[kQ8Steps];
      load_q_rows_wide(p, unit.q_row_base, unit.rows, v);
      if (tw < 32) issue_first_blocks_fp8(p, ss.kv, ss.bar, kb0, kb1, wg, loads, pages);
      store_q_rows_wide(&ss.q[0][0], v);
    } else {
      uint4 v[kHiloChunks];
      const int c = tid / kHiloP;
      load_q_row_bf16_raw<kHiloP>(p, unit.q_row_base, c, tid % kHiloP, c < unit.rows, v);
      if (tw < 32) issue_first_blocks_fp8(p, ss.kv, ss.bar, kb0, kb1, wg, loads, pages);
      store_q_rows_wide_hilo(ss, v, scale_log2);
    }
    fence_proxy_async_smem();
    __syncthreads();
    // A bf16 query: bit 2 t + e set where this thread's column (Q row) 8 t + 2 q4 + e has a score
    // scale outside (0, inf) (S^T scaled first, psc 1: p_exp_scale says why).
    uint32_t pre = 0;
    if constexpr (!kQ8) {
#pragma unroll
      for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float f = ss.rsc[8 * t + 2 * q4 + e];
          pre |= (f > 0.f && f < INFINITY ? 0u : 1u) << (2 * t + e);
        }
    }

    // Row state in the scattered layout of reduce_scatter16: this lane's rows 8 r8 + 2 q4 + e.
    float m_run[2] = {kMaxInit, kMaxInit};
    float m_prom[2] = {kMaxInit, kMaxInit};  // !kQ8: the row maxima of the last promotion (same layout)
    // Row sums in the accumulator layout (columns 8 t + 2 q4 + e at 2 t + e), partial over this
    // thread's tokens.
    float l_run[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) l_run[j] = 0.f;
    // Blocks of rows that all see them need no mask: row 0 sees the fewest tokens.
    const int lim_min = unit_row_limit(p, unit, 0);
    float acc[4][32];  // O^T: tile i, rows r_a / r_b of the warp's slice: V columns
                       // 256 wg + 16 (4 warp + i) + 2 r8 + 0 / 1 (narrow fp8 header)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 32; ++j) acc[i][j] = 0.f;

    // S^T = K Q^T of this warpgroup's block in stage `stage` (TMA phase `par`): 18 k-steps.
    float st[32];
    auto issue_qk = [&](int stage, uint32_t par) {
      const uint32_t bars = smem_u32(&ss.bar[stage][0]);
      const uint64_t da = make_smem_desc_sw64(smem_u32(ss.kv[stage]));
#pragma unroll
      for (int b = 0; b < kNumBoxesQK; ++b) kv_wait(bars + 8 * b, par, kSiteQkBox);
      // A bf16 query: K Q_lo^T first, then K Q_hi^T on top, same scale, same accumulator. fp8
      // wgmma adds each k-step with ~14 bits of the accumulator's magnitude (attention_narrow_fp8.cuh):
      // the small lo terms first keep that loss to the 18 hi k-steps, as with an e4m3 query
      // (hi first: lse errors 1.3x the bound in test_fp8_max_moves_late, logits up to 3x).
      wgmma_fence();
      wgmma_m64n64k32_e4m3_ss_first(st, da, kQ8 ? dq : dql);
#pragma unroll
      for (int h = kQ8 ? 1 : 0; h < 2; ++h)  // 0: Q lo, 1: Q (hi)
#pragma unroll
        for (int b = 0; b < kNumBoxesQK; ++b)
#pragma unroll
          for (int u = 0; u < 2; ++u)
            if (b + u > 0 || h != (kQ8 ? 1 : 0))
              WgmmaSsE4m3<kBlockM>::mma(st, desc_add(da, b * kFp8BoxBytes + kFp8KStepBytes * u),
                                        desc_add(h ? dq : dql, b * kFp8BoxBytes + kFp8KStepBytes * u), 1);
      wgmma_commit();
    };
    // One block pair (k0, k0 + 1) of the chain ending at c1, one block per warpgroup. kSteady: both
    // blocks exist and lie below every row's limit (no mask; limits never exceed kv_len, so no
    // V tail either): its own instantiation without those branches, as the seesaw's steady pair.
    auto run_pair = [&](const int k0, const int c1, auto steady) {
      const int kb = k0 + wg;
      constexpr bool kSteady = decltype(steady)::value;
      const bool has = kSteady || kb < kb1;        // this warpgroup's block
      const bool has1 = kSteady || k0 + 1 < kb1;  // warpgroup 1's
      const uint32_t mine = wg == 0 ? loads0 : loads1;
      const int stage = 2 * wg + (mine & 1);
      const int stage0 = loads0 & 1, stage1 = 2 + (loads1 & 1);
      const bool refill = kb + 4 < kb1;
      const int refill_page = tw < 32 && refill ? block_pages(p, bt_row, kb + 4, kv_len) : p.num_pages;
      tl_mark(kTlNBlockStart, mine);

      // ---- mask, column maxima over the block's tokens in the log2 domain ----------------------
      // S^T stays unscaled (P's FFMA applies ps) unless ps is 1 for a zero, negative or NaN
      // scale (then scaled here: p_exp_scale).
      float cm[16];
      if (has) {
        const int tok_a = kb * kBlockN + r_a, tok_b = kb * kBlockN + r_b;
        const bool masked = !kSteady && (kb + 1) * kBlockN > lim_min;  // warpgroup-uniform
        if constexpr (kQ8) {
          if (ps != scale_log2) {
#pragma unroll
            for (int j = 0; j < 32; ++j) st[j] *= scale_log2;
          }
        } else if (pre != 0) {
#pragma unroll
          for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if ((pre >> (2 * t + e)) & 1u) {
                const float f = ss.rsc[8 * t + 2 * q4 + e];
                st[4 * t + e] *= f;
                st[4 * t + 2 + e] *= f;
              }
        }
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& xa = st[4 * t + e];
            float& xb = st[4 * t + 2 + e];
            if (masked) {
              const int lim = unit_row_limit(p, unit, 8 * t + 2 * q4 + e);
              xa = tok_a < lim ? xa : -INFINITY;
              xb = tok_b < lim ? xb : -INFINITY;
            }
            cm[2 * t + e] = fmaxf(xa, xb);
          }
        float part[2];
        reduce_scatter16(cm, part, FMax{});
        float2 psr = make_float2(ps, ps);  // the scattered columns' P scales
        if constexpr (!kQ8) psr = *reinterpret_cast<const float2*>(&ss.psc[8 * r8 + 2 * q4]);
        *reinterpret_cast<float2*>(&ss.colmax[wg][warp][8 * r8 + 2 * q4]) =
            make_float2(part[0] * psr.x, part[1] * psr.y);
      } else {
        *reinterpret_cast<float2*>(&ss.colmax[wg][warp][8 * r8 + 2 * q4]) = make_float2(-INFINITY, -INFINITY);
      }
      __syncthreads();  // B1: both warpgroups' column maxima
      tl_mark(kTlNMaxShared, mine);

      // ---- the pair's running max (same in both warpgroups), P into sP, O^T and sums rescaled --
      float mn2[2], sc2[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * r8 + 2 * q4 + e;
        float bm = ss.colmax[0][0][c];
#pragma unroll
        for (int x = 1; x < 8; ++x) bm = fmaxf(bm, ss.colmax[x / 4][x % 4][c]);
        mn2[e] = bm > m_run[e] + kWLazyMax ? bm : m_run[e];
        sc2[e] = exp2_approx(m_run[e] - mn2[e]);
        m_run[e] = mn2[e];
      }
      // P = 2^(s ps - m + kPShift) = 2^fma(s, ps, nb): the bias per row, gathered.
      const float nb2[2] = {kPShift - mn2[0], kPShift - mn2[1]};
      float nb[16], sc[16];
      all_gather16(nb2, nb);
      if (__any_sync(0xffffffffu, sc2[0] != 1.f || sc2[1] != 1.f)) {
        all_gather16(sc2, sc);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][4 * t + e] *= sc[2 * t + (e & 1)];
#pragma unroll
        for (int j = 0; j < 16; ++j) l_run[j] *= sc[j];
      }
      if (has) {
        // P (kQ8), or P hi into box 8 of the block's stage (its QK^T is done) and P lo.
        uint8_t* pbuf;
        if constexpr (kQ8) {
          pbuf = ss.p[wg];
        } else {
          pbuf = ss.kv[stage] + (kNumBoxesQK - 1) * kFp8BoxBytes;
        }
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          float2 pst = make_float2(ps, ps);  // columns 8 t + 2 q4 + {0, 1}: P's scales
          if constexpr (!kQ8) pst = *reinterpret_cast<const float2*>(&ss.psc[8 * t + 2 * q4]);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * t + 2 * q4 + e;
            const float pse = e == 0 ? pst.x : pst.y;
            const float pa = exp2_approx(fmaf(st[4 * t + e], pse, nb[2 * t + e]));
            const float pb = exp2_approx(fmaf(st[4 * t + 2 + e], pse, nb[2 * t + e]));
            l_run[2 * t + e] += pa + pb;  // from P before rounding
            // Tokens r_a, r_b at positions 16 warp + 2 r8 + {0, 1} (narrow fp8 header).
            const uint32_t hi = f32x2_to_e4m3x2(pa, pb);
            *reinterpret_cast<uint16_t*>(pbuf + sw64(c, warp) + 2 * r8) = (uint16_t)hi;
            if constexpr (!kQ8) {  // P lo: the rounding error of hi, same scale (4 + 4 significant bits)
              const float2 h = e4m3x2_to_f32x2(hi);
              *reinterpret_cast<uint16_t*>(ss.plo[wg] + sw64(c, warp) + 2 * r8) =
                  (uint16_t)f32x2_to_e4m3x2(pa - h.x, pb - h.y);
            }
          }
        }
        // Token rows past kv_len hold anything (NaN included) and P = 0 does not cancel 0 * NaN:
        // the last block's V bytes there are zeroed (QK^T is done with the stage).
        if (!kSteady && (kb + 1) * kBlockN > kv_len) zero_v_rows_fp8(ss.kv[stage], kv_len - kb * kBlockN, tw);
      }
      fence_proxy_async_smem();
      __syncthreads();  // B2: both blocks' P and zeroed tails; colmax read by every warp
      tl_mark(kTlNPShared, mine);

      // ---- O^T += V^T P^T over both blocks of the pair; then the next pair's QK^T --------------
      // The partner's block is read without waiting on its TMA barriers: its owner waited for
      // them before QK^T, and the CTA barriers since make the data visible here. Keep a CTA
      // barrier between the owner's wait and this PV in any reordering.
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        if (blk == 1 && !has1) break;
        const uint32_t vbase = smem_u32(ss.kv[blk == 0 ? stage0 : stage1]);
        const uint64_t dp = blk == 0 ? dp0 : dp1;  // P (kQ8) or P lo
        // !kQ8: P hi in the stage's box 8.
        const uint64_t dph = kQ8 ? 0 : make_smem_desc_sw64(vbase + (kNumBoxesQK - 1) * kFp8BoxBytes);
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            if (2 * kG * blk + kG * s + g >= 2) wgmma_wait<1>();
            uint32_t a[kTiles][4];
#pragma unroll
            for (int x = 0; x < kTiles; ++x) {
              v_fragment(vbase + voff[kTiles * g + x] + s * 32 * kBoxCols, a[x]);
            }
            wgmma_fence();
            if constexpr (!kQ8) {
#pragma unroll
              for (int x = 0; x < kTiles; ++x)
                WgmmaRsE4m3<kBlockM>::mma(acc[kTiles * g + x], a[x], desc_add(dph, s * kFp8KStepBytes));
            }
#pragma unroll
            for (int x = 0; x < kTiles; ++x)
              WgmmaRsE4m3<kBlockM>::mma(acc[kTiles * g + x], a[x], desc_add(dp, s * kFp8KStepBytes));
            wgmma_commit();
          }
      }
      // kQ8: PV reads the stages only by ldmatrix (P comes from sP): once issued, this thread is
      // done with both blocks. The owner's warp 0 refills its stage when all 256 threads are.
      // A bf16 query's P hi is in the stages: they are free when this thread's PV has retired.
      auto release_stages = [&] {
        mbar_arrive(smem_u32(&ss.vfree[stage0]));
        if (has1) mbar_arrive(smem_u32(&ss.vfree[stage1]));
      };
      if constexpr (kQ8) release_stages();
      tl_mark(kTlNPvIssued, mine);
      // The next pair's QK^T goes behind this PV, within the chain.
      const bool next = kb + 2 < c1;
      // The two paths each end with every wgmma retired: merged while this warpgroup's QK^T was
      // in flight, ptxas serialized the wgmmas (C7515: the other path's softmax defines S^T).
      // Every phase of vfree is waited for (a refill or not), so its phase stays the stage's use count.
      // Warp 0: once both warpgroups are done reading this warpgroup's stage, block kb + 4 into it.
      auto refill_stage = [&] {
        mbar_wait(smem_u32(&ss.vfree[stage]), (mine >> 1) & 1);
        if (refill) issue_kv_fp8(p, smem_u32(ss.kv[stage]), smem_u32(&ss.bar[stage][0]), kb + 4, refill_page);
      };
      if (next) {
        const uint32_t nl = mine + 1;
        issue_qk(2 * wg + (nl & 1), (nl >> 1) & 1);
        if constexpr (!kQ8) {
          // The PV groups: issue_qk commits exactly one group, the newest. If QK^T ever commits
          // more, this count must follow, or a PV wgmma could still read P hi in a released stage.
          wgmma_wait<1>();
          release_stages();
        }
        if (tw < 32) refill_stage();
        wgmma_wait<0>();
      } else {  // a refill only at a chain's end (else it would be block kb + 4 > kb + 2)
        if constexpr (!kQ8) {
          wgmma_wait<0>();
          release_stages();
        }
        if (tw < 32 && has) refill_stage();
        wgmma_wait<0>();
      }
      tl_mark(kTlNPvDone, mine);
#pragma unroll
      for (int i = 0; i < 4; ++i) fence_regs(acc[i]);
      fence_regs(st);
      loads0 += 1;
      loads1 += has1 ? 1 : 0;
    };
    // The unit's blocks in chains of kPromoteBlocks (fp8 wgmma accumulation, attention_narrow_fp8.cuh),
    // O^T promoted between two: outside the pair loop, with S^T dead, so the loop's registers and
    // code are those without promotion. Each chain starts with its first QK^T, as the unit does.
    for (int c0 = kb0; c0 < kb1; c0 += kPromoteBlocks) {
      const int c1 = min(c0 + kPromoteBlocks, kb1);
      if (c0 + wg < kb1) {
        const uint32_t nl = wg == 0 ? loads0 : loads1;
        issue_qk(2 * wg + (nl & 1), (nl >> 1) & 1);
        wgmma_wait<0>();
        fence_regs(st);
      }
      // Steady pairs: k0 + 1 < kb1 and (k0 + 2) * 64 <= lim_min (row 0's limit, the smallest).
      const int steady_end = min(c1, min(kb1 - 1, lim_min / kBlockN - 1));
      int k0 = c0;
      for (; k0 < steady_end; k0 += 2) run_pair(k0, c1, std::true_type{});
      for (; k0 < c1; k0 += 2) run_pair(k0, c1, std::false_type{});
      if (c1 < kb1) {  // CTA-uniform
        // Promotion n (from 0) reads the row maxima of promotion n - 1 and writes its own into
        // the other buffer (warp 0 of warpgroup 0; every thread read the older ones before: the
        // pairs between two promotions have CTA barriers).
        const int n = (c1 - kb0) / kPromoteBlocks - 1;
        if constexpr (kQ8) {
          const float2 mp = *reinterpret_cast<const float2*>(&ss.m_prom[(n + 1) & 1][8 * r8 + 2 * q4]);
          promote_o_wide<true>(acc, unit_slot_o(p, cr, grp), n > 0, {mp.x, mp.y}, m_run);
          if (wg == 0 && warp == 0) *reinterpret_cast<float2*>(&ss.m_prom[n & 1][8 * r8 + 2 * q4]) = make_float2(m_run[0], m_run[1]);
        } else {  // every lane holds its rows' maxima itself (the scattered layout is per warp)
          promote_o_wide<true>(acc, unit_slot_o(p, cr, grp), n > 0, m_prom, m_run);
          m_prom[0] = m_run[0];
          m_prom[1] = m_run[1];
        }
      }
    }

    // ---- epilogue: row sums over all 256 threads, then O straight from the accumulators --------
    {
      float part[2];
      reduce_scatter16(l_run, part, FAdd{});
      *reinterpret_cast<float2*>(&ss.colmax[wg][warp][8 * r8 + 2 * q4]) = make_float2(part[0], part[1]);
      if constexpr (kQ8)
        if (wg == 0 && warp == 0) *reinterpret_cast<float2*>(&ss.m[8 * r8 + 2 * q4]) = make_float2(m_run[0], m_run[1]);
    }
    // !kQ8: row c's max from the lane of this warp that holds it (lane 4 (c / 8) + (c % 8) / 2,
    // entry c % 2 of the scattered layout), before the divergent branch below.
    float m_c = 0.f;
    if constexpr (!kQ8) {
      const int c = tid % kBlockM, src = 4 * (c / 8) + (c % 8) / 2;
      const float m0 = __shfl_sync(0xffffffffu, m_run[0], src), m1 = __shfl_sync(0xffffffffu, m_run[1], src);
      m_c = (c & 1) ? m1 : m0;
    }
    __syncthreads();
    // The output factors: fin (kQ8), or plo[0] (every PV has retired: each thread waited for its
    // own before the barrier above).
    float* fin;
    if constexpr (kQ8) {
      fin = ss.fin;
    } else {
      fin = reinterpret_cast<float*>(ss.plo[0]);
    }
    // Row c (one thread each): its output factor, and its LSE (split: the partial's).
    const int slot = partial_slot(p, cr.set, grp, cr.lane_m);
    if (tid < kBlockM) {
      const int c = tid;
      float tot = 0.f;
#pragma unroll
      for (int x = 0; x < 8; ++x) tot += ss.colmax[x / 4][x % 4][c];
      float m;
      if constexpr (kQ8) {
        m = ss.m[c] - kPShift;
      } else {
        m = m_c - kPShift;
      }
      const RowNorm rn = row_norm(m, tot);
      float f = rn.f;
      // The LSE and the sinks' scale here; the stores below find the row's destination again
      // (each thread stores 16 rows).
      row_destination(p, w, slot, c, rn.lse, bmm2, c < unit.rows, f);
      fin[c] = f;
    }
    __syncthreads();
    // The promoted chains back in (each thread reads only what it wrote). A split partial goes
    // into the same slot as bf16 rows (partial_row), over other threads' fp32: all read first.
    if (kb1 - kb0 > kPromoteBlocks) {  // promoted at least once (CTA-uniform): the last was n
      const int n = (kb1 - kb0 - 1) / kPromoteBlocks - 1;
      if constexpr (kQ8) {
        const float2 mp = *reinterpret_cast<const float2*>(&ss.m_prom[n & 1][8 * r8 + 2 * q4]);
        promote_o_wide<false>(acc, unit_slot_o(p, cr, grp), true, {mp.x, mp.y}, m_run);
      } else {
        promote_o_wide<false>(acc, unit_slot_o(p, cr, grp), true, m_prom, m_run);
      }
      if (w.split) __syncthreads();
    }
    // acc[i][4 t + e]: row c = 8 t + 2 q4 + (e & 1), V column v0 + (e >> 1): one pair per row.
    const int v0 = wg * kOCols + 16 * 4 * warp + 2 * r8;
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * t + 2 * q4 + e;
        if (c >= unit.rows) continue;
        const float f = fin[c];
        if (w.split) {
          __nv_bfloat16* po = partial_row(p, slot, c) + v0;
#pragma unroll
          for (int i = 0; i < 4; ++i)
            *reinterpret_cast<uint32_t*>(po + 16 * i) = pack_bf16x2(acc[i][4 * t + e] * f, acc[i][4 * t + 2 + e] * f);
        } else {
          __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + (unit.q_row_base + c) * kHeadDimV + v0;
#pragma unroll
          for (int i = 0; i < 4; ++i)
            *reinterpret_cast<uint32_t*>(out + 16 * i) = pack_bf16x2(acc[i][4 * t + e] * f, acc[i][4 * t + 2 + e] * f);
        }
      }
    // The next unit reuses Q (its generic writes come after this unit's wgmma reads), colmax, m
    // and fin (!kQ8: psc, rsc and plo).
    fence_proxy_async_smem();
    __syncthreads();
  }
  return cr.planned;
}

}  // namespace jit_mla::sm90
