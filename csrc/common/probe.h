// Timing probes (benchmarks/probe_seesaw.py and trace_phases.py build them; the shipped cubin
// has 0; their outputs are garbage, only times mean something): bit 0 drops every KV load of
// the seesaw kernel (no TMA, no waits: the math runs on whatever the stages hold), bit 1 its
// softmax arithmetic (mask, max, exps), bit 2 the combine phase (grid barrier and merge) of both
// kernels, bit 3 prints each CTA's phase times (%globaltimer, ns) at its end, bit 4 prints the
// cycles thread 0 of each seesaw warpgroup spent in each kind of wait (box loads for QK^T, V
// loads, hand-offs, wgmma completion) and in each part of its units. Kernel code only: the
// launcher does not include it.
#pragma once
#include <cstdint>
#include <cstdio>

#ifndef JIT_MLA_PROBE
#define JIT_MLA_PROBE 0
#endif

namespace jit_mla {
constexpr int kProbe = JIT_MLA_PROBE;

// Phase marks of the trace probe, in the order a CTA passes them.
enum TraceMark : int {
  kMarkEntry = 0,   // kernel entry
  kMarkReady = 1,   // past the PDL wait: the previous kernel's memory is visible
  kMarkPlanned = 2, // the split plan is computed
  kMarkAttended = 3,// the CTA's attention work is done (partials or outputs written)
  kMarkSynced = 4,  // past the grid barrier (0: no unit was split, no barrier)
  kMarkDone = 5,    // merge done
  kNumMarks = 6,
};

// Where the wait probe (bit 4) files a warpgroup's cycles.
enum WaitSite : int {
  kSiteQkBox = 0,  // a QK^T k-step waiting for its KV box
  kSiteVBox = 1,   // a PV waiting for its V boxes
  kSiteHand = 2,   // waiting for the other warpgroup's hand-off (max, scale, P)
  kSiteMma = 3,    // wgmma.wait_group: waiting for this warpgroup's own tensor-core work
  kSiteLoop = 4,   // the whole block-pair loop of a unit
  kSiteProlog = 5, // a unit's start: first loads issued, Q loaded, first QK^T
  kSiteEpilog = 6, // a unit's end: row sums, output or partial stores
  kSitePairs = 7,  // block pairs run (a count, not cycles)
  kNumSites = 8,
};

#if (JIT_MLA_PROBE & 16) != 0
__shared__ unsigned long long s_probe_wait[2][kNumSites];

__device__ __forceinline__ long long probe_clock() { return clock64(); }
// Cycles since t0, filed under `site` by thread 0 of the calling warpgroup.
__device__ __forceinline__ void probe_file(int site, long long t0) {
  if ((threadIdx.x & 127) == 0) s_probe_wait[threadIdx.x >> 7][site] += clock64() - t0;
}
__device__ __forceinline__ void probe_count(int site) {
  if ((threadIdx.x & 127) == 0) s_probe_wait[threadIdx.x >> 7][site] += 1;
}
__device__ __forceinline__ void probe_waits_reset() {
  if (threadIdx.x < 2 * kNumSites) s_probe_wait[threadIdx.x / kNumSites][threadIdx.x % kNumSites] = 0;
}
// Thread 0 of each warpgroup prints its sums, one line, parsed by benchmarks/trace_phases.py.
__device__ __forceinline__ void probe_waits_print() {
  if ((threadIdx.x & 127) == 0) {
    const unsigned long long* w = s_probe_wait[threadIdx.x >> 7];
    printf("jit_mla-waits cta=%d wg=%d c=%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", (int)blockIdx.x,
           (int)(threadIdx.x >> 7), w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
  }
}
#else
__device__ __forceinline__ long long probe_clock() { return 0; }
__device__ __forceinline__ void probe_file(int, long long) {}
__device__ __forceinline__ void probe_count(int) {}
__device__ __forceinline__ void probe_waits_reset() {}
__device__ __forceinline__ void probe_waits_print() {}
#endif

#if (JIT_MLA_PROBE & 8) != 0
__shared__ unsigned long long s_probe_trace[kNumMarks];

__device__ __forceinline__ void trace_mark(int mark) {
  if (threadIdx.x == 0) {
    if (mark == kMarkEntry)
      for (int i = 0; i < kNumMarks; ++i) s_probe_trace[i] = 0;  // a skipped mark prints 0
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    s_probe_trace[mark] = t;
  }
}
// Thread 0 of every CTA prints its marks, one line, parsed by benchmarks/trace_phases.py.
__device__ __forceinline__ void trace_print() {
  if (threadIdx.x == 0) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long* t = s_probe_trace;
    printf("jit_mla-trace cta=%d sm=%u t=%llu,%llu,%llu,%llu,%llu,%llu\n", (int)blockIdx.x, sm,
           t[0], t[1], t[2], t[3], t[4], t[5]);
  }
}
#else
__device__ __forceinline__ void trace_mark(int) {}
__device__ __forceinline__ void trace_print() {}
#endif
}  // namespace jit_mla
