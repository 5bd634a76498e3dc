// wgmma m64nNk16 with N = 16 or 32, bf16 in, fp32 accumulators, both operands from shared memory:
// the narrow kernel's transposed tiles (attention_narrow.cuh: M = 64 KV tokens or 64 V columns,
// N = 16 or 32 query rows) and the any-page kernel's S tiles (N = 32 KV tokens). kTnspA = 1: A is
// MN-major (V^T, read from the token-major KV tile); B is always K-major.
#pragma once
#include <cstdint>

namespace jit_mla::sm90 {

template <int N, int kTnspA>
struct WgmmaN;

// D(64x16, fp32) (+)= A(64x16) * B(16x16).
template <int kTnspA>
struct WgmmaN<16, kTnspA> {
  static __device__ __forceinline__ void mma(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTnspA));
  }
};

// D(64x32, fp32) (+)= A(64x16) * B(32x16).
template <int kTnspA>
struct WgmmaN<32, kTnspA> {
  static __device__ __forceinline__ void mma(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTnspA));
  }
};

}  // namespace jit_mla::sm90
