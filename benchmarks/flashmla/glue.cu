// A C entry point over FlashMLA's sm90 dense bf16 decode, for the side-by-side benchmark only
// (never shipped, never imported by jit_mla). Built by benchmarks/flashmla/build.sh against a
// FlashMLA checkout; benchmarks/flashmla_side.py loads it with ctypes and owns every buffer.
//
// The call is what FlashMLA's own `dense_attn_decode_interface` does for one KV head (MLA's
// h_k = 1), minus torch: the schedule (`fm_plan`, its get_decoding_sched_meta kernel, which
// FlashMLA's benchmark and engines run once per decode step, outside the timed call), then the
// split-KV kernel and the combine kernel (`fm_decode`). With h_k = 1 FlashMLA's (B, s_q * H, 1,
// 576) query and (B, 1, s_q * H, 512) output are plain views of the (B, s_q, H, D) tensors.
#include <cuda_runtime.h>

#include <cmath>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace {
constexpr int kBlockN = 64;           // FlashMLA's page and block size
constexpr int kFixedOverhead = 5;     // blocks charged per split (their interface's constant)
constexpr int kDk = 576, kDv = 512;
}  // namespace

extern "C" {

// Bytes of one scheduler record (DecodingSchedMeta): the schedule buffer is num_sm_parts of them.
int fm_sched_meta_bytes() { return static_cast<int>(sizeof(DecodingSchedMeta)); }

// The schedule for seqlens_k (B ints): sched_meta (num_sm_parts records), num_splits (B + 1 ints).
int fm_plan(int b, int s_q, const int* seqlens_k, void* sched_meta, int* num_splits, int num_sm_parts,
            cudaStream_t stream) {
  GetDecodeSchedMetaParams p = {b, s_q, kBlockN, kFixedOverhead, -1, -1, nullptr, nullptr,
                                const_cast<int*>(seqlens_k), static_cast<DecodingSchedMeta*>(sched_meta),
                                num_splits, num_sm_parts, stream};
  smxx::decode::run_get_decoding_sched_meta_kernel(p);
  return static_cast<int>(cudaGetLastError());
}

// One decode call. q: (B, s_q, H, 576) bf16; kv: (num_blocks, 64, 576) bf16 (page stride
// kv_page_stride elements); out: (B, s_q, H, 512) bf16; lse: (B, s_q, H) f32; lse_accum:
// (B + num_sm_parts, s_q * H) f32; o_accum: (B + num_sm_parts, s_q * H, 512) f32.
int fm_decode(const void* q, const void* kv, long long kv_page_stride, int num_blocks, const int* block_table,
              long long block_table_stride, const int* seqlens_k, int b, int s_q, int h_q, float scale,
              int is_causal, void* out, float* lse, float* lse_accum, float* o_accum, void* sched_meta,
              const int* num_splits, int num_sm_parts, cudaStream_t stream) {
  const int rows = s_q * h_q;  // q_seq_per_hk with one KV head
  DenseAttnDecodeParams p{};
  p.b = b;
  p.s_q = s_q;
  p.q_seq_per_hk = rows;
  p.d = kDk;
  p.d_v = kDv;
  p.h_q = h_q;
  p.h_k = 1;
  p.num_blocks = num_blocks;
  p.q_head_per_hk = h_q;
  p.is_causal = s_q > 1 && is_causal;
  p.scale_softmax = scale;
  p.scale_softmax_log2 = static_cast<float>(scale * M_LOG2E);
  p.q_ptr = const_cast<void*>(q);
  p.k_ptr = const_cast<void*>(kv);
  p.o_ptr = out;
  p.softmax_lse_ptr = lse;
  p.q_batch_stride = static_cast<int64_t>(rows) * kDk;
  p.k_batch_stride = kv_page_stride;
  p.o_batch_stride = static_cast<int64_t>(rows) * kDv;
  p.q_row_stride = kDk;
  p.k_row_stride = kDk;
  p.o_row_stride = kDv;
  p.q_head_stride = kDk;  // one KV head: never stepped
  p.k_head_stride = kDk;
  p.o_head_stride = static_cast<int64_t>(rows) * kDv;
  p.block_table = const_cast<int*>(block_table);
  p.block_table_batch_stride = block_table_stride;
  p.page_block_size = kBlockN;
  p.seqlens_k_ptr = const_cast<int*>(seqlens_k);
  p.tile_scheduler_metadata_ptr = static_cast<DecodingSchedMeta*>(sched_meta);
  p.num_sm_parts = num_sm_parts;
  p.num_splits_ptr = const_cast<int*>(num_splits);
  p.total_num_splits = b + num_sm_parts;
  p.softmax_lseaccum_ptr = lse_accum;
  p.oaccum_ptr = o_accum;
  p.stream = stream;
  sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);

  // The combine reads the (B, s_q, H) LSE and output views of the same buffers (one KV head).
  CombineParams c = {b, s_q, h_q, kDv,
                     lse, out, rows, h_q, h_q * s_q * kDv, h_q * kDv, kDv,
                     lse_accum, o_accum, rows, h_q, h_q * s_q * kDv, h_q * kDv, kDv,
                     static_cast<DecodingSchedMeta*>(sched_meta), const_cast<int*>(num_splits), num_sm_parts,
                     nullptr, stream};
  smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
