// Split-KV MLA attention for sm_90a when a unit has few rows (query tokens x heads <= kN; built
// for kN = 16: TP8 decode with 16 heads). The 64-row kernels pad such a unit to 64 rows, so their
// tensor cores do 4x the work. (kN = 32, for MTP 2 with 16 heads or 32 heads, took 1-9% longer
// than the 64-row seesaw from B1 to B128 and was dropped in Session 44; the fp8 kernels keep
// their 32-row units.) Here the tiles are transposed, so M = 64 runs over KV tokens or V
// columns and N = kN over the rows:
//   S^T = K Q^T          (64 tokens x kN)  m64nNk16 x 36, A = the KV tile (K-major), B = Q
//   softmax over tokens  per column (a Q row): across the 4 warps through shared memory
//   O^T += V^T P^T       (512 x kN)        m64nNk16 x 8 tiles x 4, A = V^T (the KV tile read
//                                          MN-major), B = P (kN rows x 64 tokens, K-major)
// The two warpgroups run independent loops over alternate KV blocks (warpgroup w: blocks
// kb0 + w, kb0 + w + 2, ..., in stage w), each with its own running max; at the end of a unit
// their O, max and sums are merged through shared memory and written by store_unit_rows
// (epilogue.cuh), which handles outputs, partials, LSE and sinks as the other kernels' epilogue.
#pragma once
#include <cuda_bf16.h>

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

// After a unit of `blocks` blocks (warpgroup w takes blocks w, w + 2, ...; kPerBlock warpgroup
// barriers each): with an odd count warpgroup 1 ran one block fewer, and passes its barrier
// kPerBlock more times here. For racecheck only, which pairs the two warpgroups' named-barrier
// instances by count: the unequal units, and only they, got the end-of-unit merge across
// __syncthreads reported as thousands of RAW hazards, with every value right
// (docs/experiments/racecheck_repro.cu, session 10). Evened up, a real race would stand out. A
// few instructions per unit.
template <int kPerBlock>
__device__ __forceinline__ void wg_barrier_even_up(int wg, int blocks) {
  if (wg == 1 && (blocks & 1))
#pragma unroll
    for (int k = 0; k < kPerBlock; ++k) wg_barrier(wg);
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

// Lanes 0-7 of warp 0: the page ids of block `block`'s TMA chunks, read a block ahead of their
// use so the refill does not wait on the block table.
__device__ __forceinline__ int block_pages(const MlaParams& p, const int* bt_row, int block, int kv_len) {
  const int lane = threadIdx.x & 31;
  return lane < 8 ? chunk_page(p, bt_row, block, lane, kv_len) : p.num_pages;
}

// Row c's running max after a block, from its four warps' column maxima (colmax[w][c], this
// warpgroup's); sc = 2^(old - new) rescales O and the sums, grew marks any row that moved.
// Shared by the bf16 and fp8 narrow kernels.
template <int kN>
__device__ __forceinline__ float next_running_max(const float (&colmax)[4][kN], int c, float& m_run, float& sc,
                                                  bool& grew) {
  const float bm = fmaxf(fmaxf(colmax[0][c], colmax[1][c]), fmaxf(colmax[2][c], colmax[3][c]));
  const float mn = fmaxf(m_run, bm);
  sc = exp2_approx(m_run - mn);
  grew |= sc != 1.f;
  m_run = mn;
  return mn;
}

template <int kN>
__device__ bool attention_narrow(const MlaParams& p) {
  constexpr int kT = kN / 8;       // column octets per thread: columns 8t + 2 q4 + {0, 1}
  constexpr int kAcc = kN / 2;     // fp32 registers of one m64nN accumulator
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  NarrowSmem<kN>& ss = *reinterpret_cast<NarrowSmem<kN>*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));

  const int tid = threadIdx.x, tw = tid % 128, lane = tid & 31, q4 = lane & 3;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform: wgmma under it is not serialized
  const int warp = tw / 32;
  const int r_a = 16 * warp + lane / 4, r_b = r_a + 8;  // accumulator rows: tokens (S^T) or V columns
  const uint32_t sQ = smem_u32(ss.q), sP = smem_u32(ss.p[wg]);
  const uint32_t stage = smem_u32(ss.kv[wg]), bars = smem_u32(&ss.bar[wg][0]);

  if (tid == 0) {
    for (int st = 0; st < 2; ++st)
      for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_init(smem_u32(&ss.bar[st][bx]), 1);
    fence_mbar_init();
  }
  __syncthreads();

  SplitList<kNumThreads> splits{static_plan_scratch<kNumThreads>()};
  const CtaRange cr = start_cta<kNumThreads, false>(p, splits.scratch, &splits.written);

  const auto [scale_log2, bmm2] = call_scales(p);
  // S^T stays unscaled (the column maxima and P's FFMA apply ps) unless ps is 1 for a zero,
  // negative or NaN scale (then scaled first: p_exp_scale).
  const float ps = p_exp_scale(scale_log2);
  uint32_t loads = 0;  // blocks loaded into this warpgroup's stage so far: the mbarrier phase count

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    tl_mark(kTlNUnitFound, loads);
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1, kv_len = unit.kv_len;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;

    // Q first (as the seesaw's prologue): warp 0's share of it must not wait behind its TMA,
    // which waits on the block table.
    const int first_page = tw < 32 && kb0 + wg < kb1 ? block_pages(p, bt_row, kb0 + wg, kv_len) : p.num_pages;
    load_q_rows<kN>(sQ, p, unit.q_row_base, unit.rows);
    cp_async_commit();
    if (tw < 32 && kb0 + wg < kb1) {
      issue_kv_half(p, stage, bars, kb0 + wg, 0, first_page, 0);
      issue_kv_half(p, stage, bars, kb0 + wg, 1, first_page, 0);
    }
    tl_mark(kTlNFirstIssued, loads);
    splits.write(p);
    cp_async_wait_all();
    fence_proxy_async_smem();
    __syncthreads();
    tl_mark(kTlNQLanded, loads);

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
      tl_mark(kTlNBlockStart, loads);
      // ---- S^T = K Q^T, box by box as they land -----------------------------------------
      float st[kAcc];
      wgmma_fence();
#pragma unroll
      for (int bx = 0; bx < kNumBoxesQK; ++bx) {
        kv_wait(bars + 8 * bx, par, kSiteQkBox);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          WgmmaN<kN, 0>::mma(st, make_smem_desc(stage + bx * kBoxBytes + kk * 32, 16, 1024),
                                  make_smem_desc(sQ + bx * kN * 128 + kk * 32, 16, 1024),
                                  bx == 0 && kk == 0 ? 0 : 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      tl_mark(kTlNQkDone, loads);
      fence_regs(st);

      // ---- mask, column maxima over the block's 64 tokens in the log2 domain ---------------
      const int tok_a = kb * kBlockN + r_a, tok_b = kb * kBlockN + r_b;
      if (ps != scale_log2) {
#pragma unroll
        for (int j = 0; j < kAcc; ++j) st[j] *= scale_log2;
      }
      float cm[kT][2];
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& xa = st[4 * t + e];
          float& xb = st[4 * t + 2 + e];
          xa = tok_a < lim[t][e] ? xa : -INFINITY;
          xb = tok_b < lim[t][e] ? xb : -INFINITY;
          float v = fmaxf(xa, xb);
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
          cm[t][e] = v * ps;
        }
      if (lane < 4)
#pragma unroll
        for (int t = 0; t < kT; ++t)
#pragma unroll
          for (int e = 0; e < 2; ++e) ss.colmax[wg][warp][8 * t + 2 * q4 + e] = cm[t][e];
      wg_barrier(wg);
      tl_mark(kTlNMaxShared, loads);

      // ---- running max, P = 2^(s - m) into sP as (rows, tokens), O^T rescaled ------------
      float sc[kT][2];
      bool grew = false;
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * t + 2 * q4 + e;
          const float mn = next_running_max(ss.colmax[wg], c, m_run[t][e], sc[t][e], grew);
          const float pa = exp2_approx(fmaf(st[4 * t + e], ps, -mn)), pb = exp2_approx(fmaf(st[4 * t + 2 + e], ps, -mn));
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
      tl_mark(kTlNPShared, loads);

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
      tl_mark(kTlNPvIssued, loads);
      wgmma_wait<1>();
      if (tw < 32 && next) issue_kv_half(p, stage, bars, kb + 2, 0, next_page, 0);
      wgmma_wait<0>();
      tl_mark(kTlNPvDone, loads);
#pragma unroll
      for (int i = 0; i < 8; ++i) fence_regs(acc[i]);

      // The rest of the stage (V boxes 4-7, the rope box) and sP are free: refill.
      loads += 1;
      if (tw < 32 && next) issue_kv_half(p, stage, bars, kb + 2, 1, next_page, 0);
    }
    wg_barrier_even_up<2>(wg, kb1 - kb0);
    tl_mark(kTlNEpilogue, loads);

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
    // Each reader sums the four warps' row sums itself (in colmax, written before the barrier like
    // m), as the fp8 narrow kernel does.
    __syncthreads();

    // Both warpgroups' O merged per row by all eight warps (store_unit_rows).
    {
      const int c = tid / (kNumThreads / kN);
      const float l0 = ss.colmax[0][0][c] + ss.colmax[0][1][c] + ss.colmax[0][2][c] + ss.colmax[0][3][c];
      const float l1 = ss.colmax[1][0][c] + ss.colmax[1][1][c] + ss.colmax[1][2][c] + ss.colmax[1][3][c];
      store_unit_rows<kN>(p, w, partial_slot(p, cr.set, grp, cr.lane_m), c, reinterpret_cast<const float*>(ss.kv[0]),
                          reinterpret_cast<const float*>(ss.kv[1]), ss.m[0][c], ss.m[1][c], l0, l1, 0.f, bmm2,
                          [](int v) { return v; });
    }
    // The next unit reuses the stages (they hold the merge buffers; its TMA writes must come
    // after these generic-proxy reads), Q, colmax and m.
    fence_proxy_async_smem();
    __syncthreads();
    tl_mark(kTlNUnitDone, loads);
  }
  splits.write(p);  // a CTA without a unit (no first loads to run it behind)
  return cr.planned;
}

}  // namespace jit_mla::sm90
