// The attention kernels' KV tensor map for the benchmarks' streaming tests (tma_ingest.cu,
// sm_spread.cu): as launcher.cu's kv_tensor_map for bf16 pages of 64 tokens, dense pages:
// dims (576, 64, pages), boxes of (64 columns, 64 tokens), 128-byte swizzle. The encoder comes
// through the runtime's driver entry point, so no -lcuda.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline bool kv_map(CUtensorMap* map, void* kv, long long pages, CUtensorMapL2promotion promotion) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess || fn == nullptr)
    return false;
  const cuuint64_t dims[3] = {576, 64, (cuuint64_t)pages};
  const cuuint64_t strides[2] = {576 * 2, 64 * 576 * 2};
  const cuuint32_t box[3] = {64, 64, 1}, elem_strides[3] = {1, 1, 1};
  return reinterpret_cast<EncodeTiledFn>(fn)(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, kv, dims, strides, box,
                                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
