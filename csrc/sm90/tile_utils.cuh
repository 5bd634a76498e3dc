// Tile helpers shared by the sm_90a attention kernels: the swizzled box layout, Q loads, quad
// reductions over the accumulator layout's four lanes per row.
#pragma once
#include <cuda_bf16.h>

#include "../common/device_utils.cuh"
#include "../common/params.h"
#include "../config.h"

namespace jit_mla::sm90 {

// Byte offset of 16-byte chunk `chunk` (0..7) of row r inside a 128B-swizzled box.
__device__ __forceinline__ uint32_t swizzled(int r, int chunk) {
  return r * 128 + ((chunk ^ (r & 7)) << 4);
}

// Q rows [row_base, row_base + rows) -> sQ; rows past `rows` are zero-filled.
// Thread layout: 8 threads per row (one 16 B chunk of each box), 32 rows per pass.
__device__ __forceinline__ void load_q_tile(uint32_t sQ, const MlaParams& p, long long row_base,
                                            int rows) {
  const int chunk = threadIdx.x & 7;
#pragma unroll
  for (int pass = 0; pass < kBlockM / 32; ++pass) {
    const int r = (threadIdx.x >> 3) + 32 * pass;
    const bool valid = r < rows;
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.q) +
                               (valid ? (row_base + r) * kHeadDimQK : 0) + chunk * 8;
    const uint32_t dst = sQ + swizzled(r, chunk);
#pragma unroll
    for (int box = 0; box < kNumBoxesQK; ++box)
      cp_async_16(dst + box * kBoxBytes, src + box * kBoxCols, valid);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Scale S (accumulator layout, N/4 column octets from token tok0 + 2 q4) to the log2 domain and
// mask columns at or past each row's KV limit; the rows' maxima (over the quad) out.
template <int N>
__device__ __forceinline__ void mask_scale(float (&s)[N], int tok0, int lim_a, int lim_b,
                                           float scale_log2, float& mx_a, float& mx_b) {
  mx_a = -INFINITY;
  mx_b = -INFINITY;
#pragma unroll
  for (int t = 0; t < N / 4; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = tok0 + 8 * t + (e & 1);
      float& x = s[4 * t + e];
      if (e < 2) {
        x = tok < lim_a ? x * scale_log2 : -INFINITY;
        mx_a = fmaxf(mx_a, x);
      } else {
        x = tok < lim_b ? x * scale_log2 : -INFINITY;
        mx_b = fmaxf(mx_b, x);
      }
    }
  }
  mx_a = quad_max(mx_a);
  mx_b = quad_max(mx_b);
}

}  // namespace jit_mla::sm90
