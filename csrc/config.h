// Every tile size and model dimension of jit-mla, in one place.
// Shapes assume DeepSeek-V3/R1 and Kimi-K2 absorbed MLA: one latent KV head whose row is
// [ckv (512) | kpe (64)] = 576 bf16; K is the whole row, V its first 512 columns.
#pragma once

namespace jit_mla {

constexpr int kHeadDimQK = 576;  // kv_lora_rank 512 + qk_rope_head_dim 64
constexpr int kHeadDimV = 512;   // kv_lora_rank

// A work tile: kBlockM rows of (query token x head) of one request against kBlockN KV tokens.
// 64 rows is the wgmma M; 64 tokens keeps Q + two KV stages (3 x 72 KiB) in 227 KiB of smem.
constexpr int kBlockM = 64;
constexpr int kBlockN = 64;

// Two math warpgroups; warpgroup w owns KV columns [32w, 32w+32) of S and output columns
// [256w, 256w+256) of O (a 64x512 fp32 O is 256 registers/thread for one warpgroup: too many).
constexpr int kNumWarpgroups = 2;
constexpr int kNumThreads = 128 * kNumWarpgroups;
constexpr int kSCols = kBlockN / kNumWarpgroups;    // 32
constexpr int kOCols = kHeadDimV / kNumWarpgroups;  // 256

// Shared memory is laid out in 64x64 bf16 boxes: 64 rows of 128 bytes, 128-byte swizzle
// (16-byte chunk index XOR row % 8), the canonical wgmma layout for K-major and MN-major.
constexpr int kBoxCols = 64;
constexpr int kBoxBytes = kBlockM * 128;            // 8 KiB
constexpr int kNumBoxesQK = kHeadDimQK / kBoxCols;  // 9
constexpr int kTileBytes = kNumBoxesQK * kBoxBytes; // 72 KiB: Q tile or one KV tile
constexpr int kNumStages = 2;                       // KV tiles in flight

// Split-KV planning. A unit (one 64-row tile of one request) costs its KV blocks plus a fixed
// overhead (Q load, epilogue, partial write), in KV-block units; a CTA set gets at least
// kMinBlocksPerCta blocks' cost beyond that overhead. 0: a call with little work spreads over
// as many SMs as have 2 blocks' cost each (B1 kv8192 H16: 65 CTAs of 2 blocks, 14.1 µs, against
// 33 of ~4 with 2: 16.0 µs; perf-notes Session 38). The merge's extra partials cost less than
// the KV round trips they take off each CTA's chain.
constexpr int kUnitOverheadBlocks = 2;
constexpr int kMinBlocksPerCta = 0;
constexpr int kWholeGroupSetsPct = 85;  // equal groups: give up to 15% of the sets to split nothing
constexpr int kPieceStartExtraBlocks = 1;  // a unit start's measured cost beyond kUnitOverheadBlocks
constexpr int kSlotsPerCta = 2;  // a CTA's range splits at most its first and its last unit
// The grid's cap (one CTA per SM: 132 on the H200, 148 on the B200; a larger device runs this
// many). The combine keeps one slot and one weight per split of a row in smem, per warp, so the
// cap sizes them and, with them, what is left of the smallest kernel's smem for its staging
// (combine.cuh: kStageChunks).
constexpr int kMaxCtas = 256;

// mbarrier.try_wait's suspend-time hint, ns (CUTLASS's value, 10 ms): a waiting warp may sleep
// until the phase completes or the hint runs out instead of spinning on issue slots the other
// warpgroup's softmax wants (measured: fp8 rows 0.6-1.5% faster, the rest within noise).
constexpr unsigned kWaitSuspendHintNs = 10000000;

}  // namespace jit_mla
