// Timing probes (benchmarks/probe_seesaw.py and trace_phases.py build them; the shipped cubin
// has 0; their outputs are garbage, only times mean something): bit 0 drops every KV load of
// the seesaw kernel (no TMA, no waits: the math runs on whatever the stages hold), bit 1 its
// softmax arithmetic (mask, max, exps), bit 2 the combine phase (grid barrier and merge) of both
// kernels, bit 3 records each CTA's phase times (%globaltimer, ns) at its end, bit 4 the
// cycles thread 0 of each seesaw warpgroup spent in each kind of wait (box loads for QK^T, V
// loads, hand-offs, wgmma completion) and in each part of its units, bit 5 a clock64 timeline of
// one CTA's warpgroups over a few block pairs (TimelineEvent), bit 6 a clock timeline of the
// merge of warp 0 of CTA 0 (MergeEvent). Bits 3-6 record into global
// memory; the kernel mla_probe_dump (mla_sm90.cu, launched by the launcher's probe_dump) prints
// them. The attention kernels themselves never printf: a call in a kernel makes ptxas serialize
// its wgmmas (C7510; sessions 5 and 6 measured such builds). Kernel code only: the launcher does
// not include it.
#pragma once
#include <cstdint>
#include <cstdio>

#ifndef JIT_MLA_PROBE
#define JIT_MLA_PROBE 0
#endif

namespace jit_mla {
constexpr int kProbe = JIT_MLA_PROBE;
constexpr int kProbeMaxCtas = 1024;  // the records' CTA capacity, >= kMaxCtas (config.h)

// Phase marks of the trace probe, in the order a CTA passes them.
enum TraceMark : int {
  kMarkEntry = 0,   // kernel entry
  kMarkReady = 1,   // past the PDL wait: the previous kernel's memory is visible
  kMarkPlanned = 2, // the split plan is computed (the narrow bf16 kernel lists the splits later)
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
__device__ unsigned long long g_probe_wait[kProbeMaxCtas][2][kNumSites];
__device__ int g_probe_wait_ctas;

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
// Thread 0 of each warpgroup stores its sums for mla_probe_dump.
__device__ __forceinline__ void probe_waits_print() {
  if ((threadIdx.x & 127) == 0 && blockIdx.x < kProbeMaxCtas) {
    for (int i = 0; i < kNumSites; ++i) g_probe_wait[blockIdx.x][threadIdx.x >> 7][i] = s_probe_wait[threadIdx.x >> 7][i];
    if (threadIdx.x == 0 && blockIdx.x == 0) g_probe_wait_ctas = gridDim.x < kProbeMaxCtas ? gridDim.x : kProbeMaxCtas;
  }
}
#else
__device__ __forceinline__ long long probe_clock() { return 0; }
__device__ __forceinline__ void probe_file(int, long long) {}
__device__ __forceinline__ void probe_count(int) {}
__device__ __forceinline__ void probe_waits_reset() {}
__device__ __forceinline__ void probe_waits_print() {}
#endif

// Events of the timeline probe (bit 5), in the order of the names in benchmarks/trace_phases.py.
enum TimelineEvent : int {
  kTlPairStart = 0,  // top of a block pair (both warpgroups)
  kTlMaxDone,        // WG0: m0 published / WG1: m1 published
  kTlExpDone,        // exps done (WG1: P1 stored too)
  kTlPv1Issued,      // own-P RS PV issued
  kTlPv1Done,        // own-P PV complete
  kTlScaleGot,       // WG0: WG1's scale1 in / WG1: WG0's m0 in
  kTlPStored,        // WG0: P0' (rescaled to m1) stored and handed off
  kTlVReady,         // WG0: V_L(b+1) landed / WG1: V_R(b) landed
  kTlPGot,           // WG0: P1 in / WG1: P0' in
  kTlPv2Issued,      // the other warpgroup's P: SS PV issued
  kTlQkHalfIssued,   // WG0: QK^T boxes 0-3 of b+2 issued
  kTlPv2Done,        // the SS PV complete
  kTlQkIssued,       // all QK^T boxes of the next block issued (WG1: qk_block returned)
  kTlQkDone,         // QK^T of the next block complete
  kTlLoadsIssued,    // WG0: V_L(b+2) refill issued (after its own PV)
  // The narrow kernels (attention_narrow.cuh, attention_narrow_fp8.cuh): per warpgroup and block
  // ("pairs" is the warpgroup's block count there).
  kTlNBlockStart,    // top of a block
  kTlNQkDone,        // S^T complete (all boxes waited for, converted, multiplied)
  kTlNMaxShared,     // past the column-max barrier
  kTlNPShared,       // past the P barrier: PV may start
  kTlNPvIssued,      // PV's wgmmas issued (fp8: its loads done, refill issued)
  kTlNPvDone,        // PV complete
  // A unit change in the narrow kernels (`pairs`: the warpgroup's block count at that point).
  kTlNEpilogue,      // the unit's last block done: its epilogue starts
  kTlNUnitDone,      // the epilogue's stores issued, past its last CTA barrier
  kTlNUnitFound,     // the next unit looked up (unit_work's loads used)
  kTlNFirstIssued,   // its first blocks' TMA issued (their page ids used)
  kTlNQLanded,       // its Q in shared memory, past the prologue's CTA barrier
  kNumTlEvents,
};

// %globaltimer (ns), for the trace (bit 3) and timeline (bit 5) probes.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#if (JIT_MLA_PROBE & 32) != 0
constexpr int kTlCta = 0, kTlPair0 = 8, kTlPairs = 3, kTlMax = 46;  // static smem: the seesaw kernel leaves ~500 B
__shared__ unsigned int s_tl[2][kTlMax];  // (clock lo 24 bits << 8) | event
__shared__ int s_tl_n[2];
__shared__ unsigned long long s_tl_start[2];  // clock64 and %globaltimer at kernel entry
__device__ unsigned int g_tl[2][kTlMax];
__device__ int g_tl_n[2];
__device__ unsigned long long g_tl_clock[2];  // CTA kTlCta's cycles and ns over its life

__device__ __forceinline__ void tl_reset() {
  if (threadIdx.x < 2) s_tl_n[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    s_tl_start[0] = clock64();
    s_tl_start[1] = globaltimer_ns();
  }
}
// Thread 0 of the calling warpgroup records `ev` at the current clock, in CTA kTlCta for block
// pairs [kTlPair0, kTlPair0 + kTlPairs) of the CTA.
__device__ __forceinline__ void tl_mark(int ev, unsigned pairs) {
  if ((threadIdx.x & 127) == 0 && blockIdx.x == kTlCta && pairs >= kTlPair0 && pairs < kTlPair0 + kTlPairs) {
    const int wg = threadIdx.x >> 7, n = s_tl_n[wg];
    if (n < kTlMax) {
      s_tl[wg][n] = ((unsigned)clock() << 8) | (unsigned)ev;
      s_tl_n[wg] = n + 1;
    }
  }
}
// CTA kTlCta's marks to global memory for mla_probe_dump; with the SM clock over the CTA's life
// (cycles per ns), so the timeline converts to time.
__device__ __forceinline__ void tl_print() {
  if ((threadIdx.x & 127) == 0 && blockIdx.x == kTlCta) {
    const int wg = threadIdx.x >> 7;
    if (wg == 0) {
      g_tl_clock[0] = clock64() - s_tl_start[0];
      g_tl_clock[1] = globaltimer_ns() - s_tl_start[1];
    }
    g_tl_n[wg] = s_tl_n[wg];
    for (int i = 0; i < s_tl_n[wg]; ++i) g_tl[wg][i] = s_tl[wg][i];
  }
}
#else
__device__ __forceinline__ void tl_reset() {}
__device__ __forceinline__ void tl_mark(int, unsigned) {}
__device__ __forceinline__ void tl_print() {}
#endif

#if (JIT_MLA_PROBE & 8) != 0
__shared__ unsigned long long s_probe_trace[kNumMarks];
__shared__ int s_probe_range[4];  // the CTA's planned range: begin group, block, end group, block
__device__ unsigned long long g_probe_trace[kProbeMaxCtas][kNumMarks + 1];  // the marks, then the SM id
__device__ int g_probe_range[kProbeMaxCtas][4];
__device__ int g_probe_ctas;

// The CTA's share of the plan, [beg, end) in (group, block), printed with its marks: which CTAs
// run more pieces (a piece = the part of one group in the range) or finish late.
__device__ __forceinline__ void trace_range(int beg_group, int beg_block, int end_group, int end_block) {
  if (threadIdx.x == 0) {
    s_probe_range[0] = beg_group;
    s_probe_range[1] = beg_block;
    s_probe_range[2] = end_group;
    s_probe_range[3] = end_block;
  }
}

__device__ __forceinline__ void trace_mark(int mark) {
  if (threadIdx.x == 0) {
    if (mark == kMarkEntry)
      for (int i = 0; i < kNumMarks; ++i) s_probe_trace[i] = 0;  // a skipped mark prints 0
    s_probe_trace[mark] = globaltimer_ns();
  }
}
// Thread 0 of every CTA stores its marks for mla_probe_dump.
__device__ __forceinline__ void trace_print() {
  if (threadIdx.x == 0 && blockIdx.x < kProbeMaxCtas) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    for (int i = 0; i < kNumMarks; ++i) g_probe_trace[blockIdx.x][i] = s_probe_trace[i];
    g_probe_trace[blockIdx.x][kNumMarks] = sm;
    for (int i = 0; i < 4; ++i) g_probe_range[blockIdx.x][i] = s_probe_range[i];
    if (blockIdx.x == 0) g_probe_ctas = gridDim.x < kProbeMaxCtas ? gridDim.x : kProbeMaxCtas;
  }
}
#else
__device__ __forceinline__ void trace_mark(int) {}
__device__ __forceinline__ void trace_range(int, int, int, int) {}
__device__ __forceinline__ void trace_print() {}
#endif
// Events of the merge timeline probe (bit 6), in the order of the names in
// benchmarks/trace_phases.py: lane 0 of warp 0 of CTA 0, through its merge items. A mark after
// the first use of loaded values is when they arrived.
enum MergeEvent : int {
  kMeSynced = 0,  // past the grid barrier
  kMeUnit,        // a new unit: its lookup starts (the split list's load next)
  kMeSearched,    // the request search done (the group_prefix pivots used)
  kMeSlots,       // the slot scan done (the set ranges used)
  kMeWeights,     // the row's (rows') weights done (the split LSEs used)
  kMeRound,       // a round of partial loads consumed (FMAs issued on them)
  kMeStored,      // the item's (rows') output stored
  kNumMeEvents,
};

#if (JIT_MLA_PROBE & 64) != 0
constexpr int kMeMax = 64;
__device__ unsigned int g_me[kMeMax];  // (clock lo 24 bits << 8) | event
__device__ int g_me_n;
__device__ __forceinline__ bool me_recorder() {
  return blockIdx.x == 0 && threadIdx.x == 0;
}
__device__ __forceinline__ void me_reset() {
  if (me_recorder()) g_me_n = 0;
}
__device__ __forceinline__ void me_mark(int ev) {
  if (me_recorder()) {
    const int n = g_me_n;
    if (n < kMeMax) {
      g_me[n] = ((unsigned)clock() << 8) | (unsigned)ev;
      g_me_n = n + 1;
    }
  }
}
#else
__device__ __forceinline__ void me_reset() {}
__device__ __forceinline__ void me_mark(int) {}
#endif

#if (JIT_MLA_PROBE & 120) != 0
// What mla_probe_dump (one thread, after the attention launch) prints, one line per record, in
// the formats benchmarks/trace_phases.py parses.
__device__ __forceinline__ void probe_dump() {
#if (JIT_MLA_PROBE & 8) != 0
  for (int c = 0; c < g_probe_ctas; ++c) {
    const unsigned long long* t = g_probe_trace[c];
    const int* r = g_probe_range[c];
    printf("jit_mla-trace cta=%d sm=%llu t=%llu,%llu,%llu,%llu,%llu,%llu r=%d,%d,%d,%d\n", c, t[kNumMarks], t[0],
           t[1], t[2], t[3], t[4], t[5], r[0], r[1], r[2], r[3]);
  }
#endif
#if (JIT_MLA_PROBE & 16) != 0
  for (int c = 0; c < g_probe_wait_ctas; ++c)
    for (int wg = 0; wg < 2; ++wg) {
      const unsigned long long* w = g_probe_wait[c][wg];
      printf("jit_mla-waits cta=%d wg=%d c=%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n", c, wg, w[0], w[1], w[2],
             w[3], w[4], w[5], w[6], w[7]);
    }
#endif
#if (JIT_MLA_PROBE & 32) != 0
  printf("jit_mla-clock cycles=%llu ns=%llu\n", g_tl_clock[0], g_tl_clock[1]);
  for (int wg = 0; wg < 2; ++wg)
    for (int i = 0; i < g_tl_n[wg]; ++i)
      printf("jit_mla-tl wg=%d i=%d ev=%u t=%u\n", wg, i, g_tl[wg][i] & 255u, g_tl[wg][i] >> 8);
#endif
#if (JIT_MLA_PROBE & 64) != 0
  for (int i = 0; i < g_me_n && i < kMeMax; ++i)
    printf("jit_mla-mtl i=%d ev=%u t=%u\n", i, g_me[i] & 255u, g_me[i] >> 8);
#endif
}
#endif
}  // namespace jit_mla
