// Host exactness check for csrc/common/rcp_div.cuh and the planner's step 3 (csrc/common/plan.cuh):
// the new formulas against the old `/` and `%` over the planner's ranges. The header is included
// as is; rcp_approx (device_utils.cuh's MUFU.RCP) is emulated as the correctly rounded 1/d moved by
// -2..+2 ulps (PTX: <= 1 ulp), fixed per run or varying per divisor. From the repository root
// (the header is in the tree since e1042e4; before, with plan-divisions.patch applied):
//   g++ -O2 -ffp-contract=off -fopenmp -std=c++17 docs/experiments/plan-divisions-check.cpp && ./a.out
//   (~70 s on 2 cores)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <atomic>

static int g_mode = 0;     // 0..4: fixed offset mode-2; 5..7: per-divisor hashed offsets
static int host_rcp_offset(int d) {
  if (g_mode < 5) return g_mode - 2;
  uint32_t h = (uint32_t)d * 2654435761u ^ (uint32_t)(g_mode * 40503u);
  h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
  return (int)(h % 5) - 2;
}
static float host_rcp(float x) {
  float r = 1.0f / x;  // IEEE, correctly rounded
  int off = host_rcp_offset((int)x);
  for (; off > 0; --off) r = std::nextafter(r, INFINITY);
  for (; off < 0; ++off) r = std::nextafter(r, 0.0f);
  return r;
}
#define __device__
#define __forceinline__ inline
static inline float rcp_approx(float x) { return host_rcp(x); }
static inline float __int2float_rn(int n) { return (float)n; }
static inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
static inline long long __double2ll_rn(double x) { return std::llrint(x); }
using std::fma;
#include "../../csrc/common/rcp_div.cuh"  // relative to this file
using namespace jit_mla;

static std::atomic<long long> g_bad{0}, g_checked{0}, g_old_overflow{0};
#define CHECK(cond, ...) do { g_checked++; if (!(cond)) { if (g_bad++ < 20) { printf("MISMATCH mode %d: ", g_mode); printf(__VA_ARGS__); printf("\n"); } } } while (0)
static const int kModes = 8;
static const int INT_MAXV = 2147483647;

// old step 3 pieces, verbatim semantics (C++ `/` and `%` as on the device)
static void old_whole(int G, int S, int* k, int* sets) { *k = (G + S - 1) / S; *sets = (G + *k - 1) / *k; }

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::mt19937_64 rng(12345);
  auto rnd = [&](long long lo, long long hi) { return lo + (long long)(rng() % (unsigned long long)(hi - lo + 1)); };

  const int from = getenv("FROM") ? atoi(getenv("FROM")) : 1;
  // 1. divmod_small: all d <= 1024 with all |n| <= 2^15, and n = q d + r at quotients up to 2^20
  //    (r in [0, d)); d up to 2^31 - 1 at random.
  for (g_mode = 0; g_mode < kModes && from <= 1; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int d = 1; d <= 1024; ++d) {
      const float rc = rcp_approx((float)d);
      for (int n = -(1 << 15); n <= (1 << 15); ++n) {
        QuotRem qr = divmod_small(n, d, rc);
        long long fq = (long long)std::floor((double)n / d);
        CHECK(qr.quot == fq && qr.rem == n - fq * d, "divmod_small n=%d d=%d", n, d);
        long long cq = -(long long)std::floor(-(double)n / d);
        CHECK(div_ceil_small(n, d, rc) == cq, "div_ceil_small n=%d d=%d", n, d);
      }
      std::mt19937_64 r2(d * 7919 + g_mode);
      for (int t = 0; t < 4000; ++t) {
        long long qmax = (1 << 20) - 1;
        long long q = (t & 1) ? (long long)(r2() % (qmax + 1)) : qmax - (long long)(r2() % 64);
        if (t & 2) q = -q - 1;  // negative n down to -2^20 d
        long long n = q * d + (long long)(r2() % d);
        if (n > INT_MAXV || n < -INT_MAXV - 1LL) continue;
        if (std::llabs(n) >= (1LL << 20) * d) continue;
        QuotRem qr = divmod_small((int)n, d, rc);
        CHECK(qr.quot == q && qr.rem == n - q * d, "divmod_small n=%lld d=%d", n, d);
      }
    }
  }
  printf("1 divmod_small done: checked %lld bad %lld\n", (long long)g_checked, (long long)g_bad);

  // 2. divmod_u31: d <= 1024 all, n in [0, 2^16] all; n near multiples of d across [0, 2^31) and
  //    near 2^31; random d up to 2^20.
  for (g_mode = 0; g_mode < kModes && from <= 2; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int d = 1; d <= 1024; ++d) {
      const float rc = rcp_approx((float)d);
      auto one = [&](long long n) {
        if (n < 0 || n > INT_MAXV) return;
        QuotRem qr = divmod_u31((int)n, d, rc);
        CHECK(qr.quot == n / d && qr.rem == n % d, "divmod_u31 n=%lld d=%d", n, d);
      };
      for (int n = 0; n <= (1 << 16); ++n) one(n);
      std::mt19937_64 r2(d * 104729 + g_mode);
      for (int t = 0; t < 5000; ++t) {
        long long q = (long long)(r2() % ((unsigned long long)INT_MAXV / d + 1));
        for (int e = -2; e <= 2; ++e) one(q * d + e);
        one((long long)(r2() % ((unsigned long long)INT_MAXV + 1)));
      }
      for (long long n = INT_MAXV - 3000; n <= INT_MAXV; ++n) one(n);
    }
    #pragma omp parallel for
    for (int t = 0; t < 200000; ++t) {
      std::mt19937_64 r2(t * 31 + g_mode);
      int d = 1 + (int)(r2() % (1 << 20));
      long long n = (long long)(r2() % ((unsigned long long)INT_MAXV + 1));
      QuotRem qr = divmod_u31((int)n, d, rcp_approx((float)d));
      CHECK(qr.quot == n / d && qr.rem == n % d, "divmod_u31 n=%lld d=%d", n, d);
    }
  }
  printf("2 divmod_u31 done: checked %lld bad %lld\n", (long long)g_checked, (long long)g_bad);

  // 3. divmod_u62: all d <= 1024; n in [0, 2^16], near 2^k (k = 31, 32, 40, 53, 61, 62) and near
  //    multiples of d, log-uniform random up to 2^62.
  for (g_mode = 0; g_mode < kModes && from <= 3; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int d = 1; d <= 1024; ++d) {
      const float rc = rcp_approx((float)d);
      auto one = [&](long long n) {
        if (n < 0 || n >= (1LL << 62)) return;
        QuotRem64 qr = divmod_u62(n, d, rc);
        CHECK(qr.quot == n / d && qr.rem == n % d, "divmod_u62 n=%lld d=%d", n, d);
      };
      for (long long n = 0; n <= (1 << 14); ++n) one(n);
      for (int k : {31, 32, 40, 53, 61, 62})
        for (long long e = -2000; e <= 2000; ++e) one((1LL << k) + e);
      std::mt19937_64 r2(d * 7 + g_mode);
      for (int t = 0; t < 5000; ++t) {
        int bits = 1 + (int)(r2() % 62);
        long long n = (long long)(r2() & ((1ULL << bits) - 1));
        one(n);
        long long q = n / d;
        for (int e = -2; e <= 2; ++e) one(q * d + e);
      }
    }
  }
  printf("3 divmod_u62 done: checked %lld bad %lld\n", (long long)g_checked, (long long)g_bad);

  // 4. step 3, whole groups: all S <= 1024 with G in (S, S + 2^13], then near multiples of S and
  //    of the k it gives, random, and the top of the range (G <= INT_MAX - S + 1, where the old
  //    num_groups + S - 1 does not overflow).
  for (g_mode = 0; g_mode < kModes && from <= 4; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int S = 1; S <= 1024; ++S) {
      auto one = [&](long long Gl) {
        if (Gl <= S || Gl > (long long)INT_MAXV - S + 1) return;
        // the old sets = (G + k - 1) / k overflows past G + k - 1 = INT_MAX (k ~ G / S: from
        // G ~ 2^30 at S = 1): UB there, not compared (counted)
        if (Gl + (Gl + S - 1) / S - 1 > INT_MAXV) { g_old_overflow++; return; }
        const int G = (int)Gl;
        int k0, sets0; old_whole(G, S, &k0, &sets0);
        const int k = divmod_u31(G - 1, S, rcp_approx((float)S)).quot + 1;
        const int sets = div_ceil_small(G, k, rcp_approx((float)k));
        CHECK(k == k0 && sets == sets0, "whole G=%d S=%d k %d/%d sets %d/%d", G, S, k, k0, sets, sets0);
      };
      for (long long G = S + 1; G <= S + (1 << 13); ++G) one(G);
      std::mt19937_64 r2(S * 13 + g_mode);
      for (int t = 0; t < 400; ++t) {
        int bits = 1 + (int)(r2() % 31);
        long long G = (long long)(r2() & ((1ULL << bits) - 1));
        for (int e = -2; e <= 2; ++e) { one(G + e); one((G / S) * S + e); }
        const long long k = (G + S - 1) / S;
        if (k > 0) for (int m = 1; m <= S; m += 1 + (int)(r2() % 37)) for (int e = -1; e <= 1; ++e) one(m * k + e);
      }
      for (long long G = (long long)INT_MAXV - S + 1 - 2000; G <= (long long)INT_MAXV - S + 1; ++G) one(G);
    }
  }
  printf("4 whole groups done: checked %lld bad %lld (skipped where the old code overflows: %lld)\n", (long long)g_checked, (long long)g_bad, (long long)g_old_overflow);

  // 5. step 3, pieces: k = s_eff / G for all s_eff <= 1024 and G in [2, s_eff]; then for each
  //    k <= 512 (G >= 2): nb (a group's blocks) in [0, 2048] all, random, near 2^31: nb / k, and
  //    largest = ceil(nb / k) where nb >= k, the piece start floor(i nb / k) of every i < k, and
  //    (s / k, s % k) of every s < 1024.
  for (g_mode = 0; g_mode < kModes && from <= 5; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int s_eff = 1; s_eff <= 1024; ++s_eff)
      for (int G = 2; G <= s_eff; ++G) {
        const int k = divmod_small(s_eff, G, rcp_approx((float)G)).quot;
        CHECK(k == s_eff / G, "pieces k s_eff=%d G=%d", s_eff, G);
      }
    #pragma omp parallel for schedule(dynamic)
    for (int k = 1; k <= 512; ++k) {
      std::mt19937_64 r2(k * 17 + g_mode);
      const float rp = rcp_approx((float)k);
      for (int s = 0; s < 1024; ++s) {
        const QuotRem gi = divmod_small(s, k, rp);
        CHECK(gi.quot == s / k && gi.rem == s % k, "pieces s=%d k=%d", s, k);
      }
      std::vector<long long> nbs;
      for (int nb = 0; nb <= 2048; ++nb) nbs.push_back(nb);
      for (int t = 0; t < 200; ++t) {
        int bits = 1 + (int)(r2() % 31);
        nbs.push_back((long long)(r2() & ((1ULL << bits) - 1)));
      }
      for (int e = 0; e < 16; ++e) nbs.push_back((long long)INT_MAXV - k + 1 - e);
      for (long long nbl : nbs) {
        if (nbl < 0 || nbl > (long long)INT_MAXV - k + 1) continue;
        const int nb = (int)nbl;
        const QuotRem qr = divmod_u31(nb, k, rp);
        CHECK(qr.quot == nb / k && qr.rem == nb % k, "pieces nb/k nb=%d k=%d", nb, k);
        if (nb >= k) CHECK(qr.quot + (qr.rem != 0) == (long long)((nb + k - 1) / k), "pieces largest nb=%d k=%d", nb, k);
        for (int i = 0; i < k; ++i) {
          const int b0 = (int)((long long)i * nb / k);
          const int b = i * qr.quot + divmod_small(i * qr.rem, k, rp).quot;
          CHECK(b == b0, "pieces start i=%d k=%d nb=%d", i, k, nb);
        }
      }
    }
  }
  printf("5 pieces done: checked %lld bad %lld\n", (long long)g_checked, (long long)g_bad);

  // 6. step 3, even cuts: all s_eff <= 1024 and s < s_eff; W random up to 2^62, near 2^31, 2^32,
  //    2^40, 2^53, 2^62 and near multiples of s_eff. Old: s * W / s_eff in int64 where s * W < 2^63,
  //    else the exact quotient (the old product overflows there).
  for (g_mode = 0; g_mode < kModes && from <= 6; ++g_mode) {
    #pragma omp parallel for schedule(dynamic)
    for (int s_eff = 1; s_eff <= 1024; ++s_eff) {
      std::mt19937_64 r2(s_eff * 29 + g_mode);
      std::vector<long long> ws;
      for (long long w = 0; w <= 64; ++w) ws.push_back(w);
      for (int k : {31, 32, 40, 53, 62}) for (int e = -3; e <= 3; ++e) ws.push_back((1LL << k) + e);
      for (int t = 0; t < 40; ++t) {
        int bits = 1 + (int)(r2() % 62);
        long long w = (long long)(r2() & ((1ULL << bits) - 1));
        ws.push_back(w);
        ws.push_back((w / s_eff) * s_eff + s_eff - 1);
      }
      const float rc = rcp_approx((float)s_eff);
      for (long long W : ws) {
        if (W < 0 || W >= (1LL << 62)) continue;
        const QuotRem64 wq = divmod_u62(W, s_eff, rc);
        for (int s = 0; s < s_eff; ++s) {
          const __int128 exact = (__int128)s * W / s_eff;
          const bool fits = (__int128)s * W <= (__int128)INT64_MAX;
          const long long x0 = fits ? (long long)s * W / s_eff : (long long)exact;
          const long long x = (unsigned)s * wq.quot + (unsigned)divmod_small(s * wq.rem, s_eff, rc).quot;
          CHECK(x == x0, "cuts s=%d s_eff=%d W=%lld", s, s_eff, W);
        }
      }
    }
  }
  printf("6 even cuts done: checked %lld bad %lld\n", (long long)g_checked, (long long)g_bad);
  printf("TOTAL checked %lld mismatches %lld\n", (long long)g_checked, (long long)g_bad);
  return g_bad != 0;
}
