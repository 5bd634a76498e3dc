// Split-KV MLA attention for sm_90a when a unit has few rows (query tokens x heads <= kN, 16 or
// 32: TP8 decode with 16 heads, MTP 2 with 16 heads, 32 heads). The 64-row kernels pad such a
// unit to 64 rows, so their tensor cores do 4x (2x) the work and set the pace instead of the
// memory. Here the tiles are transposed, so M = 64 runs over KV tokens or V columns and N = kN
// over the rows:
//   S^T = K Q^T          (64 tokens x kN)  m64nNk16 x 36, A = the KV tile (K-major), B = Q
//   softmax over tokens  per column (a Q row): across the 4 warps through shared memory
//   O^T += V^T P^T       (512 x kN)        m64nNk16 x 8 tiles x 4, A = V^T (the KV tile read
//                                          MN-major), B = P (kN rows x 64 tokens, K-major)
// The two warpgroups run independent loops over alternate KV blocks (warpgroup w: blocks
// kb0 + w, kb0 + w + 2, ..., in stage w), each with its own running max; at the end of a unit
// their O, max and sums are merged through shared memory and written by the 64-row epilogue
// (store_unit_result), so outputs, partials, LSE and sinks are handled as in the other kernels.
//
// kFp8: the KV cache is float8_e4m3fn (a bf16 query). Each block lands as 9 unswizzled boxes of
// (64 tokens, 64) e4m3 in bytes that are free early (smem_size.h, NarrowFp8Smem), so the next
// block's loads overlap the current block's work, and is turned into the bf16 tile of the stage in
// two phases beside the QK^T wgmmas. The conversion is exact (every e4m3 value is a bf16 value), so
// the rest of the kernel is the bf16 one, and the per-tensor k/v scales stay folded into
// bmm1_scale / bmm2_scale (the contract's convention).
#pragma once
#include <cuda_bf16.h>

#include <type_traits>

#include "../common/device_utils.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "../common/units.cuh"
#include "../config.h"
#include "attention_seesaw.cuh"  // chunk_page, issue_kv_half, kv_wait, kMaxInit
#include "epilogue.cuh"
#include "tile_utils.cuh"
#include "smem_size.h"
#include "wgmma.cuh"
#include "wgmma_narrow.cuh"

namespace jit_mla::sm90 {

// Q rows [row_base, row_base + rows) -> the (kN, 576) B tile; rows past `rows` zero-filled.
template <int kN>
__device__ __forceinline__ void load_q_rows(uint32_t sQ, const MlaParams& p, long long row_base, int rows) {
  const int chunk = threadIdx.x & 7, r = threadIdx.x >> 3;  // 32 rows of 8 chunks per pass
  if (r >= kN) return;
  const bool valid = r < rows;
  const __nv_bfloat16* src =
      static_cast<const __nv_bfloat16*>(p.q) + (valid ? (row_base + r) * kHeadDimQK : 0) + chunk * 8;
  const uint32_t dst = sQ + swizzled(r, chunk);
#pragma unroll
  for (int box = 0; box < kNumBoxesQK; ++box) cp_async_16(dst + box * kN * 128, src + box * kBoxCols, valid);
}

// A warpgroup's 128 threads (named barrier 1 + wg; constant ids, so ptxas reserves only those).
__device__ __forceinline__ void wg_barrier(int wg) {
  if (wg == 0) named_barrier_sync(1, 128);
  else named_barrier_sync(2, 128);
}

// Zero V rows [first_row, 64) of the 8 V boxes of a stage (a page's rows past kv_len hold
// anything, NaN included, and P = 0 does not cancel 0 * NaN), then make them visible to wgmma.
__device__ __forceinline__ void zero_v_rows(uint8_t* stage, int first_row, int wg) {
  const int tw = threadIdx.x & 127;
  const int n = (kBlockN - first_row) * 8 * 8;  // 16-byte chunks: rows x 8 boxes x 8
  for (int i = tw; i < n; i += 128) {
    const int r = first_row + i / 64, bx = (i / 8) % 8, c = i % 8;
    *reinterpret_cast<uint4*>(stage + bx * kBoxBytes + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_smem();
  wg_barrier(wg);
}

// fp8 box b of a warpgroup's block (4 KiB, rows 64 bytes apart): boxes [0, kX) in its x buffer,
// [kX, 7) at the start of its stage, 7 and 8 in the stage's rope box (bf16 box 8).
// (A shared-memory address or a generic pointer: the same offsets.)
template <int kN, typename Addr>
__device__ __forceinline__ Addr fp8_box(Addr stage, Addr x, int b) {
  constexpr int kX = kNarrowFp8XBoxes<kN>;
  return b < kX ? x + b * kFp8BoxBytes
       : b < 7  ? stage + (b - kX) * kFp8BoxBytes
                : stage + 8 * kBoxBytes + (b - 7) * kFp8BoxBytes;
}

// Warp-collective (warp 0): fp8 boxes [b0, b1) of block `block`, by TMA, to fp8_box; box bx
// completes on mbarrier bars + 8 bx. Lane c issues chunk c with the page id it holds in `page`.
template <int kN>
__device__ __forceinline__ void issue_kv_fp8(const MlaParams& p, uint32_t stage, uint32_t x, uint32_t bars,
                                             int block, int page, int b0, int b1) {
  if constexpr (kProbeNoLoads) return;
  const int lane = threadIdx.x & 31;
  if (lane == 0)
    for (int bx = b0; bx < b1; ++bx) mbar_arrive_expect_tx(bars + 8 * bx, kFp8BoxBytes);
  if (lane < (kBlockN >> (31 - __clz(p.kv_box_rows)))) {
    const int r0 = lane * p.kv_box_rows;
    const int row = page_row(block * kBlockN + r0, p.page_size);
    const uint64_t policy = createpolicy_evict_first();  // read once, as in issue_kv_half
    for (int bx = b0; bx < b1; ++bx)
      tma_load_3d(fp8_box<kN>(stage, x, bx) + r0 * kBoxCols, &p.kv_tmap, bars + 8 * bx, bx * kBoxCols, row, page,
                  policy);
  }
}

// Four e4m3 (one word, byte 0 first) -> four bf16 (two words), exactly: e4m3 -> f16 by cvt (f16
// holds every e4m3 value, NaN included), f16 -> f32 -> bf16 (every such value is a bf16 value).
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(uint32_t w) {
  uint32_t h01, h23;
  asm("{\n"
      ".reg .b16 lo, hi;\n"
      "mov.b32 {lo, hi}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n"
      "}\n"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&h01));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&h23));
  return make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y));
}

// Thread tw's share of fp8 box j: row tw / 2, columns 32 (tw % 2) .. + 31 (32 e4m3, two uint4).
struct Fp8Share {
  uint4 a, b;
};
__device__ __forceinline__ Fp8Share read_fp8_share(const uint8_t* box) {
  const int tw = threadIdx.x & 127;
  const uint4* src = reinterpret_cast<const uint4*>(box + (tw >> 1) * kBoxCols + 32 * (tw & 1));
  return Fp8Share{src[0], src[1]};
}
// ... as bf16 into box j of the stage's bf16 tile: 16-byte chunks 4 (tw % 2) .. + 3 of row tw / 2.
__device__ __forceinline__ void write_bf16_share(uint8_t* stage, int j, const Fp8Share& v) {
  const int tw = threadIdx.x & 127, r = tw >> 1, h = tw & 1;
  const uint32_t w[8] = {v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w};
  uint8_t* box = stage + j * kBoxBytes;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint2 lo = e4m3x4_to_bf16x4(w[2 * c]), hi = e4m3x4_to_bf16x4(w[2 * c + 1]);
    *reinterpret_cast<uint4*>(box + swizzled(r, 4 * h + c)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

// Lanes 0-7 of warp 0: the page ids of block `block`'s TMA chunks, read a block ahead of their
// use so the refill does not wait on the block table.
__device__ __forceinline__ int block_pages(const MlaParams& p, const int* bt_row, int block, int kv_len) {
  const int lane = threadIdx.x & 31;
  return lane < 8 ? chunk_page(p, bt_row, block, lane, kv_len) : p.num_pages;
}

template <int kN, bool kFp8>
__device__ void attention_narrow(const MlaParams& p) {
  constexpr int kT = kN / 8;       // column octets per thread: columns 8t + 2 q4 + {0, 1}
  constexpr int kAcc = kN / 2;     // fp32 registers of one m64nN accumulator
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  using Smem = std::conditional_t<kFp8, NarrowFp8Smem<kN>, NarrowSmem<kN>>;
  Smem& ss = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));

  const int tid = threadIdx.x, tw = tid % 128, lane = tid & 31, q4 = lane & 3;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform: wgmma under it is not serialized
  const int warp = tw / 32;
  const int r_a = 16 * warp + lane / 4, r_b = r_a + 8;  // accumulator rows: tokens (S^T) or V columns
  const uint32_t sQ = smem_u32(ss.q), sP = smem_u32(ss.p[wg]);
  const uint32_t stage = smem_u32(ss.kv[wg]), bars = smem_u32(&ss.bar[wg][0]);
  // fp8: the warpgroup's x buffer (smem_size.h); unused (the stage) for bf16.
  uint8_t* const x_ptr = [&] {
    if constexpr (kFp8) return ss.x[wg];
    else return ss.kv[wg];
  }();
  const uint32_t x = smem_u32(x_ptr);

  if (tid == 0) {
    for (int st = 0; st < 2; ++st)
      for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_init(smem_u32(&ss.bar[st][bx]), 1);
    fence_mbar_init();
  }
  __syncthreads();

  const CtaRange cr = start_cta<kNumThreads>(p);
  if (cr.group0 == cr.group_end) return;

  const auto [scale_log2, bmm2] = call_scales(p);
  uint32_t loads = 0;  // blocks loaded into this warpgroup's stage so far: the mbarrier phase count

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1, kv_len = unit.kv_len;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;

    if (tw < 32 && kb0 + wg < kb1) {
      const int page = block_pages(p, bt_row, kb0 + wg, kv_len);
      if constexpr (kFp8) {
        issue_kv_fp8<kN>(p, stage, x, bars, kb0 + wg, page, 0, kNumBoxesQK);
      } else {
        issue_kv_half(p, stage, bars, kb0 + wg, 0, page, 0);
        issue_kv_half(p, stage, bars, kb0 + wg, 1, page, 0);
      }
    }
    load_q_rows<kN>(sQ, p, unit.q_row_base, unit.rows);
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async_smem();
    __syncthreads();

    // This thread's columns (Q rows) c = 8t + 2 q4 + e: KV limits, running max and sums.
    int lim[kT][2];
    float m_run[kT][2], l_run[kT][2];
#pragma unroll
    for (int t = 0; t < kT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        lim[t][e] = unit_row_limit(p, unit, 8 * t + 2 * q4 + e);
        m_run[t][e] = kMaxInit;
        l_run[t][e] = 0.f;
      }
    float acc[8][kAcc];  // O^T: tile i holds V columns [64 i, 64 i + 64) x the kN rows
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < kAcc; ++j) acc[i][j] = 0.f;

    for (int kb = kb0 + wg; kb < kb1; kb += 2) {
      const uint32_t par = loads & 1;
      const bool next = kb + 2 < kb1;
      const int next_page = tw < 32 && next ? block_pages(p, bt_row, kb + 2, kv_len) : p.num_pages;
      // ---- S^T = K Q^T, box by box as they land -----------------------------------------
      float st[kAcc];
      wgmma_fence();
      if constexpr (kFp8) {
        // Two phases around one barrier. The bf16 boxes 2-7 overwrite no fp8 byte of this block
        // (fp8_box), so each thread writes them as it converts; it also reads box 8 ahead. After
        // the barrier every fp8 byte in the stage has been read, so the rest (bf16 box 8 over
        // the rope box's fp8 boxes 7-8; bf16 boxes 0-1 over the fp8 boxes [kX, 7)) is written
        // while the wgmmas of boxes 2-7 run.
        for (int bx = 2; bx < kNumBoxesQK; ++bx) kv_wait(bars + 8 * bx, par, kSiteQkBox);
#pragma unroll
        for (int bx = 2; bx < 8; ++bx)
          write_bf16_share(ss.kv[wg], bx, read_fp8_share(fp8_box<kN>((const uint8_t*)ss.kv[wg], (const uint8_t*)x_ptr, bx)));
        const Fp8Share rope = read_fp8_share(fp8_box<kN>((const uint8_t*)ss.kv[wg], (const uint8_t*)x_ptr, 8));
        fence_proxy_async_smem();
        wg_barrier(wg);
#pragma unroll
        for (int bx = 2; bx < 8; ++bx)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            WgmmaN<kN, 0>::mma(st, make_smem_desc(stage + bx * kBoxBytes + kk * 32, 16, 1024),
                               make_smem_desc(sQ + bx * kN * 128 + kk * 32, 16, 1024),
                               bx == 2 && kk == 0 ? 0 : 1);
        write_bf16_share(ss.kv[wg], 8, rope);
        kv_wait(bars, par, kSiteQkBox);
        kv_wait(bars + 8, par, kSiteQkBox);
#pragma unroll
        for (int bx = 0; bx < 2; ++bx) write_bf16_share(ss.kv[wg], bx, read_fp8_share(x_ptr + bx * kFp8BoxBytes));
        fence_proxy_async_smem();
        wg_barrier(wg);  // the x buffer is read: block kb + 2's first boxes may land there
#pragma unroll
        for (int i = 0; i < 3; ++i) {
          const int bx = i < 2 ? i : 8;
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            WgmmaN<kN, 0>::mma(st, make_smem_desc(stage + bx * kBoxBytes + kk * 32, 16, 1024),
                               make_smem_desc(sQ + bx * kN * 128 + kk * 32, 16, 1024), 1);
        }
        if (tw < 32 && next) issue_kv_fp8<kN>(p, stage, x, bars, kb + 2, next_page, 0, kNarrowFp8XBoxes<kN>);
      } else {
#pragma unroll
        for (int bx = 0; bx < kNumBoxesQK; ++bx) {
          kv_wait(bars + 8 * bx, par, kSiteQkBox);
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            WgmmaN<kN, 0>::mma(st, make_smem_desc(stage + bx * kBoxBytes + kk * 32, 16, 1024),
                               make_smem_desc(sQ + bx * kN * 128 + kk * 32, 16, 1024),
                               bx == 0 && kk == 0 ? 0 : 1);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(st);

      // ---- mask, scale to log2, column maxima over the block's 64 tokens --------------------
      const int tok_a = kb * kBlockN + r_a, tok_b = kb * kBlockN + r_b;
      float cm[kT][2];
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& xa = st[4 * t + e];
          float& xb = st[4 * t + 2 + e];
          xa = tok_a < lim[t][e] ? xa * scale_log2 : -INFINITY;
          xb = tok_b < lim[t][e] ? xb * scale_log2 : -INFINITY;
          float v = fmaxf(xa, xb);
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          cm[t][e] = v;
        }
      if (lane < 4)
#pragma unroll
        for (int t = 0; t < kT; ++t)
#pragma unroll
          for (int e = 0; e < 2; ++e) ss.colmax[wg][warp][8 * t + 2 * q4 + e] = cm[t][e];
      wg_barrier(wg);
      // fp8: every warp is past its QK^T, so the rope box (fp8 boxes 7-8 of block kb + 2) is free.
      if (kFp8 && tw < 32 && next) issue_kv_fp8<kN>(p, stage, x, bars, kb + 2, next_page, 7, kNumBoxesQK);

      // ---- running max, P = 2^(s - m) into sP as (rows, tokens), O^T rescaled ------------
      float sc[kT][2];
      bool grew = false;
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * t + 2 * q4 + e;
          const float bm = fmaxf(fmaxf(ss.colmax[wg][0][c], ss.colmax[wg][1][c]),
                                 fmaxf(ss.colmax[wg][2][c], ss.colmax[wg][3][c]));
          const float mn = fmaxf(m_run[t][e], bm);
          sc[t][e] = exp2_approx(m_run[t][e] - mn);
          grew |= sc[t][e] != 1.f;
          m_run[t][e] = mn;
          const float pa = exp2_approx(st[4 * t + e] - mn), pb = exp2_approx(st[4 * t + 2 + e] - mn);
          l_run[t][e] = l_run[t][e] * sc[t][e] + pa + pb;
          // P row c, tokens r_a and r_b: 16-byte chunk token / 8 of the swizzled 128-byte row.
          *reinterpret_cast<__nv_bfloat16*>(ss.p[wg] + swizzled(c, r_a >> 3) + 2 * (r_a & 7)) =
              __float2bfloat16_rn(pa);
          *reinterpret_cast<__nv_bfloat16*>(ss.p[wg] + swizzled(c, r_b >> 3) + 2 * (r_b & 7)) =
              __float2bfloat16_rn(pb);
        }
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int t = 0; t < kT; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][4 * t + e] *= sc[t][e & 1];
      }
      if ((kb + 1) * kBlockN > kv_len) {
        zero_v_rows(ss.kv[wg], kv_len - kb * kBlockN, wg);  // its barrier also publishes sP
      } else {
        fence_proxy_async_smem();
        wg_barrier(wg);  // sP complete; colmax read by every warp
      }

      // ---- O^T += V^T P^T: 8 tiles of 64 V columns, 4 k-steps of 16 tokens -----------------
      // Two commit groups (V boxes 0-3, then 4-7): the first half of the stage is refilled as
      // soon as its tiles are done.
      wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 4 * h; i < 4 * h + 4; ++i)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            WgmmaN<kN, 1>::mma(acc[i], make_smem_desc(stage + i * kBoxBytes + kk * 16 * 128, kBoxBytes, 1024),
                                    make_smem_desc(sP + kk * 32, 16, 1024), 1);
        wgmma_commit();
      }
      wgmma_wait<1>();
      // V boxes 0-3 are free: bf16, the first half of block kb + 2; fp8, its boxes [kX, 7).
      if (tw < 32 && next) {
        if constexpr (!kFp8) issue_kv_half(p, stage, bars, kb + 2, 0, next_page, 0);
        else if constexpr (kNarrowFp8XBoxes<kN> < 7)
          issue_kv_fp8<kN>(p, stage, x, bars, kb + 2, next_page, kNarrowFp8XBoxes<kN>, 7);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 8; ++i) fence_regs(acc[i]);

      // bf16: the rest of the stage (V boxes 4-7, the rope box) and sP are free: refill.
      loads += 1;
      if (!kFp8 && tw < 32 && next) issue_kv_half(p, stage, bars, kb + 2, 1, next_page, 0);
    }

    // ---- epilogue: each warpgroup's sums, max and O to shared memory, merged per row ----------
    // Sums over the 8 row lanes (xor 4, 8, 16) and the 4 warps.
#pragma unroll
    for (int t = 0; t < kT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = l_run[t][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        l_run[t][e] = v;
      }
    wg_barrier(wg);  // every warp is past its last colmax read
    if (lane < 4)
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * t + 2 * q4 + e;
          ss.colmax[wg][warp][c] = l_run[t][e];
          if (warp == 0) ss.m[wg][c] = m_run[t][e];
        }
    // O^T of this warpgroup -> its own stage as (kN rows, 512) fp32, rows kMergeStride apart
    // (padding against bank conflicts): its loads are all consumed.
    float* ob = reinterpret_cast<float*>(ss.kv[wg]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * t + 2 * q4 + (e & 1), v = 64 * i + (e < 2 ? r_a : r_b);
          ob[c * kMergeStride + v] = acc[i][4 * t + e];
        }
    wg_barrier(wg);
    if (tw < kN)
      ss.l[wg][tw] = ss.colmax[wg][0][tw] + ss.colmax[wg][1][tw] + ss.colmax[wg][2][tw] + ss.colmax[wg][3][tw];
    __syncthreads();

    // The 64-row epilogue's layout: rows r_a, r_b (Q rows here), this warpgroup's 256 columns.
    const float* ob0 = reinterpret_cast<const float*>(ss.kv[0]);
    const float* ob1 = reinterpret_cast<const float*>(ss.kv[1]);
    float o[128];
    float mrow[2] = {kMaxInit, kMaxInit}, tot[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = h == 0 ? r_a : r_b;
      float f0 = 0.f, f1 = 0.f;
      if (r < kN) {
        const float m0 = ss.m[0][r], m1 = ss.m[1][r], mx = fmaxf(m0, m1);
        f0 = exp2_approx(m0 - mx);
        f1 = exp2_approx(m1 - mx);
        mrow[h] = mx;
        tot[h] = ss.l[0][r] * f0 + ss.l[1][r] * f1;
      }
#pragma unroll
      for (int t = 0; t < kOCols / 8; ++t) {
        const int col = wg * kOCols + 8 * t + 2 * q4;
        float2 v = make_float2(0.f, 0.f);
        if (r < kN) {
          const float2 a = *reinterpret_cast<const float2*>(ob0 + r * kMergeStride + col);
          const float2 b = *reinterpret_cast<const float2*>(ob1 + r * kMergeStride + col);
          v = make_float2(a.x * f0 + b.x * f1, a.y * f0 + b.y * f1);
        }
        o[4 * t + 2 * h + 0] = v.x;
        o[4 * t + 2 * h + 1] = v.y;
      }
    }
    store_unit_result(p, w, partial_slot(p, cr.set, grp, cr.lane_m), wg, r_a, r_b, q4, o, mrow[0], mrow[1],
                      tot[0], tot[1], bmm2);
    // The next unit reuses the stages (they hold the merge buffers; its TMA writes must come
    // after these generic-proxy reads), Q, colmax, m and l.
    fence_proxy_async_smem();
    __syncthreads();
  }
}

}  // namespace jit_mla::sm90
