// The narrow kernel (attention_narrow.cuh: transposed tiles, units of at most kN = 16 or 32 rows)
// for a float8_e4m3fn KV cache, with a bf16 query or (kQ8, mode 2) an e4m3 one. The cache stays
// fp8 in shared memory (boxes of 64 tokens x 64 bytes in the 64B swizzle, as TMA writes them), and
// both matmuls run on e4m3 wgmmas:
//   S^T = K Q^T     both operands from shared memory: A = the K boxes as they landed, B = Q. A bf16
//                   query is split into two e4m3 rows per query row (hi, lo: exact for bf16
//                   elements down to ~2^-13 of the row's largest, see store_q_rows_e4m3), N = 2 kN,
//                   s = S_hi + S_lo / 16; an e4m3 query is used as it is (N = kN). No conversion
//                   of K. (Hopper's fp8 wgmma accumulates with reduced precision, ~14 bits per
//                   DeepSeek-V3; within the tests' tolerances over 576 products, fuzz included.)
//   O^T += V^T P^T  A = V^T from registers: per 16 V columns and 32 tokens one ldmatrix .trans
//                   and 4 byte permutes, no conversion; B = 2^8 P in e4m3 (FlashAttention-3's
//                   offset: e4m3 keeps P down to 2^-17 of the row max), the row sum from P before
//                   rounding. With a bf16 query P is kept to bf16's precision as hi + lo, two
//                   e4m3 rows of the same scale (lo = the rounding error of hi), multiplied in two
//                   passes over the same V fragments; with an e4m3 query P is one e4m3 row.
// Against converting each block to bf16 in shared memory, this halves the shared-memory traffic
// per block (no bf16 tile written and re-read by the wgmmas) and the stage size, so each
// warpgroup keeps two blocks in flight (smem_size.h, NarrowFp8Smem).
// kTma: the blocks land by TMA (page sizes 8, 16, 32, 64 or multiples of 64, as the bf16 narrow
// kernel); else by cp.async, each thread copying half a token row (any page size, 1 included) into
// the same swizzled layout, its copies arriving on the stage's mbarrier when complete (expected
// count 128).
//
// Permutations (PV only). A dot product does not care about the order of its terms, and wgmma's
// fragment layout does not match the bytes a thread can load at once. So the reduction dimension
// is permuted, the same way in A and B: PV k-step s (32 tokens) of thread q (lane % 4) holds at
// positions 4 q + j the tokens 32 s + {2q, 8 + 2q, 2q + 1, 9 + 2q}[j], and at 16 + 4 q + j the same
// 16 tokens later; so the block's token 16 w + r (w < 4, r < 16) is at position 16 w + 2 (r % 8) +
// r / 8, and the two tokens of an S^T accumulator row pair (r_a, r_a + 8) are adjacent bytes of P.
// The M dimension of PV (V columns) is permuted too, undone when O is written: row r + 8 h of warp
// w's slice of tile i is V column 16 (8 w + i) + 2 r + h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/device_utils.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "../common/units.cuh"
#include "../config.h"
#include "attention_narrow.cuh"  // wg_barrier, block_pages
#include "attention_seesaw.cuh"  // kv_wait, kMaxInit
#include "epilogue.cuh"
#include "smem_size.h"
#include "tile_utils.cuh"
#include "wgmma.cuh"

namespace jit_mla::sm90 {

// D(64 x N, fp32) (+)= A(64 x 32, e4m3, shared memory) * B(N x 32, e4m3, shared memory), both
// K-major (fp8 wgmma takes no transposed operand).
template <int N>
struct WgmmaSsE4m3;

template <>
struct WgmmaSsE4m3<16> {
  static __device__ __forceinline__ void mma(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};

template <>
struct WgmmaSsE4m3<32> {
  static __device__ __forceinline__ void mma(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};

template <>
struct WgmmaSsE4m3<64> {
  static __device__ __forceinline__ void mma(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
};

// D(64 x N, fp32) += A(64 x 32, e4m3, registers: a0 row r, k 4 q4 + [0, 4); a1 row r + 8; a2, a3
// the same at k + 16) * B(N x 32, e4m3, shared memory, K-major). Always accumulates (scale-d is
// a predicate set true, as the other wrappers pass it).
template <int N>
struct WgmmaRsE4m3;

template <>
struct WgmmaRsE4m3<16> {
  static __device__ __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
};

template <>
struct WgmmaRsE4m3<32> {
  static __device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, "
        "1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
};

template <>
struct WgmmaRsE4m3<64> {
  static __device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
  }
};

// Four 8x8 matrices of 16-bit elements, transposed (ldmatrix .trans): lanes 8 j .. 8 j + 7 give
// the row addresses of matrix j (16 bytes each); lane (r8, q4) receives in r[j] the elements
// (row 2 q4, column r8) and (row 2 q4 + 1, column r8), the lower row in the lower half.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Shared-memory descriptor of a K-major operand in the 64B swizzle (rows of 64 bytes, 8-row atoms
// of 512 bytes).
__device__ __forceinline__ uint64_t make_smem_desc_sw64(uint32_t smem_addr) {
  return make_smem_desc(smem_addr, 16, 512, kLayoutSw64);
}

// Byte offset of 16-byte chunk `chunk` (0..3) of row r in a 64B-swizzled box (rows of 64 bytes):
// the chunk index is XORed with bits 1-2 of the row, as TMA's 64B swizzle writes it.
__device__ __forceinline__ int sw64(int r, int chunk) { return r * 64 + ((chunk ^ ((r >> 1) & 3)) << 4); }

// Bytes of one Q box (2 kN rows: hi, lo; 64 columns) and of one e4m3 k-step (k32) inside a row.
template <int kN>
constexpr int kFp8QBoxBytes = 2 * kN * kBoxCols;
constexpr int kFp8KStepBytes = 32;

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float exp2_int(int e) { return __int_as_float((127 + e) << 23); }

// The merge buffer's column of V column v: bits 1-3 flipped by (v / 16) % 8 (bit 0 stays: float2
// pairs stay adjacent). Written when a lane's stores were 16 columns apart; with today's V column
// order (header) a warp's stores are 2 columns apart, the flip is the same for the whole warp and
// costs nothing (the epilogue reads through it too).
__device__ __forceinline__ int merge_swizzle(int v) { return v ^ (2 * ((v >> 4) & 7)); }

// Two e4m3 from floats (x0 in the low byte), rounded to nearest; out of range saturates to +-448
// (the caller keeps its values below 2^8 + 2^4).
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float x0, float x1) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(x1), "f"(x0));
  return d;
}
// Two e4m3 (low 16 bits) back to floats, exactly.
__device__ __forceinline__ float2 e4m3x2_to_f32x2(uint32_t v) {
  uint32_t h;
  asm("{\n.reg .b16 l;\ncvt.u16.u32 l, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(h) : "r"(v));
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Q row c is split into two e4m3 rows: hi = e4m3(q 2^-e_c) and lo = e4m3(16 (q 2^-e_c - hi)), so
// that q 2^-e_c = hi + lo / 16 exactly for every bf16 element down to ~2^-13 of the row's
// largest (bf16 has 8 significant bits; hi keeps the top 4, the rest has at most 4); e_c puts the
// row's largest |q| in [2^7, 2^8), below e4m3's 448. S^T = K [hi; lo]^T is then one fp8 wgmma of
// N = 2 kN, and s = S_hi + S_lo / 16.
constexpr float kQLoScale = 16.f;
// qexp of a row holding inf or NaN: its scores are made NaN (e4m3 saturates inf; the reference
// gives NaN there).
constexpr int kQexpNonFinite = 1 << 30;

// Query row row_base + c (bf16): this thread's chunks (kP consecutive lanes per row, kChunks
// 16-byte chunks each: chunk part + kP k) into v, zero for a row past the request's (!valid).
// Loads only: the caller may issue other work (a TMA that waits on the block table) before the
// first use of v.
template <int kP, int kChunks>
__device__ __forceinline__ void load_q_row_bf16_raw(const MlaParams& p, long long row_base, int c, int part,
                                                    bool valid, uint4 (&v)[kChunks]) {
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.q) +
                                                    (valid ? (row_base + c) * kHeadDimQK : 0));
#pragma unroll
  for (int k = 0; k < kChunks; ++k) v[k] = valid ? __ldg(src + part + kP * k) : make_uint4(0, 0, 0, 0);
}

// The row's largest |q| over its kP threads' chunks v, as float bits (ordered as integers:
// >= 0x7f800000 for inf or NaN).
template <int kP, int kChunks>
__device__ __forceinline__ uint32_t q_row_amax(const uint4 (&v)[kChunks]) {
  uint32_t amax = 0;
#pragma unroll
  for (int k = 0; k < kChunks; ++k)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t x = word(v[k], w);
      amax = max(amax, max((x & 0x7fffu) << 16, x & 0x7fff0000u));
    }
#pragma unroll
  for (int m = 1; m < kP; m *= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  return amax;
}

// e = floor(log2 max|q|) - 7 from the row's largest |q| (float bits): the largest lands in
// [2^7, 2^8). Clamped so that 2^e and 2^-e are normal floats (an all-zero row: any e).
__device__ __forceinline__ int q_row_exponent(uint32_t amax) {
  return min(max((int)(amax >> 23) - 127 - 7, -126), 126);
}

// One 16-byte chunk (8 bf16) times `down` -> 8 e4m3 hi bytes and 8 lo bytes, lo = e4m3(lo_scale
// (x - hi)).
__device__ __forceinline__ void split_e4m3_hilo(const uint4& v, float down, float lo_scale, uint2& hi, uint2& lo) {
  uint32_t h2[2], l2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t hb[2], lb[2];
#pragma unroll
    for (int w2 = 0; w2 < 2; ++w2) {
      const uint32_t x = word(v, 2 * h + w2);
      const float x0 = __uint_as_float(x << 16) * down, x1 = __uint_as_float(x & 0xffff0000u) * down;
      hb[w2] = f32x2_to_e4m3x2(x0, x1);
      const float2 hf = e4m3x2_to_f32x2(hb[w2]);
      lb[w2] = f32x2_to_e4m3x2((x0 - hf.x) * lo_scale, (x1 - hf.y) * lo_scale);
    }
    h2[h] = hb[0] | (hb[1] << 16);
    l2[h] = lb[0] | (lb[1] << 16);
  }
  hi = make_uint2(h2[0], h2[1]);
  lo = make_uint2(l2[0], l2[1]);
}

// Q rows [row_base, row_base + rows) -> sQ as (2 kN rows: hi rows 0..kN-1, lo rows kN..2kN-1,
// 576) e4m3, 9 boxes of (2 kN, 64) bytes in the 64B swizzle; rows past `rows` zero. Each
// warpgroup finds e_c of every row itself (into its own qexp row, read only by its own threads)
// and stores half of the rows: thread tw takes row tw / kP, 16-byte chunks tw % kP + kP k.
// kQ8: the query is e4m3 already (its scale in bmm1_scale): its bytes go into the hi rows as they
// are, no lo rows, no qexp. Two steps, so that a caller can issue its TMA between Q's loads
// (load_q_rows_e4m3_raw) and their first use (store_q_rows_e4m3).
template <int kN>
constexpr int kQChunksE4m3 = kHeadDimQK / 8 / (128 / kN);  // chunks of 8 columns per thread

// This thread's chunks of its Q row: 8 bf16 per chunk, or 8 e4m3 in .x and .y (kQ8; loaded only
// where this warpgroup stores the row).
template <int kN, bool kQ8>
__device__ __forceinline__ void load_q_rows_e4m3_raw(const MlaParams& p, long long row_base, int rows, int wg,
                                                     uint4 (&v)[kQChunksE4m3<kN>]) {
  constexpr int kP = 128 / kN, kChunks = kQChunksE4m3<kN>;  // threads per row, chunks per thread
  const int tw = threadIdx.x & 127, c = tw / kP, part = tw % kP;
  const bool valid = c < rows;
  if constexpr (kQ8) {
    if (c / (kN / 2) != wg) return;  // the other warpgroup stores this row (warp-uniform)
    const uint2* src8 = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.q) +
                                                       (valid ? (row_base + c) * kHeadDimQK : 0));
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const uint2 q8 = valid ? __ldg(src8 + part + kP * k) : make_uint2(0, 0);
      v[k] = make_uint4(q8.x, q8.y, 0, 0);
    }
  } else {
    load_q_row_bf16_raw<kP>(p, row_base, c, part, valid, v);
  }
}

template <int kN, bool kQ8>
__device__ __forceinline__ void store_q_rows_e4m3(uint8_t* sQ, int* qexp, int wg, const uint4 (&v)[kQChunksE4m3<kN>]) {
  constexpr int kP = 128 / kN, kChunks = kQChunksE4m3<kN>;
  const int tw = threadIdx.x & 127, c = tw / kP, part = tw % kP;
  if constexpr (kQ8) {
    if (c / (kN / 2) != wg) return;
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int col = 8 * (part + kP * k), b = col >> 6, j0 = col & 63;
      *reinterpret_cast<uint2*>(sQ + b * kFp8QBoxBytes<kN> + sw64(c, j0 >> 4) + (j0 & 15)) = make_uint2(v[k].x, v[k].y);
    }
    return;
  }
  const uint32_t amax = q_row_amax<kP>(v);
  const bool finite = amax < 0x7f800000u;
  const int e = q_row_exponent(amax);
  if (part == 0) qexp[c] = finite ? e : kQexpNonFinite;
  if (c / (kN / 2) != wg) return;  // the other warpgroup stores this row (warp-uniform)
  const float down = exp2_int(-e);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    // Chunk part + kP k: columns 8 (part + kP k) + [0, 8) = box b, in-box bytes j0 .. j0 + 7.
    const int col = 8 * (part + kP * k), b = col >> 6, j0 = col & 63;
    uint2 hi, lo;
    split_e4m3_hilo(v[k], down, kQLoScale, hi, lo);
    uint8_t* box = sQ + b * kFp8QBoxBytes<kN>;
    const int in_chunk = j0 & 15;
    *reinterpret_cast<uint2*>(box + sw64(c, j0 >> 4) + in_chunk) = hi;
    *reinterpret_cast<uint2*>(box + sw64(kN + c, j0 >> 4) + in_chunk) = lo;
  }
}

// Warp-collective (warp 0): fp8 block `block` -> a stage (9 boxes, box b at stage + 4 KiB b,
// completing on bars + 8 b). Lane c issues chunk c with the page id it holds in `page`.
__device__ __forceinline__ void issue_kv_fp8(const MlaParams& p, uint32_t stage, uint32_t bars, int block,
                                             int page) {
  if constexpr (kProbeNoLoads) return;
  const int lane = threadIdx.x & 31;
  if (lane == 0)
    for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_arrive_expect_tx(bars + 8 * bx, kFp8BoxBytes);
  if (lane < (kBlockN >> (31 - __clz(p.kv_box_rows)))) {
    const int r0 = lane * p.kv_box_rows;
    const int row = fast_mod(block * kBlockN + r0, p.page_div);
    const uint64_t policy = createpolicy_evict_first();  // read once, as in issue_kv_half
    for (int bx = 0; bx < kNumBoxesQK; ++bx)
      tma_load_3d(stage + bx * kFp8BoxBytes + r0 * kBoxCols, &p.kv_tmap, bars + 8 * bx, bx * kBoxCols, row, page,
                  policy);
  }
}

// cp_async_16 with an L2 policy (evict-first: the KV is read once, as the TMA loads mark it).
__device__ __forceinline__ void cp_async_16_evict_first(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy));
}

// Warpgroup-collective, any page size: the two threads of token tw / 2 of block `block` copy its
// 576-byte row (36 chunks of 16 bytes) into the stage's fp8 boxes, zero-filled for a page id
// outside the pool (num_pages: a token past kv_len); each thread's copies arrive on `bar` when
// complete. Thread h = tw % 2 takes chunks 2 j' + h, j' = j ^ s (s = bit 1 of the token), j < 18:
// the two threads of a token read whole 32-byte sectors, and the swap by s puts a warp's stores
// on 8 bank groups instead of 4; the box (j / 2) stays a constant.
__device__ __forceinline__ void issue_kv_fp8_cp(const MlaParams& p, uint32_t stage, uint32_t bar, int block,
                                                int page, uint64_t policy) {
  if constexpr (kProbeNoLoads) return;
  const int tw = threadIdx.x & 127, t = tw >> 1, h = tw & 1, s = (t >> 1) & 1;
  const int off0 = 32 * s + 16 * h, off1 = 32 * (1 - s) + 16 * h;  // in-box bytes for even / odd j
  const bool valid = page >= 0 && page < p.num_pages;
  const uint8_t* src = static_cast<const uint8_t*>(p.kv);
  if (valid)
    src += (long long)page * p.kv_page_stride + (long long)fast_mod(block * kBlockN + t, p.page_div) * p.kv_row_stride;
  // In-box destinations in the 64B swizzle (the layout TMA writes and the wgmmas read).
  const uint32_t dst0 = stage + sw64(t, off0 >> 4), dst1 = stage + sw64(t, off1 >> 4);
  // Rolled: unrolled, ptxas 13.0 put `stage` in a uniform register and emitted LDGSTS [R+UR],
  // an illegal instruction on the H200 (with the plan-cheap-scans planner).
#pragma unroll 1
  for (int j = 0; j < 18; ++j) {
    const int off = (j & 1) ? off1 : off0;
    cp_async_16_evict_first(((j & 1) ? dst1 : dst0) + (j >> 1) * kFp8BoxBytes, src + 32 * (j & ~1) + off, valid,
                            policy);
  }
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The page id of this thread's token (tw / 2) of block `block`, or num_pages past kv_len.
__device__ __forceinline__ int token_page(const MlaParams& p, const int* bt_row, int block, int kv_len) {
  const int tok = block * kBlockN + ((threadIdx.x & 127) >> 1);
  return tok < kv_len ? __ldg(bt_row + fast_div(tok, p.page_div)) : p.num_pages;
}

// Warp 0 of warpgroup wg (the caller checks): the page ids of the warpgroup's first two blocks of
// a unit, kb0 + wg and kb0 + wg + 2 (lanes 0-7, block_pages), both loads in flight at once.
__device__ __forceinline__ void first_block_pages_fp8(const MlaParams& p, const int* bt_row, int kb0, int kb1,
                                                      int kv_len, int wg, int (&pages)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int kb = kb0 + wg + 2 * j;
    pages[j] = kb < kb1 ? block_pages(p, bt_row, kb, kv_len) : p.num_pages;
  }
}

// Warp 0 of warpgroup wg: those two blocks by TMA into stages 2 wg + (loads + j) % 2 (stage s at
// kv + s * 36 KiB, its box mbarriers at bar + s * 72 bytes).
__device__ __forceinline__ void issue_first_blocks_fp8(const MlaParams& p, uint8_t (*kv)[kFp8TileBytes],
                                                       uint64_t (*bar)[kNumBoxesQK], int kb0, int kb1, int wg,
                                                       uint32_t loads, const int (&pages)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int kb = kb0 + wg + 2 * j;
    if (kb < kb1) {
      const int st = 2 * wg + ((loads + j) & 1);
      issue_kv_fp8(p, smem_u32(kv[st]), smem_u32(&bar[st][0]), kb, pages[j]);
    }
  }
}

// V token rows [first, 64) of an fp8 stage (its 8 V boxes) zeroed by the 128 threads of a
// warpgroup (tw: the thread's index in it): a page's rows past kv_len hold anything (NaN
// included), and P = 0 does not cancel 0 * NaN. The caller publishes the stores (proxy fence,
// barrier).
__device__ __forceinline__ void zero_v_rows_fp8(uint8_t* kv, int first, int tw) {
  constexpr int kVBoxes = kHeadDimV / kBoxCols, kRowChunks = kBoxCols / 16;
  static_assert(kVBoxes == 8 && kRowChunks == 4, "chunk i: box i & 7, row chunk (i >> 3) & 3, row i >> 5");
  const int n = (kBlockN - first) * kVBoxes * kRowChunks;
  for (int i = tw; i < n; i += 128)
    *reinterpret_cast<uint4*>(kv + (i & 7) * kFp8BoxBytes + (first + (i >> 5)) * kBoxCols + ((i >> 3) & 3) * 16) =
        make_uint4(0, 0, 0, 0);
}

// The A fragment of one PV tile and k-step (32 tokens x 16 V columns, e4m3) from the stage:
// `addr` is this lane's token row of the ldmatrix (header: token order and V column order).
// Lane (r8, q4) gets in r[j] tokens 8 j + 2 q4 + {0, 1}, V columns 2 r8 + {0, 1}; prmt 0x6240
// takes column 2 r8 (A row r8) of tokens 2 q4, 8 + 2 q4, 2 q4 + 1, 9 + 2 q4 as k positions
// 4 q4 + [0, 4), 0x7351 column 2 r8 + 1 (A row r8 + 8); r[2], r[3] the same 16 tokens later.
__device__ __forceinline__ void v_fragment(uint32_t addr, uint32_t (&a)[4]) {
  uint32_t r[4];
  ldsm_x4_trans(addr, r);
  a[0] = prmt(r[0], r[1], 0x6240);
  a[1] = prmt(r[0], r[1], 0x7351);
  a[2] = prmt(r[2], r[3], 0x6240);
  a[3] = prmt(r[2], r[3], 0x7351);
}

// Hopper's fp8 wgmma adds each k-step into its fp32 accumulator with ~14 bits (DeepSeek-V3), so
// over a long chain the small late terms lose their low bits, all in one direction (measured at
// 2 SMs, one unsplit unit per CTA: the wide kernel's mean output error -2e-4 of |O| over 128
// blocks per accumulator, -3.4e-3 over 512, 3.4x the error of PyTorch with P rounded alike; the
// bf16-query narrow kernel 3.7x at 256 blocks per warpgroup). So every kPromoteBlocks blocks an
// accumulator has taken, O^T is promoted: added in fp32 into the unit's slot of partial_o (its
// own when it is split; else its set's end-of-range slot, which only the set's last unit writes,
// after this one) and restarted at zero; the epilogue adds the slot back. Chains of 64 blocks
// kept the error at PyTorch's (ratio 0.85 at 64). Costs a write of O (and, from the second, a
// read) per 64 blocks of one accumulator.
constexpr int kPromoteBlocks = 64;

// The unit's fp32 slot in partial_o: 64 rows x 512.
__device__ __forceinline__ float* unit_slot_o(const MlaParams& p, const CtaRange& cr, int grp) {
  return p.partial_o + (long long)partial_slot(p, cr.set, grp, cr.lane_m) * kBlockM * kHeadDimV;
}

// O^T and this thread's rows of the unit's fp32 slot, for both the narrow kernels (8 tiles, kT
// column octets) and the wide one (4 tiles, 8 octets): acc[i][4 t + e'] is row c = 8 t + 2 q4 +
// (e' & 1), V column col0 + 16 i + (e' >> 1); row c of the slot at po + c * 512. The slot holds
// the earlier chains relative to older row maxima, f[t][e] = 2^(m_old - m) rescales them to the
// current ones (`have` false: the slot holds nothing yet). kStore: acc added into the slot in
// fp32 (no accumulator truncation) and restarted at zero; else the slot added into acc (the
// epilogue). Each thread reads only what it wrote itself.
template <int kTiles, int kT, bool kStore>
__device__ __forceinline__ void promote_o(float (&acc)[kTiles][4 * kT], float* po, int col0, bool have,
                                          const float (&f)[kT][2]) {
  const int q4 = threadIdx.x & 3;
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float* row = po + (8 * t + 2 * q4 + e) * kHeadDimV + col0;
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        float2 v = make_float2(acc[i][4 * t + e], acc[i][4 * t + 2 + e]);
        if (have) {
          const float2 o = *reinterpret_cast<const float2*>(row + 16 * i);
          v.x = fmaf(o.x, f[t][e], v.x);
          v.y = fmaf(o.y, f[t][e], v.y);
        }
        if (kStore) *reinterpret_cast<float2*>(row + 16 * i) = v;
        acc[i][4 * t + e] = kStore ? 0.f : v.x;
        acc[i][4 * t + 2 + e] = kStore ? 0.f : v.y;
      }
    }
}

// A narrow warpgroup's promotion: its rows c of the slot (po), V columns 128 warp + 16 i + 2 r8
// (header); the earlier chains relative to the row maxima mp[c] (none when `mp` is null).
template <int kT, bool kStore>
__device__ __forceinline__ void promote_o_narrow(float (&acc)[8][4 * kT], float* po, const float* mp,
                                                 const float (&m)[kT][2]) {
  const int q4 = threadIdx.x & 3, r8 = (threadIdx.x & 31) >> 2, warp = (threadIdx.x % 128) / 32;
  float f[kT][2];
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) f[t][e] = mp != nullptr ? exp2_approx(mp[8 * t + 2 * q4 + e] - m[t][e]) : 0.f;
  promote_o<8, kT, kStore>(acc, po, 16 * 8 * warp + 2 * r8, mp != nullptr, f);
}

template <int kN, bool kTma, bool kQ8>
__device__ bool attention_narrow_fp8(const MlaParams& p) {
  constexpr int kT = kN / 8;    // column octets per thread: columns 8t + 2 q4 + {0, 1}
  constexpr int kAcc = kN / 2;  // fp32 registers of one m64nN accumulator
  constexpr int kChains = kN == 16 ? 2 : 1;  // QK^T accumulators (registers: kN 32 has fewer left)
  constexpr int kQRows = kQ8 ? kN : 2 * kN;  // QK^T's N: the Q rows in shared memory (hi, lo)
  // P is stored as 2^kPShift P in e4m3, in [0, 2^8] (log2 units; FlashAttention-3's offset: e4m3
  // keeps P down to 2^-17 of the row max, not 2^-9). The row sums and O carry the factor too.
  constexpr float kPShift = 8.f;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_u32(smem_raw);
  NarrowFp8Smem<kN>& ss =
      *reinterpret_cast<NarrowFp8Smem<kN>*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));

  const int tid = threadIdx.x, tw = tid % 128, lane = tid & 31, q4 = lane & 3, r8 = lane >> 2;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform: wgmma under it is not serialized
  const int warp = tw / 32;
  const int r_a = 16 * warp + r8, r_b = r_a + 8;  // S^T accumulator rows: tokens
  const uint32_t sQ = smem_u32(ss.q), sP = smem_u32(ss.p[wg]);
  // V^T by ldmatrix: lane l gives token row l (8 (l / 8) + l % 8) of a k-step's 32 tokens, chunk
  // jj of the warp's first V box (tile i reads chunk 8 warp + i: box 2 warp + i / 4, chunk i % 4).
  int voff[4];
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
    voff[jj] = 2 * warp * kFp8BoxBytes + sw64(lane, jj);

  if (tid == 0) {
    // TMA: one arrival (the expect_tx) per box; cp.async: one per thread of the warpgroup, on box 0's.
    for (int st = 0; st < 4; ++st)
      for (int bx = 0; bx < kNumBoxesQK; ++bx) mbar_init(smem_u32(&ss.bar[st][bx]), kTma ? 1 : 128);
    fence_mbar_init();
  }
  __syncthreads();

  const CtaRange cr = start_cta<kNumThreads>(p);
  if (cr.group0 == cr.group_end) return cr.planned;

  const auto [scale_log2, bmm2] = call_scales(p);
  uint32_t loads = 0;  // blocks this warpgroup consumed so far: block j is in stage 2 wg + j % 2

  for (int grp = cr.group0; grp < cr.group_end; ++grp) {
    const UnitWork w = unit_work(p, grp, cr.lane_m, cr.beg, cr.end);
    if (!w.valid) continue;
    tl_mark(kTlNUnitFound, loads);
    const Unit& unit = w.unit;
    const int kb0 = w.kb0, kb1 = w.kb1, kv_len = unit.kv_len;
    const int* bt_row = p.block_tables + (long long)unit.b * p.block_table_stride;

    // The warpgroup's first two blocks, one per stage.
    // Q's loads go out before warp 0's TMA (which waits on the block table), their use after it.
    uint4 qv[kQChunksE4m3<kN>];
    if constexpr (kTma) {
      int pages[2];
      if (tw < 32) first_block_pages_fp8(p, bt_row, kb0, kb1, kv_len, wg, pages);
      load_q_rows_e4m3_raw<kN, kQ8>(p, unit.q_row_base, unit.rows, wg, qv);
      if (tw < 32) issue_first_blocks_fp8(p, ss.kv, ss.bar, kb0, kb1, wg, loads, pages);
      tl_mark(kTlNFirstIssued, loads);
    } else {
      // Both page ids first: the two loads overlap before the copies that depend on them.
      const int page0 = kb0 + wg < kb1 ? token_page(p, bt_row, kb0 + wg, kv_len) : p.num_pages;
      const int page1 = kb0 + wg + 2 < kb1 ? token_page(p, bt_row, kb0 + wg + 2, kv_len) : p.num_pages;
      const uint64_t policy = createpolicy_evict_first();
      // Not unrolled: unrolled, ptxas 13.0 gave the kN 32 kernel's copies here the form
      // LDGSTS [R+UR], desc[UR1], which the H200 rejects as an illegal instruction (session 9).
#pragma unroll 1
      for (int j = 0; j < 2; ++j) {
        const int kb = kb0 + wg + 2 * j;
        if (kb < kb1) {
          const int st = 2 * wg + ((loads + j) & 1);
          issue_kv_fp8_cp(p, smem_u32(ss.kv[st]), smem_u32(&ss.bar[st][0]), kb, j == 0 ? page0 : page1, policy);
        }
      }
      load_q_rows_e4m3_raw<kN, kQ8>(p, unit.q_row_base, unit.rows, wg, qv);
    }
    store_q_rows_e4m3<kN, kQ8>(&ss.q[0][0], ss.qexp[wg], wg, qv);
    fence_proxy_async_smem();
    __syncthreads();
    tl_mark(kTlNQLanded, loads);

    // Row c's score scale to the log2 domain (a bf16 query: times Q's exponent shift; NaN for a
    // row that is not finite).
    auto row_scale = [&, sc = scale_log2](int c) {
      if constexpr (kQ8) return sc;
      const int qe = ss.qexp[wg][c];
      return qe == kQexpNonFinite ? __int_as_float(0x7fffffff) : sc * exp2_int(qe);
    };
    // S^T stays unscaled (the column maxima and P's FFMA apply ps = the row's scale) where that
    // scale is in (0, inf). Elsewhere (the call's scale zero, negative or NaN; a query row that is
    // not finite, NaN scale; an all-zero row whose scale underflows to 0) that row's S^T is
    // scaled first and its ps is 1 (p_exp_scale says why), so that its masked tokens stay -inf
    // and P 0: fma(-inf, NaN, b) would be NaN, and a row that sees no key must write 0.
    // Bit 2 t + e of `pre`: row c is scaled first.
    // This thread's columns (Q rows) c = 8t + 2 q4 + e: KV limits, P's scales, running max, sums.
    int lim[kT][2];
    float ps[kT][2], m_run[kT][2], l_run[kT][2];
    uint32_t pre = 0;
#pragma unroll
    for (int t = 0; t < kT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * t + 2 * q4 + e;
        lim[t][e] = unit_row_limit(p, unit, c);
        const float f = row_scale(c);
        const bool ok = f > 0.f && f < INFINITY;
        ps[t][e] = ok ? f : 1.f;
        pre |= (ok ? 0u : 1u) << (2 * t + e);
        m_run[t][e] = kMaxInit;
        l_run[t][e] = 0.f;
      }
    // P: e4m3 rows of 64 bytes in the 64B swizzle (hi rows 0..kN-1, lo rows kN..2kN-1).
    const uint64_t dq = make_smem_desc_sw64(sQ), dp = make_smem_desc_sw64(sP);
    float acc[8][kAcc];  // O^T: tile i, rows r_a / r_b of this thread's slice: V columns
                         // 16 (8 warp + i) + 2 r8 + 0 / 1 (header)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < kAcc; ++j) acc[i][j] = 0.f;

    // This warpgroup's blocks (kb0 + wg, kb0 + wg + 2, ...) in chains of kPromoteBlocks, O^T
    // promoted between two: outside the block loop, so its registers and code are those without
    // promotion. Promotion n (from 0) reads the row maxima of n - 1 and writes its own into the
    // other buffer (lanes 0-3 of warp 0; every thread read the older ones before: the blocks
    // between two promotions have warpgroup barriers).
    for (int c0 = kb0 + wg; c0 < kb1; c0 += 2 * kPromoteBlocks) {
      const int c1 = min(c0 + 2 * kPromoteBlocks, kb1);
      for (int kb = c0; kb < c1; kb += 2, ++loads) {
        const int stage_id = 2 * wg + (loads & 1);
        const uint32_t par = (loads >> 1) & 1;
        uint8_t* kv = ss.kv[stage_id];
        const uint32_t bars = smem_u32(&ss.bar[stage_id][0]);
        const bool refill = kb + 4 < kb1;
        // The refill's page ids. TMA: lanes 0-7 of warp 0, here for kN 16 with an e4m3 query, else
        // once QK^T is issued (the load then waits behind QK^T, not in front of it: fp8 H16 MTP 2
        // 5% faster, B64 H16 1.2%; the e4m3 query at kN 16 1% slower, so it keeps the old place).
        // cp.async: every thread its token's, once QK^T is done (loaded before, it was spilled
        // across QK^T and waited for at once).
        constexpr bool kPagesLate = kTma && !(kN == 16 && kQ8);
        const auto tma_refill_page = [&] { return tw < 32 && refill ? block_pages(p, bt_row, kb + 4, kv_len) : p.num_pages; };
        int refill_page = p.num_pages;
        if constexpr (kTma && !kPagesLate) refill_page = tma_refill_page();
        tl_mark(kTlNBlockStart, loads);

        // ---- S^T = K [Q_hi; Q_lo]^T (kQ8: K Q^T): fp8 wgmmas straight from the stage, 2 k-steps per box
        // The k-steps alternate over kChains accumulators, summed at the end: wgmmas into one
        // accumulator run one after another.
        // Descriptors advance by one add per k-step (desc_add).
        float stc[kChains][kQRows / 2];
        const uint64_t da = make_smem_desc_sw64(smem_u32(kv));
        wgmma_fence();
#pragma unroll
        for (int b = 0; b < kNumBoxesQK; ++b) {
          if (kTma || b == 0) kv_wait(bars + 8 * b, par, kSiteQkBox);  // cp.async: the whole block on box 0's
          // cp.async writes are generic-proxy writes and the wgmmas read through the async proxy:
          // order them in the reading thread, after the mbarrier made them visible to it (TMA
          // writes are async-proxy already).
          if (!kTma && b == 0) fence_proxy_async_smem();
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int ks = 2 * b + u;
            WgmmaSsE4m3<kQRows>::mma(stc[ks % kChains], desc_add(da, b * kFp8BoxBytes + kFp8KStepBytes * u),
                                     desc_add(dq, b * kFp8QBoxBytes<kN> + kFp8KStepBytes * u), ks < kChains ? 0 : 1);
          }
        }
        wgmma_commit();
        if constexpr (kPagesLate) refill_page = tma_refill_page();
        wgmma_wait<0>();
        tl_mark(kTlNQkDone, loads);
        if constexpr (!kTma) refill_page = refill ? token_page(p, bt_row, kb + 4, kv_len) : p.num_pages;
        // s = S_hi + S_lo / 16: column octet t of hi, t + kT of lo, in the same thread (kQ8: S).
        float st[kAcc];
#pragma unroll
        for (int c = 0; c < kChains; ++c) fence_regs(stc[c]);
#pragma unroll
        for (int t = 0; t < kT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float hi = stc[0][4 * t + e], lo = 0.f;
            if constexpr (!kQ8) lo = stc[0][4 * (t + kT) + e];
#pragma unroll
            for (int c = 1; c < kChains; ++c) {
              hi += stc[c][4 * t + e];
              if constexpr (!kQ8) lo += stc[c][4 * (t + kT) + e];
            }
            st[4 * t + e] = kQ8 ? hi : fmaf(lo, 1.f / kQLoScale, hi);
          }

        // ---- mask, column maxima over the block's 64 tokens in the log2 domain ---------------
        const int tok_a = kb * kBlockN + r_a, tok_b = kb * kBlockN + r_b;
        if (pre != 0) {
#pragma unroll
          for (int t = 0; t < kT; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if ((pre >> (2 * t + e)) & 1u) {
                const float f = row_scale(8 * t + 2 * q4 + e);
                st[4 * t + e] *= f;
                st[4 * t + 2 + e] *= f;
              }
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
            cm[t][e] = v * ps[t][e];
          }
        if (lane < 4)
#pragma unroll
          for (int t = 0; t < kT; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) ss.colmax[wg][warp][8 * t + 2 * q4 + e] = cm[t][e];
        wg_barrier(wg);
        tl_mark(kTlNMaxShared, loads);

        // ---- running max, P = 2^(s - m) into sP as (rows, token positions) e4m3, O^T rescaled ----
        float sc[kT][2];
        bool grew = false;
#pragma unroll
        for (int t = 0; t < kT; ++t)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * t + 2 * q4 + e;
            const float mn = next_running_max(ss.colmax[wg], c, m_run[t][e], sc[t][e], grew);
            // P scaled by 2^kPShift (<= 256, within e4m3); l_run and O carry the same factor, the
            // row max handed to the store drops it.
            const float nb = kPShift - mn;
            const float pa = exp2_approx(fmaf(st[4 * t + e], ps[t][e], nb)), pb = exp2_approx(fmaf(st[4 * t + 2 + e], ps[t][e], nb));
            // The row sum takes P before rounding (as FlashAttention-3 does for its e4m3 P).
            l_run[t][e] = l_run[t][e] * sc[t][e] + pa + pb;
            // Tokens r_a, r_b sit at positions 16 warp + 2 r8 + {0, 1} (header): one 16-bit store.
            // A bf16 query keeps bf16's precision in P: the rounding error of hi goes into row
            // kN + c (lo, same scale; 4 + 4 significant bits).
            const uint32_t hi = f32x2_to_e4m3x2(pa, pb);
            *reinterpret_cast<uint16_t*>(ss.p[wg] + sw64(c, warp) + 2 * r8) = (uint16_t)hi;
            if constexpr (!kQ8) {
              const float2 h = e4m3x2_to_f32x2(hi);
              *reinterpret_cast<uint16_t*>(ss.p[wg] + sw64(kN + c, warp) + 2 * r8) =
                  (uint16_t)f32x2_to_e4m3x2(pa - h.x, pb - h.y);
            }
          }
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int t = 0; t < kT; ++t)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[i][4 * t + e] *= sc[t][e & 1];
        }
        // Token rows past kv_len hold anything (NaN included) and P = 0 does not cancel 0 * NaN:
        // in the last block their V bytes are zeroed here (QK^T is done with the stage; the barrier
        // below publishes them with sP). cp.async: they arrived zero-filled.
        if (kTma && (kb + 1) * kBlockN > kv_len) zero_v_rows_fp8(kv, kv_len - kb * kBlockN, tw);
        fence_proxy_async_smem();
        wg_barrier(wg);  // sP and the zeroed tail complete; colmax read by every warp
        tl_mark(kTlNPShared, loads);

        // ---- O^T += V^T P^T: e4m3 wgmmas, V^T fragments by ldmatrix .trans ------------------------
        // kN 16, bf16 query: every A fragment of the block first, then all 32 wgmmas in one
        // group. Else kG commit groups per k-step (8 / kG tiles each), at most two in flight, so a
        // group's A registers are free when they are rewritten.
        constexpr int kG = 2, kTiles = 8 / kG;
        // k32: per k-step and tile one ldmatrix (4 matrices of 8 tokens x 16 bytes, transposed) and
        // 4 byte permutes give the A fragment, no conversion (v_fragment). P holds the same token
        // order (header).
        const uint32_t vbase = smem_u32(kv);
        if constexpr (kN == 16 && !kQ8) {
          // Both k-steps' A fragments (64 registers) before the first PV wgmma: the ldmatrix
          // latencies overlap, and no wgmma group waits for an earlier one to free its registers
          // (fp8 B64 kv8192 H16 5% faster; its PC samples sat on these fragments' byte permutes).
          // kN 32 has no registers for it; an e4m3 query (half the PV wgmmas) gained nothing.
          // Session 26's A/B: docs/experiments/README.md.
          uint32_t a[2][8][4];
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int i = 0; i < 8; ++i)
              v_fragment(vbase + voff[i & 3] + (i >> 2) * kFp8BoxBytes + s * 32 * kBoxCols, a[s][i]);
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const uint64_t db = desc_add(dp, s * kFp8KStepBytes);
#pragma unroll
            for (int i = 0; i < 8; ++i) WgmmaRsE4m3<kN>::mma(acc[i], a[s][i], db);
#pragma unroll
            for (int i = 0; i < 8; ++i) WgmmaRsE4m3<kN>::mma(acc[i], a[s][i], desc_add(db, kN * kBoxCols));
          }
          wgmma_commit();
        } else {
#pragma unroll
          for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int g = 0; g < kG; ++g) {
              if (kG * s + g >= 2) wgmma_wait<1>();
              uint32_t a[kTiles][4];
#pragma unroll
              for (int x = 0; x < kTiles; ++x) {
                const int i = kTiles * g + x;
                v_fragment(vbase + voff[i & 3] + (i >> 2) * kFp8BoxBytes + s * 32 * kBoxCols, a[x]);
              }
              wgmma_fence();
              const uint64_t db = desc_add(dp, s * kFp8KStepBytes);
#pragma unroll
              for (int x = 0; x < kTiles; ++x) WgmmaRsE4m3<kN>::mma(acc[kTiles * g + x], a[x], db);
              if constexpr (!kQ8) {  // the lo rows, kN rows (kN / 8 atoms of 512 bytes) further
#pragma unroll
                for (int x = 0; x < kTiles; ++x)
                  WgmmaRsE4m3<kN>::mma(acc[kTiles * g + x], a[x], desc_add(db, kN * kBoxCols));
              }
              wgmma_commit();
            }
        }
        // Every thread's loads of this stage are done: block kb + 4 may land in it.
        wg_barrier(wg);
        if constexpr (kTma) {
          if (tw < 32 && refill) issue_kv_fp8(p, smem_u32(kv), bars, kb + 4, refill_page);
        } else if (refill) {
          issue_kv_fp8_cp(p, smem_u32(kv), bars, kb + 4, refill_page, createpolicy_evict_first());
        }
        tl_mark(kTlNPvIssued, loads);
        wgmma_wait<0>();
        tl_mark(kTlNPvDone, loads);
#pragma unroll
        for (int i = 0; i < 8; ++i) fence_regs(acc[i]);
      }
      if (c1 < kb1) {  // warpgroup-uniform
        const int n = (c0 - kb0 - wg) / (2 * kPromoteBlocks);
        promote_o_narrow<kT, true>(acc, unit_slot_o(p, cr, grp) + 32 * wg * kHeadDimV,
                                   n > 0 ? ss.m_prom[wg][(n + 1) & 1] : nullptr, m_run);
        if (tw < 4)
#pragma unroll
          for (int t = 0; t < kT; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) ss.m_prom[wg][n & 1][8 * t + 2 * q4 + e] = m_run[t][e];
      }
    }
    // The promoted chains back in (warpgroup w's slot rows 32 w + c; the merge below works in
    // shared memory until store_unit_rows, whose split partial's bf16 rows, over the slot's fp32
    // ones, are written after its CTA barriers).
    {
      const int mine = kb1 - kb0 > wg ? (kb1 - kb0 - wg + 1) / 2 : 0;  // this warpgroup's blocks
      if (mine > kPromoteBlocks) {
        const int n = (mine - 1) / kPromoteBlocks - 1;  // the last promotion
        promote_o_narrow<kT, false>(acc, unit_slot_o(p, cr, grp) + 32 * wg * kHeadDimV, ss.m_prom[wg][n & 1], m_run);
      }
    }
    wg_barrier_even_up<3>(wg, kb1 - kb0);
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
    // O^T of this warpgroup -> its two stages as (kN rows, 512) fp32, rows kMergeStride apart, in
    // true V column order: its loads are all consumed.
    float* ob = reinterpret_cast<float*>(ss.kv[2 * wg]);
    // Row r8 (+ 8) of tile i is V column 16 (8 warp + i) + 2 r8 (+ 1) (header).
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int t = 0; t < kT; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * t + 2 * q4 + (e & 1);
          const int v = 16 * (8 * warp + i) + 2 * r8 + (e >> 1);
          ob[c * kMergeStride + merge_swizzle(v)] = acc[i][4 * t + e];
        }
    // Each reader sums the four warps' row sums itself (in colmax, written before the barrier like
    // m): one array and one warpgroup barrier fewer. (Racecheck: wg_barrier_even_up above.)
    __syncthreads();

    // Both warpgroups' O merged per row by all eight warps (store_unit_rows).
    {
      const int c = tid / (kNumThreads / kN);
      const float l0 = ss.colmax[0][0][c] + ss.colmax[0][1][c] + ss.colmax[0][2][c] + ss.colmax[0][3][c];
      const float l1 = ss.colmax[1][0][c] + ss.colmax[1][1][c] + ss.colmax[1][2][c] + ss.colmax[1][3][c];
      store_unit_rows<kN>(p, w, partial_slot(p, cr.set, grp, cr.lane_m), c, reinterpret_cast<const float*>(ss.kv[0]),
                          reinterpret_cast<const float*>(ss.kv[2]), ss.m[0][c], ss.m[1][c], l0, l1, kPShift,
                          bmm2, [](int v) { return merge_swizzle(v); });
    }
    // The next unit reuses the stages (they hold the merge buffers; its TMA writes must come
    // after these generic-proxy reads), Q, qexp, colmax (the row sums) and m.
    fence_proxy_async_smem();
    __syncthreads();
    tl_mark(kTlNUnitDone, loads);
  }
  return cr.planned;
}

}  // namespace jit_mla::sm90
