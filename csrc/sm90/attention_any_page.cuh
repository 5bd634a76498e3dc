// Split-KV MLA attention for sm_90a, any page size (1 included): cp.async loads, two math
// warpgroups splitting S by KV columns, wgmma. The TMA kernel (attention_seesaw.cuh) is faster;
// this one serves page sizes a TMA box cannot address (not 8, 16, 32, 64 or a multiple of 64).
//
// A CTA walks its range of work (units = 64 rows of (query token x head) of one request, each
// against a run of 64-token KV blocks). Per KV block:
//   S_w = Q K_w^T     warpgroup w computes its 32 KV columns (m64n32k16, 36 k-steps, smem A/B)
//   softmax           row max exchanged through smem, P (bf16) written to smem
//   O_w += P V_w      warpgroup w owns output columns [256w, 256w+256) (m64n256k16, V MN-major)
// KV tiles are double-buffered with cp.async (any page size; masked rows zero-filled).
#pragma once
#include <cuda_bf16.h>

#include "../common/device_utils.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "../common/units.cuh"
#include "../config.h"
#include "epilogue.cuh"
#include "tile_utils.cuh"
#include "smem_size.h"
#include "wgmma.cuh"
#include "wgmma_narrow.cuh"

namespace jit_mla::sm90 {


// KV tokens [block*64, block*64 + 64) of a request -> sK; tokens >= kv_extent zero-filled.
__device__ __forceinline__ void load_kv_tile(uint32_t sK, const MlaParams& p, const int* bt_row,
                                             int block, int kv_extent) {
  const int chunk = threadIdx.x & 7;
#pragma unroll
  for (int pass = 0; pass < kBlockN / 32; ++pass) {
    const int r = (threadIdx.x >> 3) + 32 * pass;
    const int tok = block * kBlockN + r;
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.kv);
    // A page id outside the pool reads as zeros (as the TMA kernel's out-of-bounds boxes do).
    const int page = tok < kv_extent ? bt_row[fast_div(tok, p.page_div)] : -1;
    const bool valid = page >= 0 && page < p.num_pages;
    if (valid) src += (long long)page * p.kv_page_stride + (long long)fast_mod(tok, p.page_div) * p.kv_row_stride;
    src += chunk * 8;
    const uint32_t dst = sK + swizzled(r, chunk);
#pragma unroll
    for (int box = 0; box < kNumBoxesQK; ++box)
      cp_async_16(dst + box * kBoxBytes, src + box * kBoxCols, valid);
  }
}

// Accumulator layout of wgmma m64nN (per warpgroup): thread (warp wq, lane) holds rows
// r_a = 16 wq + lane/4 and r_b = r_a + 8; element 4t+e sits at column 8t + 2(lane%4) + (e&1),
// row r_a for e < 2, r_b for e >= 2.
struct RowState {
  float m;  // running max of t = s * log2(e), -inf before any visible key
  float l;  // this thread's partial sum of 2^(t - m) (quad-reduced at the end)
};

__device__ bool attention_any_page(const MlaParams& p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  SharedStorage& ss =
      *reinterpret_cast<SharedStorage*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  const uint32_t sQ = smem_u32(ss.q), sP = smem_u32(ss.p);
  const uint32_t sK0 = smem_u32(ss.kv[0]);  // stage s at sK0 + s * kTileBytes

  const int tid = threadIdx.x;
  const int wg = tid / 128, lane = tid & 31, q4 = lane & 3;
  const int r_a = 16 * ((tid % 128) / 32) + lane / 4, r_b = r_a + 8;

  const CtaRange cr = start_cta<kNumThreads>(p);
  if (cr.group0 == cr.group_end) return cr.planned;

  const auto [scale_log2, bmm2] = call_scales(p);

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;
    const int lim_a = unit_row_limit(p, unit, r_a), lim_b = unit_row_limit(p, unit, r_b);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    RowState st_a{-INFINITY, 0.f}, st_b{-INFINITY, 0.f};

    if (kb0 < kb1) {
      load_q_tile(sQ, p, unit.q_row_base, unit.rows);
      load_kv_tile(sK0, p, bt_row, kb0, unit.kv_extent);
    }
    cp_async_commit();

    int stage = 0;
    for (int kb = kb0; kb < kb1; ++kb, stage ^= 1) {
      // Tile kb has landed for every thread; everyone is done with the other stage.
      cp_async_wait_all();
      fence_proxy_async_smem();
      __syncthreads();
      if (kb + 1 < kb1) load_kv_tile(sK0 + (stage ^ 1) * kTileBytes, p, bt_row, kb + 1, unit.kv_extent);
      cp_async_commit();

      const uint32_t sK = sK0 + stage * kTileBytes;
      // ---- S_w = Q K_w^T: (64 x 32) fp32 --------------------------------------------------
      float s[16];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDimQK / 16; ++kk) {
        const uint32_t koff = (kk / 4) * kBoxBytes + (kk % 4) * 32;
        const uint64_t da = make_smem_desc(sQ + koff, 16, 1024);
        const uint64_t db = make_smem_desc(sK + koff + wg * kSCols * 128, 16, 1024);
        WgmmaN<32, 0>::mma(s, da, db, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);

      // ---- mask, scale to the log2 domain, row max over both warpgroups -----------------
      float mx_a, mx_b;
      mask_scale(s, kb * kBlockN + wg * kSCols + 2 * q4, lim_a, lim_b, scale_log2, mx_a, mx_b);
      if (q4 == 0) {
        ss.row_max[wg][r_a] = mx_a;
        ss.row_max[wg][r_b] = mx_b;
      }
      named_barrier_sync(1, kNumThreads);
      const float new_a = fmaxf(st_a.m, fmaxf(ss.row_max[0][r_a], ss.row_max[1][r_a]));
      const float new_b = fmaxf(st_b.m, fmaxf(ss.row_max[0][r_b], ss.row_max[1][r_b]));
      // A row that has seen no key keeps max -inf; subtract 0 then so 2^(-inf) = 0, not NaN.
      const float use_a = new_a == -INFINITY ? 0.f : new_a;
      const float use_b = new_b == -INFINITY ? 0.f : new_b;
      const float alpha_a = exp2_approx(st_a.m - use_a);
      const float alpha_b = exp2_approx(st_b.m - use_b);
      st_a.m = new_a;
      st_b.m = new_b;

      // ---- P = 2^(t - m) -> bf16 in sP (this warpgroup's 32 columns) ---------------------
      float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
      for (int t = 0; t < kSCols / 8; ++t) {
        const float p0 = exp2_approx(s[4 * t + 0] - use_a), p1 = exp2_approx(s[4 * t + 1] - use_a);
        const float p2 = exp2_approx(s[4 * t + 2] - use_b), p3 = exp2_approx(s[4 * t + 3] - use_b);
        sum_a += p0 + p1;
        sum_b += p2 + p3;
        const int chunk = wg * (kSCols / 8) + t;  // 16-byte chunk of the 128-byte row
        *reinterpret_cast<uint32_t*>(ss.p + swizzled(r_a, chunk) + 4 * q4) = pack_bf16x2(p0, p1);
        *reinterpret_cast<uint32_t*>(ss.p + swizzled(r_b, chunk) + 4 * q4) = pack_bf16x2(p2, p3);
      }
      st_a.l = st_a.l * alpha_a + sum_a;
      st_b.l = st_b.l * alpha_b + sum_b;
      fence_proxy_async_smem();
#pragma unroll
      for (int t = 0; t < kOCols / 8; ++t) {
        o[4 * t + 0] *= alpha_a; o[4 * t + 1] *= alpha_a;
        o[4 * t + 2] *= alpha_b; o[4 * t + 3] *= alpha_b;
      }
      named_barrier_sync(2, kNumThreads);  // both halves of P are in sP

      // ---- O_w += P V_w: V = first 512 columns of the KV tile, read MN-major -------------
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t da = make_smem_desc(sP + kk * 32, 16, 1024);
        const uint64_t db = make_smem_desc(
            sK + (wg * (kOCols / kBoxCols)) * kBoxBytes + kk * 16 * 128, kBoxBytes, 1024);
        wgmma_m64n256k16_ss_tnspb(o, da, db, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
    }

    // ---- epilogue: full row sums, normalize, write the output or this split's partial ----
    const float l_a = quad_sum(st_a.l), l_b = quad_sum(st_b.l);
    if (q4 == 0) {
      ss.row_sum[wg][r_a] = l_a;
      ss.row_sum[wg][r_b] = l_b;
    }
    named_barrier_sync(1, kNumThreads);
    const float tot_a = ss.row_sum[0][r_a] + ss.row_sum[1][r_a];
    const float tot_b = ss.row_sum[0][r_b] + ss.row_sum[1][r_b];
    store_unit_result(p, w, partial_slot(p, cr.set, grp, cr.lane_m), wg, r_a, r_b, q4, o, st_a.m, st_b.m,
                      tot_a, tot_b, bmm2);
    // The next unit's loads overwrite sQ/sK and its epilogue row_sum: everyone must be past
    // this one's reads.
    __syncthreads();
  }
  return cr.planned;
}

}  // namespace jit_mla::sm90
