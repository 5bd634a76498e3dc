// The sm_90a cubin: plan, attention and combine kernels with C symbols, so the launcher finds
// them by name (cudaLibraryGetKernel). Built by `python -m jit_mla build --cubins`.
#include "../common/combine.cuh"
#include "../common/params.h"
#include "../common/plan.cuh"
#include "attention_any_page.cuh"
#include "attention_seesaw.cuh"

using jit_mla::MlaParams;

extern "C" __global__ void __launch_bounds__(jit_mla::kPlanThreads, 1)
    mla_sm90_plan(const __grid_constant__ MlaParams p) {
  // The attention kernel may start launching now; it waits for our writes (PDL).
  jit_mla::pdl_launch_dependents();
  jit_mla::plan_splits(p);
}

extern "C" __global__ void __launch_bounds__(jit_mla::kNumThreads, 1)
    mla_sm90_attention(const __grid_constant__ MlaParams p) {
  jit_mla::sm90::attention_seesaw(p);
}

extern "C" __global__ void __launch_bounds__(jit_mla::kNumThreads, 1)
    mla_sm90_attention_any_page(const __grid_constant__ MlaParams p) {
  jit_mla::sm90::attention_any_page(p);
}

extern "C" __global__ void __launch_bounds__(jit_mla::kCombineThreads, 1)
    mla_combine(const __grid_constant__ MlaParams p) {
  jit_mla::combine_splits(p);
}
