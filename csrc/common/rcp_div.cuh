// Exact divisions by divisors the device computes (the planner's set, piece and group counts),
// without the compiler's division sequences: a 32-bit `/` or `%` by a runtime value inlines ~20-28
// instructions at each site, a 64-bit one ~40 plus a ~95-instruction subroutine, in every kernel
// (each inlines the planner), and cold code costs the small batches ~1% per 200-500 instructions
// (perf-notes). These estimate the quotient with the MUFU reciprocal and fix it from the exact
// integer remainder; each states the range it is exact on, proved in its comment and checked on
// the host against `/` and `%` over those ranges. Divisors fixed per call that the launcher knows
// use FastDiv (fast_div.h) instead.
#pragma once

namespace jit_mla {

struct QuotRem {
  int quot, rem;  // rem in [0, d)
};
struct QuotRem64 {
  long long quot;
  int rem;  // in [0, d)
};

// n - q * d where the true value fits an int even if q * d does not: wrapping unsigned arithmetic
// gives it modulo 2^32, which is then exact.
__device__ __forceinline__ int rem_wrapped(int n, int q, int d) {
  return static_cast<int>(static_cast<unsigned>(n) + static_cast<unsigned>(q) * (0u - static_cast<unsigned>(d)));
}

// floor(n / d) and n mod d for any int n and d >= 1 with |n| / d < 2^20, rcp_d = rcp_approx(d)
// (device_utils.cuh: MUFU.RCP, within 1 ulp, 2^-23 relatively, of 1 / d).
// float(n), rcp_d and their product are each within 2^-24, 2^-23, 2^-24 relatively, so the product
// is within 2^20 * 2^-21.9 < 1/2 of n / d and rounds to floor(n / d) or one more: the remainder is
// then in [-d, d) (it fits an int) and one step fixes it.
__device__ __forceinline__ QuotRem divmod_small(int n, int d, float rcp_d) {
  int q = __float2int_rn(__int2float_rn(n) * rcp_d);
  int r = rem_wrapped(n, q, d);
  if (r < 0) {
    --q;
    r += d;
  }
  return QuotRem{q, r};
}

// ceil(n / d) for any int n and d >= 1 with |n| / d < 2^20 (as divmod_small: the estimate is
// floor(n / d) or one more, and it is the ceiling unless it leaves a positive remainder).
__device__ __forceinline__ int div_ceil_small(int n, int d, float rcp_d) {
  const int q = __float2int_rn(__int2float_rn(n) * rcp_d);
  return q + (rem_wrapped(n, q, d) > 0);
}

// floor(n / d) and n mod d for 0 <= n < 2^31 and 1 <= d <= 2^20: the first estimate is within
// 2^31 * 2^-21.9 + 1/2 < 2^9.2 of n / d, so its remainder r1 (|r1| < 2^9.2 d < 2^30) fits an int
// and r1 / d is small enough for divmod_small; n = (q1 + floor(r1 / d)) d + (r1 mod d).
__device__ __forceinline__ QuotRem divmod_u31(int n, int d, float rcp_d) {
  const int q1 = __float2int_rn(__int2float_rn(n) * rcp_d);
  const QuotRem qr = divmod_small(rem_wrapped(n, q1, d), d, rcp_d);
  return QuotRem{q1 + qr.quot, qr.rem};
}

// floor(n / d) and n mod d for 0 <= n < 2^62 and 1 <= d <= 2^10. A float estimate would leave a
// remainder too wide for one more step, so the first is in double with 1 / d from one Newton step
// on rcp_d: e = 1 - d rcp_d is exact (d rcp_d has <= 35 bits) and r = rcp_d (1 + e) is within
// 2^-46 + 2^-53 of 1 / d; with float64(n) and the product (2^-53 each) the estimate is within
// 2^62 * 2^-45.9 + 1/2 < 2^16.2 of n / d. Its remainder (|r1| < 2^16.2 d < 2^27) fits an int, and
// its low 32 bits are n's minus q1 d's.
__device__ __forceinline__ QuotRem64 divmod_u62(long long n, int d, float rcp_d) {
  const double rd = static_cast<double>(rcp_d);
  const double r = fma(rd, fma(-static_cast<double>(d), rd, 1.0), rd);
  const long long q1 = __double2ll_rn(static_cast<double>(n) * r);
  const QuotRem qr = divmod_small(rem_wrapped(static_cast<int>(n), static_cast<int>(q1), d), d, rcp_d);
  return QuotRem64{q1 + qr.quot, qr.rem};
}

}  // namespace jit_mla
