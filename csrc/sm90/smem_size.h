// Shared-memory layout of the sm_90a attention kernel; host-visible so the launcher can raise
// the kernel's dynamic shared-memory limit to exactly what it uses.
#pragma once
#include <cstdint>

#include "../config.h"

namespace jit_mla::sm90 {

struct SharedStorage {
  uint8_t q[kTileBytes];              // sQ: (64 rows, 576) bf16, 9 boxes of (64, 64), swizzled
  uint8_t kv[kNumStages][kTileBytes]; // sK: (64 tokens, 576) bf16 per stage, same layout
  uint8_t p[kBoxBytes];               // sP: (64 rows, 64 tokens) bf16, one swizzled box
  float row_max[kNumWarpgroups][kBlockM];  // per-warpgroup row max of the current block
  float row_sum[kNumWarpgroups][kBlockM];  // per-warpgroup row sums at the end of a unit
};
// +1 KiB: the dynamic smem base is re-aligned to 1024 B, which the 128B swizzle pattern needs.
constexpr int kAttentionSmemBytes = (int)sizeof(SharedStorage) + 1024;
static_assert(kAttentionSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-block limit");

}  // namespace jit_mla::sm90
