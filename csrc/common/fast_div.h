// n / d and n % d by a divisor fixed for the call (the page size, the head count) without a
// divide instruction sequence: a runtime division inlined ~20 instructions at each site (every
// TMA and page-id site computes a token's page and row, the unit and merge code a row's token and
// head), 2-4% of a kernel's code, whether or not it ran. Host and device share this header.
#pragma once
#include <cstdint>

namespace jit_mla {

// floor(n / d) = (n * mul) >> shift for 0 <= n < 2^31, with shift = 31 + ceil(log2 d) and
// mul = ceil(2^shift / d): then 0 <= mul * d - 2^shift < d <= 2^ceil(log2 d), the condition of
// Granlund and Montgomery's Theorem 4.2 (PLDI 1994) for 31-bit dividends. mul < 2^32 for every
// d >= 1; a power of two d = 2^k gives mul = 2^31, shift = 31 + k, a plain shift.
struct FastDiv {
  int d;         // the divisor, >= 1
  uint32_t mul;
  int shift;     // 31..62
};

inline FastDiv make_fast_div(int64_t d) {
  // ceil(log2 d) from a bit count, not a loop: this runs on every call (page size, head count)
  const int log2_ceil = d > 1 ? 64 - __builtin_clzll(static_cast<uint64_t>(d - 1)) : 0;
  const int shift = 31 + log2_ceil;
  const uint64_t mul = ((uint64_t{1} << shift) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d);
  return FastDiv{static_cast<int>(d), static_cast<uint32_t>(mul), shift};
}

#ifdef __CUDACC__
// n / d for 0 <= n < 2^31.
// The high word of (2n) mul is floor(n mul / 2^31) (2n < 2^32); shifted right by shift - 31 more
// it is floor(n mul / 2^shift) (floors of successive shifts compose). One IMAD.HI, not a 64-bit
// product: an IMAD.WIDE issued beside running wgmmas costs them ~15 tensor cycles each
// (benchmarks/smem_share.cu, Session 49).
__device__ __forceinline__ int fast_div(int n, const FastDiv& d) {
  return static_cast<int>(__umulhi(static_cast<uint32_t>(n) << 1, d.mul) >> (d.shift - 31));
}
// n % d for 0 <= n < 2^31.
__device__ __forceinline__ int fast_mod(int n, const FastDiv& d) { return n - fast_div(n, d) * d.d; }
// The same, with a power of two (mul = 2^31: the usual page sizes) by a shift alone, no multiply
// (an IMAD.HI costs running wgmmas ~9 cycles). The empty volatile asm keeps the multiply in its
// branch: ptxas would otherwise compute both sides and select. For code beside wgmmas; elsewhere
// the branch is not worth its registers (the narrow fp8 kernels spill more with it).
__device__ __forceinline__ int fast_div_pow2(int n, const FastDiv& d) {
  if (d.mul == 0x80000000u) return n >> (d.shift - 31);
  int q = fast_div(n, d);
  asm volatile("" : "+r"(q));
  return q;
}
__device__ __forceinline__ int fast_mod_pow2(int n, const FastDiv& d) {
  if (d.mul == 0x80000000u) return n & (d.d - 1);
  int r = fast_mod(n, d);
  asm volatile("" : "+r"(r));
  return r;
}
#endif

}  // namespace jit_mla
