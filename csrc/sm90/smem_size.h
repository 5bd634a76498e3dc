// Shared-memory layout of the sm_90a attention kernel; host-visible so the launcher can raise
// the kernel's dynamic shared-memory limit to exactly what it uses.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../config.h"

namespace jit_mla::sm90 {

struct SharedStorage {
  uint8_t q[kTileBytes];              // sQ: (64 rows, 576) bf16, 9 boxes of (64, 64), swizzled
  uint8_t kv[kNumStages][kTileBytes]; // sK: (64 tokens, 576) bf16 per stage, same layout
  uint8_t p[kBoxBytes];               // sP: (64 rows, 64 tokens) bf16, one swizzled box
  float row_max[kNumWarpgroups][kBlockM];  // per-warpgroup row max of the current block
  float row_sum[kNumWarpgroups][kBlockM];  // per-warpgroup row sums at the end of a unit
};
// The seesaw kernel: Q, two whole KV blocks, WG1's P; WG0's P goes into box 8 (the K rope part) of
// its block's stage once its QK^T is done with it.
struct SeesawSmem {
  uint8_t q[kTileBytes];              // sQ: (64 rows, 576) bf16
  uint8_t kv[2][kTileBytes];          // sK: stage s holds the unit's blocks kb0 + s, kb0 + s + 2, ...
  uint8_t p1[kBoxBytes];              // sP1: (64, 64) bf16, WG1's P
  float m[kBlockM];                   // running row max (log2 domain), shared by both warpgroups
  float scale0[kBlockM];              // WG0 -> WG1: 2^(m_prev - m0)
  float scale1[kBlockM];              // WG1 -> WG0: 2^(m0 - m1)
  float row_sum[kNumWarpgroups][kBlockM];
  uint64_t bar[2][kNumBoxesQK];       // TMA mbarriers: [stage][box], 8 KB each
  uint64_t hand[4];                   // warpgroup hand-offs (128 arrivals each): kNumHand in attention_seesaw
};
constexpr int kSeesawSmemBytes = (int)sizeof(SeesawSmem) + 1024;
// +128: the planner's static shared memory (80 B: warp totals of its scans) comes on top.
static_assert(kSeesawSmemBytes + 128 <= 227 * 1024, "shared memory over the sm_90 per-block limit");

// +1 KiB: the dynamic smem base is re-aligned to 1024 B, which the 128B swizzle pattern needs.
constexpr int kAttentionSmemBytes = (int)sizeof(SharedStorage) + 1024;
static_assert(kAttentionSmemBytes + 128 <= 227 * 1024, "shared memory over the sm_90 per-block limit");

// The narrow kernel (attention_narrow.cuh; units of at most kN = 16 or 32 rows): two KV stages,
// one per warpgroup, Q as (kN, 576), each warpgroup's P as (kN, 64).
template <int kN>
struct NarrowSmem {
  uint8_t kv[2][kTileBytes];         // stage w: warpgroup w's KV blocks (64 tokens, 576) bf16
  uint8_t q[kNumBoxesQK][kN * 128];  // Q rows (kN, 576) bf16 as 9 swizzled boxes of (kN, 64)
  uint8_t p[2][kN * 128];            // warpgroup w's P: (kN rows, 64 tokens) bf16, swizzled
  float colmax[2][4][kN];            // per warpgroup and warp: a block's column maxima / sums
  float m[2][kN];                    // end of a unit: each warpgroup's running max per row
  uint64_t bar[2][kNumBoxesQK];      // TMA mbarriers: [stage][box]
};
template <int kN>
constexpr int narrow_smem_bytes() {
  return (int)sizeof(NarrowSmem<kN>) + 1024;  // + re-alignment of the dynamic smem base to 1 KiB
}
static_assert(narrow_smem_bytes<16>() + 128 <= 227 * 1024, "shared memory over the sm_90 per-block limit");

// The fp8 narrow kernel (attention_narrow_fp8.cuh): KV blocks stay fp8 in shared memory (9
// boxes of (64 tokens, 64) e4m3 in the 64B swizzle, 36 KiB; K read by fp8 wgmmas from there, V
// through registers), so a stage is half a bf16 one and each warpgroup keeps two blocks in
// flight: stages 2w and 2w + 1 (contiguous: together they hold the warpgroup's (kN, 512) fp32 O
// at the end of a unit). Q is
// two e4m3 rows per query row (hi, lo; an e4m3 query: one) in the 64B swizzle; P is e4m3 rows
// (hi, lo; an e4m3 query: hi only) with permuted columns (the kernel's header says why).
constexpr int kFp8BoxBytes = kBlockN * kBoxCols;               // 4 KiB
constexpr int kFp8TileBytes = kNumBoxesQK * kFp8BoxBytes;      // 36 KiB
template <int kN>
struct NarrowFp8Smem {
  uint8_t kv[4][kFp8TileBytes];      // stages 2w, 2w + 1: warpgroup w's blocks, alternating
  uint8_t q[kNumBoxesQK][kN * 128];  // Q as (2 kN rows: hi, lo; 576) e4m3, 9 boxes of (2 kN, 64) bytes
  uint8_t p[2][kN * 128];            // warpgroup w's P: (2 kN rows: hi, lo; 64 tokens) e4m3, 64B swizzle, permuted
  float colmax[2][4][kN];            // per warpgroup and warp: a block's column maxima, or at
                                     // the end of a unit the warp's row sums
  float m[2][kN];                    // end of a unit: each warpgroup's running max per row
  int qexp[2][kN];                   // Q row c was stored as q * 2^-qexp[w][c] (e4m3 range), per warpgroup
  float m_prom[2][2][kN];            // [w][parity]: row maxima of warpgroup w's promoted O^T
  uint64_t bar[4][kNumBoxesQK];      // TMA mbarriers: [stage][box]
};
template <int kN>
constexpr int narrow_fp8_smem_bytes() {
  return (int)sizeof(NarrowFp8Smem<kN>) + 1024;
}
static_assert(narrow_fp8_smem_bytes<32>() + 128 <= 227 * 1024, "shared memory over the sm_90 per-block limit");

// The wide fp8 kernel (attention_wide_fp8.cuh; 64-row units, e4m3 query and cache): four fp8
// stages (warpgroup w's blocks in 2w, 2w + 1, alternating; PV reads both warpgroups'), Q as
// (64, 576) e4m3, each warpgroup's P as (64 rows, 64 token positions) e4m3.
struct WideFp8Smem {
  uint8_t kv[4][kFp8TileBytes];      // 9 boxes of (64 tokens, 64) e4m3, 64B swizzle
  uint8_t q[kNumBoxesQK][kFp8BoxBytes];  // Q (64 rows, 576) e4m3 as 9 boxes of (64, 64), 64B swizzle
  uint8_t p[2][kFp8BoxBytes];        // warpgroup w's block's P: 2^8 P in e4m3, permuted columns
  float colmax[2][4][kBlockM];       // per warpgroup and warp: a block's column maxima (rows of
                                     // Q), or at the end of a unit the warp's row sums
  float m[kBlockM];                  // end of a unit: the running max per row
  float fin[kBlockM];                // end of a unit: the factor of each output row
  float m_prom[2][kBlockM];          // row maxima of the unit's promoted O^T, by promotion parity
  uint64_t bar[4][kNumBoxesQK];      // TMA mbarriers: [stage][box]
  uint64_t vfree[4];                 // per stage: both warpgroups done reading its block
};
constexpr int kWideFp8SmemBytes = (int)sizeof(WideFp8Smem) + 1024;
static_assert(kWideFp8SmemBytes + 128 <= 227 * 1024, "shared memory over the sm_90 per-block limit");

// The wide fp8 kernel with a bf16 query (mode 1): Q as hi + lo e4m3 rows (two sets of 9 boxes) and
// P as hi + lo. Four stages still fit, just: P hi goes into box 8 (K's rope part) of its block's
// stage, free once that block's QK^T is done (PV reads boxes 0-7); P lo has its own boxes. The
// running max of the promoted O^T stays in registers, the end-of-unit row max is shuffled, the
// output factors go into plo after the last PV, and the planner's scratch is lent from colmax
// (start_cta): no static shared memory, no 1 KiB re-alignment pad; the kernel checks that the
// dynamic base is 512-byte aligned (the 64B swizzle's atom) within the 192 bytes to spare.
struct WideFp8BSmem {
  uint8_t kv[4][kFp8TileBytes];                // as WideFp8Smem; box 8 holds P hi after QK^T
  uint8_t q[2][kNumBoxesQK][kFp8BoxBytes];     // Q hi rows, then lo rows: 9 boxes of (64, 64) each
  uint8_t plo[2][kFp8BoxBytes];                // warpgroup w's block's P lo (same scale as hi)
  float colmax[2][4][kBlockM];                 // as WideFp8Smem
  float psc[kBlockM];                          // row c's scale in P's exponent (1: scaled first)
  float rsc[kBlockM];                          // row c's score scale (call scale x 2^qexp; NaN: Q not finite)
  uint64_t bar[4][kNumBoxesQK];                // TMA mbarriers: [stage][box]
  uint64_t vfree[4];                           // per stage: both warpgroups' PV of its block retired
};
constexpr int kSmemOptin = 227 * 1024;  // sm_90's per-block limit (static + dynamic)
constexpr int kWideFp8BSmemBytes = kSmemOptin;
static_assert(sizeof(WideFp8BSmem) <= kSmemOptin, "shared memory over the sm_90 per-block limit");
static_assert(offsetof(WideFp8BSmem, colmax) % 512 == 0, "the swizzled tiles are whole 512-byte atoms");

// The end of a unit merges the two warpgroups' O (kN rows, 512) fp32, each in its own stage, rows
// kMergeStride floats apart (8 more than 512: the bf16 kernel's scattered O^T stores of 8 rows
// then hit 8 bank groups; the fp8 kernel writes through its merge_swizzle). store_unit_rows
// reads them back by 4-column groups, 128 contiguous bytes per 8 threads.
constexpr int kMergeStride = kHeadDimV + 8;
static_assert(32 * kMergeStride * 4 <= kTileBytes, "a warpgroup's O fits in its stage");
static_assert(32 * kMergeStride * 4 <= 2 * kFp8TileBytes, "a warpgroup's O fits in its two fp8 stages");

}  // namespace jit_mla::sm90
