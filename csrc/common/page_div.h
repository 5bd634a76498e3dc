// A KV token's page and row, tok / page_size and tok % page_size, without a divide instruction
// sequence: every TMA and page-id site of the kernels computes them, and a runtime division there
// (the fallback for page sizes that are not a power of two, 192 for one) inlined ~20 instructions
// at each site, 2-4% of a kernel's code, whether or not it ran. Host and device share this header.
#pragma once
#include <cstdint>

namespace jit_mla {

// floor(n / d) = (n * mul) >> shift for 0 <= n < 2^31, with shift = 31 + ceil(log2 d) and
// mul = ceil(2^shift / d): then 0 <= mul * d - 2^shift < d <= 2^ceil(log2 d), the condition of
// Granlund and Montgomery's Theorem 4.2 (PLDI 1994) for 31-bit dividends. mul < 2^32 for every
// d >= 1; a power of two d = 2^k gives mul = 2^31, shift = 31 + k, a plain shift.
struct PageDiv {
  int d;         // the page size (tokens)
  uint32_t mul;
  int shift;     // 31..62
};

inline PageDiv make_page_div(int64_t d) {
  int log2_ceil = 0;
  while ((int64_t{1} << log2_ceil) < d) ++log2_ceil;
  const int shift = 31 + log2_ceil;
  const uint64_t mul = ((uint64_t{1} << shift) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d);
  return PageDiv{static_cast<int>(d), static_cast<uint32_t>(mul), shift};
}

#ifdef __CUDACC__
// tok / page_size for 0 <= tok < 2^31.
__device__ __forceinline__ int page_index(int tok, const PageDiv& pd) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(tok)) * pd.mul) >> pd.shift);
}
// tok % page_size for 0 <= tok < 2^31.
__device__ __forceinline__ int page_row(int tok, const PageDiv& pd) { return tok - page_index(tok, pd) * pd.d; }
#endif

}  // namespace jit_mla
