// What both sm_90a attention kernels do around each unit: find its KV range in the plan, and at
// the end write either the final output (unsplit) or this split's partial for the combine
// (common/combine.cuh, the kernel's last phase).
#pragma once
#include <cuda_bf16.h>

#include "../common/device_utils.cuh"
#include "../common/finalize.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "../common/plan_cache.cuh"
#include "../common/probe.h"
#include "../common/units.cuh"
#include "../config.h"
#include "smem_size.h"

namespace jit_mla::sm90 {

// This CTA's share of the plan: CTA set `set` (m_group CTAs side by side) owns
// [bounds[set], bounds[set+1]); the CTA runs unit `lane_m` of each group there, over the same KV
// blocks as its partners (L2 serves them). Groups are [group0, group_end).
struct CtaRange {
  int set, lane_m;
  WorkPos beg, end;
  int group0, group_end;
  bool planned;  // this CTA planned (did not reuse the workspace's plan): the last CTA then publishes it
};

__device__ __forceinline__ CtaRange cta_range(const MlaParams& p) {
  CtaRange r;
  r.set = blockIdx.x >> p.m_group_log2;
  r.lane_m = blockIdx.x & (p.m_group - 1);
  r.beg = p.bounds[r.set];
  r.end = p.bounds[r.set + 1];
  r.group0 = r.beg.group;
  r.group_end = r.end.block > 0 ? r.end.group + 1 : r.end.group;
  if (r.beg.group == r.end.group && r.beg.block == r.end.block) r.group_end = r.group0;  // empty
  return r;
}

// The call's two scales, floats from the launcher or one-element device tensors (so read after
// the PDL wait): bmm1 in the softmax's log2 domain, bmm2 as given.
struct CallScales {
  float qk_log2, out;
};
__device__ __forceinline__ CallScales call_scales(const MlaParams& p) {
  return CallScales{load_scale(p.bmm1_scale_ptr, p.bmm1_scale) * kLog2e, load_scale(p.bmm2_scale_ptr, p.bmm2_scale)};
}

// The scale P's exponent applies to unscaled scores, P = 2^(s ps - m): the call's log2 scale
// when it is > 0 (only then is the max of the raw scores times it the max of the scaled ones);
// else 1, and the kernel scales S first (a zero, negative or NaN scale: rare, and a device
// tensor's value is never checked on the host).
__device__ __forceinline__ float p_exp_scale(float scale_log2) { return scale_log2 > 0.f ? scale_log2 : 1.f; }

// How every attention CTA starts: nothing the previous kernel in the stream writes (inputs, or
// the previous call still reading the workspace) may be touched before the PDL wait; then the
// next kernel may launch (it waits for our completion before it reads anything), this CTA reuses
// the plan in the workspace when it was made from this call's inputs (plan_cache.cuh), or plans
// the call's splits (as every CTA does) and takes its share. kListSplits: the plan's split list
// too; false: the kernel writes the list later (SplitList; *listed is set when the plan was
// reused: nothing left to write). The last CTA publishes a plan it made once every CTA has
// checked (cr.planned; mla_sm90.cu, plan_cache.cuh).
// scratch: the planner's shared memory (free again when the split list is written).
template <int kThreads, bool kListSplits = true>
__device__ __forceinline__ CtaRange start_cta(const MlaParams& p, PlanScratch<kThreads>& scratch,
                                              bool* listed = nullptr) {
  pdl_wait_primary();
  trace_mark(kMarkReady);
  pdl_launch_dependents();
  // The check's result is the same in every thread (a barrier's reduction); the shuffle from
  // lane 0 says so to ptxas, which otherwise serializes the kernel's wgmmas (its note C7520) for
  // a branch around the plan's barriers.
  const bool reuse = __shfl_sync(0xffffffffu, plan_in_workspace<kThreads>(p), 0);
  if (!reuse) {
    plan_splits<kThreads>(p, scratch);
    if constexpr (kListSplits) list_split_groups<kThreads>(p, scratch);
  } else if (listed != nullptr) {
    *listed = true;
  }
  CtaRange cr = cta_range(p);  // after a reuse, L1 hits: the check loaded these words
  cr.planned = !reuse;
  if (kListSplits || reuse) unsplit_arrive(p);  // else SplitList::write, once the count is known
  trace_mark(kMarkPlanned);
  trace_range(cr.beg.group, cr.beg.block, cr.end.group, cr.end.block);
  return cr;
}
// The planner's scratch in static shared memory.
template <int kThreads>
__device__ __forceinline__ PlanScratch<kThreads>& static_plan_scratch() {
  __shared__ PlanScratch<kThreads> scratch;
  return scratch;
}
// With the planner's scratch in static shared memory (most kernels).
template <int kThreads>
__device__ __forceinline__ CtaRange start_cta(const MlaParams& p) {
  return start_cta<kThreads>(p, static_plan_scratch<kThreads>());
}

// The plan's split list (list_split_groups) written by the kernel after start_cta<kThreads,
// false>: once per CTA, by all its threads (it has barriers), before the merge; nothing when
// start_cta reused the plan (it sets `written`). The kernel
// calls write() behind its first unit's loads, where its threads would wait for them anyway,
// and once more after its unit loop, where it writes only in a CTA that had no unit. The narrow
// bf16 kernel does (B1 kv8192 H16 3% faster); in the seesaw and fp8 kernels it measured 1-4%
// slower at B8 and on the large H128 rows (their code and registers moved; Session 37).
template <int kThreads>
struct SplitList {
  PlanScratch<kThreads>& scratch;
  bool written = false;
  __device__ __forceinline__ void write(const MlaParams& p) {
    if (written) return;
    list_split_groups<kThreads>(p, scratch);
    unsplit_arrive(p);
    written = true;
  }
};

// One unit of a group, as a CTA of set `set` (lane lane_m) runs it.
struct UnitWork {
  bool valid;   // false: the request's last group has no unit in this lane
  Unit unit;
  int kb0, kb1; // KV blocks to run, clipped to the unit's own extent (may be empty)
  bool split;   // decided per group, so all its units agree with the combine
};

__device__ __forceinline__ UnitWork unit_work(const MlaParams& p, int grp, int lane_m, WorkPos beg,
                                              WorkPos end) {
  UnitWork w{};
  const int b = find_request(p, grp);
  const int j = grp - p.group_prefix[b];
  const int m = j * p.m_group + lane_m;
  w.valid = m < request_num_units(p, b);
  if (!w.valid) return w;
  w.unit = make_unit(p, b, m);
  const int group_blocks = group_num_blocks(p, b, j);
  const int gkb0 = grp == beg.group ? beg.block : 0;
  const int gkb1 = grp == end.group ? end.block : group_blocks;
  w.split = gkb0 > 0 || gkb1 < group_blocks;
  // A unit that sees fewer blocks than its group clips the range (possibly to nothing: it then
  // writes an empty partial, lse -inf).
  w.kb0 = min(gkb0, w.unit.num_blocks);
  w.kb1 = min(gkb1, w.unit.num_blocks);
  return w;
}

// KV tokens row r of the unit may see; rows past the unit see the extent so that they stay
// finite (they are never written).
__device__ __forceinline__ int unit_row_limit(const MlaParams& p, const Unit& u, int r) {
  return r < u.rows ? row_kv_limit(u.kv_len, u.q_len, fast_div(u.row0 + r, p.head_div)) : u.kv_extent;
}

// A row's log2-sum-exp over the keys it saw (-inf: none) and the factor 1 / sum (0 then) that
// normalizes its O. m: its final running max (log2 domain), tot: its softmax sum relative to it.
struct RowNorm {
  float lse, f;
};
__device__ __forceinline__ RowNorm row_norm(float m, float tot) {
  const bool seen = tot > 0.f && m != -INFINITY;
  return RowNorm{seen ? m + log2_approx(tot) : -INFINITY, seen ? rcp_approx(tot) : 0.f};
}

// Row r's destination (512 bf16) in a unit's result: the split's partial row (partial_row: the
// first half of slot's [64, 512] fp32, as bf16) and its LSE, or the output row (out: [total_q *
// H, 512] bf16) with finalize_row's scale (sinks) folded into f and the call's LSE. lse: the row's
// row_norm LSE; write_lse: this thread writes the row's LSE (one thread per valid row).
__device__ __forceinline__ __nv_bfloat16* row_destination(const MlaParams& p, const UnitWork& w, int slot, int r,
                                                          float lse, float bmm2, bool write_lse, float& f) {
  const Unit& u = w.unit;
  if (w.split) {
    if (write_lse) p.partial_lse[slot * kBlockM + r] = lse;
    return partial_row(p, slot, r);
  }
  const RowFinal fin = finalize_row(lse, p.sinks, fast_mod(u.row0 + r, p.head_div), bmm2);
  f *= fin.scale;
  if (write_lse && p.lse != nullptr) p.lse[u.q_row_base + r] = fin.lse;
  return static_cast<__nv_bfloat16*>(p.out) + (u.q_row_base + r) * kHeadDimV;
}

// Writes this warpgroup's half of O (columns [256 wg, 256 wg + 256), m64n256 accumulator layout:
// rows r_a, r_b = r_a + 8; element 4t+e at column 8t + 2 q4 + (e&1)). m: the rows' final running
// max (log2 domain), tot: their full softmax denominators relative to it.
__device__ __forceinline__ void store_unit_result(const MlaParams& p, const UnitWork& w, int slot,
                                                  int wg, int r_a, int r_b, int q4,
                                                  const float (&o)[128], float m_a, float m_b,
                                                  float tot_a, float tot_b, float bmm2) {
  const RowNorm na = row_norm(m_a, tot_a), nb = row_norm(m_b, tot_b);
  float f_a = na.f, f_b = nb.f;
  const bool ok_a = r_a < w.unit.rows, ok_b = r_b < w.unit.rows;
  const bool lse_writer = wg == 0 && q4 == 0;
  __nv_bfloat16* dst_a = row_destination(p, w, slot, r_a, na.lse, bmm2, lse_writer && ok_a, f_a);
  __nv_bfloat16* dst_b = row_destination(p, w, slot, r_b, nb.lse, bmm2, lse_writer && ok_b, f_b);
  // bf16 pairs. Lanes q4 and q4 ^ 1 swap one pair so that each writes 4 columns (8 bytes) of
  // column octet t (even q4) or t + 1 (odd q4): a warp's store then fills whole 32-byte sectors
  // (8 rows x octets t, t + 1), not halves (as 4-byte stores would).
  const bool odd = q4 & 1;
  // This lane's first column, less 8 t: octet t's (even q4) or octet t + 1's (odd q4).
  const int col0 = wg * kOCols + 2 * (q4 & 2) + (odd ? 8 : 0);
#pragma unroll
  for (int t = 0; t < kOCols / 8; t += 2) {
    const uint32_t a0 = pack_bf16x2(o[4 * t + 0] * f_a, o[4 * t + 1] * f_a);
    const uint32_t a1 = pack_bf16x2(o[4 * t + 4] * f_a, o[4 * t + 5] * f_a);
    const uint32_t b0 = pack_bf16x2(o[4 * t + 2] * f_b, o[4 * t + 3] * f_b);
    const uint32_t b1 = pack_bf16x2(o[4 * t + 6] * f_b, o[4 * t + 7] * f_b);
    const uint32_t ra = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 1);
    const uint32_t rb = __shfl_xor_sync(0xffffffffu, odd ? b0 : b1, 1);
    if (ok_a) *reinterpret_cast<uint2*>(dst_a + col0 + 8 * t) = odd ? make_uint2(ra, a1) : make_uint2(a0, ra);
    if (ok_b) *reinterpret_cast<uint2*>(dst_b + col0 + 8 * t) = odd ? make_uint2(rb, b1) : make_uint2(b0, rb);
  }
}

// The narrow kernels' unit result (units of kN <= 32 rows), from their merge buffers: both
// warpgroups' O^T as (kN rows, 512) fp32 at ob0 / ob1, rows kMergeStride floats apart, column v
// at swz(v), a permutation that keeps each aligned group of 4 columns in one aligned 16 bytes,
// with its two pairs in order or swapped. The calling thread owns row c (threadIdx.x /
// (256 / kN)) and every (256 / kN)-th 4-column group of it: all eight warps store (in the
// 64-row layout of store_unit_result a 16-row unit is one warp's per warpgroup: the narrow
// epilogue took ~5,700 cycles that way, ~2,600 this way), each eight threads read 128 contiguous
// bytes (no bank conflict) and each row's threads write a contiguous 64 or 128 bytes. Row c's
// running maxima m0, m1 and softmax sums l0, l1 of the two warpgroups are merged here: O = ob0 f0
// + ob1 f1 with f = 2^(m - max); m_shift is the log2 factor the kernel's P carried (the fp8
// kernels' e4m3 offset; 0 for bf16), taken off the final max as row_norm wants it.
template <int kN, class Swz>
__device__ __forceinline__ void store_unit_rows(const MlaParams& p, const UnitWork& w, int slot, int c,
                                                const float* ob0, const float* ob1, float m0, float m1,
                                                float l0, float l1, float m_shift, float bmm2, Swz swz) {
  constexpr int kPerRow = kNumThreads / kN;       // threads per row: 16 or 8
  constexpr int kSteps = kHeadDimV / 4 / kPerRow;  // 4-column groups per thread: 8 or 16
  static_assert(kPerRow * kN == kNumThreads && kSteps * 4 * kPerRow == kHeadDimV, "rows split evenly");
  const Unit& u = w.unit;
  if (c >= u.rows) return;
  const int j = threadIdx.x % kPerRow;
  const float mx = fmaxf(m0, m1);
  const float f0 = exp2_approx(m0 - mx), f1 = exp2_approx(m1 - mx);
  const RowNorm rn = row_norm(mx - m_shift, l0 * f0 + l1 * f1);
  float f = rn.f;
  __nv_bfloat16* dst = row_destination(p, w, slot, c, rn.lse, bmm2, j == 0, f);
  const float* row0 = ob0 + c * kMergeStride;
  const float* row1 = ob1 + c * kMergeStride;
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const int col = 4 * (j + kPerRow * i);
    const int at = swz(col);
    const float4 a = *reinterpret_cast<const float4*>(row0 + (at & ~3));
    const float4 b = *reinterpret_cast<const float4*>(row1 + (at & ~3));
    const bool swap = (at & 2) != 0;  // columns col, col + 1 in the upper pair
    const float v0 = a.x * f0 + b.x * f1, v1 = a.y * f0 + b.y * f1;
    const float v2 = a.z * f0 + b.z * f1, v3 = a.w * f0 + b.w * f1;
    const uint32_t lo = swap ? pack_bf16x2(v2 * f, v3 * f) : pack_bf16x2(v0 * f, v1 * f);
    const uint32_t hi = swap ? pack_bf16x2(v0 * f, v1 * f) : pack_bf16x2(v2 * f, v3 * f);
    *reinterpret_cast<uint2*>(dst + col) = make_uint2(lo, hi);
  }
}

}  // namespace jit_mla::sm90
