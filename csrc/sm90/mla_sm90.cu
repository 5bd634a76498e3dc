// The sm_90a cubin: attention (each CTA plans its share first) and combine kernels with C
// symbols, so the launcher finds them by name (cudaLibraryGetKernel). Built by
// `python -m jit_mla build --cubins`.
#include "../common/combine.cuh"
#include "../common/params.h"
#include "attention_any_page.cuh"
#include "attention_seesaw.cuh"

using jit_mla::MlaParams;

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
