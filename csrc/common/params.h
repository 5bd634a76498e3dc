// MlaParams: the one struct the launcher fills and the kernel (plan, attention, combine) reads.
// Passed by value as a __grid_constant__ kernel parameter. Host and device share this header.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "fast_div.h"

namespace jit_mla {

// A position in the plan's work order: KV block `block` of group `group`. A unit is a tile of
// 2^unit_rows_log2 (query token x head) rows of one request (64 for the 64-row kernels, 16 or 32
// for the narrow ones); a group is m_group consecutive units of one request that m_group CTAs
// run side by side over the same KV blocks. Groups are numbered request by request.
struct WorkPos {
  int group;
  int block;
};

// Words of the plan's key (the launcher's, plan_cache.cuh): everything the split plan depends on
// besides the input values.
constexpr int kPlanKeyWords = 12;
// The key's first word: the plan's format and rules (plan.cuh, config.h's constants). A cubin
// whose plan differs for the same inputs must use another.
constexpr int kPlanFormat = 0x4a4d5004;

struct MlaParams {
  // TMA descriptor of the KV cache: dims (576, page_size, num_pages), box (64, kv_box_rows, 1),
  // 128-byte swizzle. First member: a CUtensorMap must be 64-byte aligned.
  CUtensorMap kv_tmap;
  int num_pages;
  int kv_box_rows;            // min(page_size, 64): rows of one TMA box

  // ---- inputs -------------------------------------------------------------------------------
  const void* q;              // q: [total_q, H, 576] bf16, contiguous
  const void* kv;             // kv pages: row (page p, slot s) at kv + p*kv_page_stride + s*kv_row_stride
  int64_t kv_page_stride;     // elements
  int64_t kv_row_stride;      // elements (576 unless a strided view into a wider pool)
  const int* block_tables;    // [B, max_pages] int32
  int64_t block_table_stride; // elements between rows
  const int* seq_lens;        // [B] int32: KV length including this step's query tokens
  const int* cum_q;           // [B+1] int32 prefix sums of query lengths, or null (uniform)
  int q_len;                  // uniform query length when cum_q is null
  int total_q;                // query rows (tokens) in q: request ranges are clamped to it
  int kv_cap;                 // block_tables.size(1) * page_size (<= 2^31 - 2^16): KV lengths are clamped to it
  int batch;
  FastDiv page_div;           // page size as a multiply-shift divisor (a token's page and row; .d is the size)
  FastDiv head_div;           // the head count H, likewise (.d is H; a query row's token and head)

  const float* sinks;         // [H] float32 or null; logit units (not scaled by bmm1_scale)
  const float* bmm1_scale_ptr;  // one float32 on the device, or null: use bmm1_scale
  const float* bmm2_scale_ptr;
  float bmm1_scale;
  float bmm2_scale;

  // ---- outputs ------------------------------------------------------------------------------
  void* out;                  // out: [total_q, H, 512] bf16, contiguous
  float* lse;                 // [total_q, H] float32 base 2, or null

  // ---- workspace (laid out by workspace_layout in the launcher) -------------------------------
  int* group_prefix;          // [B+1]: first group of each request
  int64_t* cost_prefix;       // [max_groups+1]: cumulative cost of groups, in KV-block units
  WorkPos* bounds;            // [num_ctas/m_group + 1]: CTA set s works on [bounds[s], bounds[s+1])
  int* split_groups;          // [1 + 2 num_ctas]: count, then (group, its first set) of each split group
  float* partial_lse;         // [kSlotsPerCta * num_ctas, 64]: a unit's rows (<= 64) at the start
  float* partial_o;           // [kSlotsPerCta * num_ctas, 64, 512] fp32 slots: a split unit's
                              // normalized partial as bf16 rows in the slot's first half
                              // (partial_row), the fp8 kernels' O^T promotion in fp32
  int* plan_header;           // [kPlanKeyWords] at the workspace's start: the last published plan's key
  int* plan_input_copy;       // [B (+ B+1)]: the seq_lens (and cum_q) that plan was made from
  int plan_span4;             // int4s of the plan's span from group_prefix (bounds, split_groups
                              // and padding), each one's shadow as many int4s further on
  int plan_key[kPlanKeyWords];  // this call's key (plan_cache.cuh), by the launcher
  int plan_check;             // 1: look for this call's plan in the workspace (the last call there had its key)
  int max_groups;             // upper bound of the group count (sizes cost_prefix)
  int num_ctas;               // grid of the attention kernel (cooperative), a multiple of m_group
  int m_group;                // CTAs per set: units of a group run side by side (1, 2 or 4)
  int m_group_log2;           // its log2: the device divides by m_group with shifts
  int unit_rows_log2;         // log2 of a unit's rows: 6 (kBlockM) or the narrow kernel's kN (4, 5)
};

}  // namespace jit_mla
