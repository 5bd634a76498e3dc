// Timing probes (benchmarks/probe_seesaw.py builds them; the shipped cubin has 0; their outputs
// are garbage): bit 0 drops every KV load of the seesaw kernel (no TMA, no waits: the math runs
// on whatever the stages hold), bit 1 its softmax arithmetic (mask, max, exps), bit 2 the
// combine phase (grid barrier and merge) of both kernels. Kernel code only: the launcher does
// not include it.
#pragma once

#ifndef JIT_MLA_PROBE
#define JIT_MLA_PROBE 0
#endif

namespace jit_mla {
constexpr int kProbe = JIT_MLA_PROBE;
}  // namespace jit_mla
