// The last step of every row, shared by the attention epilogue (unsplit units) and the combine
// phase (split units): fold in the sink, apply bmm2_scale, give the final base-2 LSE.
#pragma once
#include <cmath>

#include "device_utils.cuh"

namespace jit_mla {

constexpr float kLog2e = 1.4426950408889634f;

struct RowFinal {
  float scale;  // out = O_normalized * scale
  float lse;    // base 2, sink included
};

// lse2: log2(sum_j 2^(t_j)) over the row's visible keys, t_j = s_j * log2(e); -inf: no key.
__device__ __forceinline__ RowFinal finalize_row(float lse2, const float* sinks, int head,
                                                 float bmm2_scale) {
  // A row with no visible key: out = 0, lse = -inf (contract), whether or not it has a sink.
  if (lse2 == -INFINITY) return RowFinal{0.f, -INFINITY};
  float lse = lse2;
  if (sinks != nullptr) {
    // The sink adds exp(sink) to the softmax denominator only: O shrinks by 2^(lse2 - lse).
    const float s2 = sinks[head] * kLog2e;
    const float mx = fmaxf(lse2, s2);
    lse = mx + log2_approx(exp2_approx(lse2 - mx) + exp2_approx(s2 - mx));
  }
  return RowFinal{bmm2_scale * exp2_approx(lse2 - lse), lse};
}

}  // namespace jit_mla
