// Split-KV planner, run on the device from seq_lens (no host sync, so it is safe inside CUDA-graph
// capture and independent of max_seq_len). Every CTA of the attention kernel runs it in its
// prologue (NT threads) instead of a planning kernel before it: one launch less per call (about
// 3 us of host time); the plan is small (a few scans over B and the groups) and deterministic, so
// all CTAs compute and write the same values to the workspace, which the combine phase reads.
//
// Work order: groups (m_group units run side by side) request by request; group g costs
// kUnitOverheadBlocks + its KV blocks. The total cost W is cut into equal ranges, one per CTA set
// (num_ctas / m_group of them); a cut falling inside a group's KV blocks splits it (the partials
// are merged by the combine phase), a cut falling in its overhead snaps to the group's start.
// Groups that all cost the same (a uniform decode batch) may instead go whole, a few to a set
// (more groups than sets, if that leaves >= kWholeGroupSetsPct % of the sets busy), or in equal
// pieces, one to a set (2 .. s_eff groups, if the largest piece passes the cost test): step 3.
// Deterministic: the same inputs give the same plan, so a call may reuse the one in the workspace
// when its inputs are those it was made from (plan_cache.cuh). plan_splits (steps 1-3) gives every
// CTA its range; list_split_groups (step 4) writes the list only the merge reads, so a kernel may run it
// later, behind its first loads (sm90/epilogue.cuh: start_cta, SplitList).
#pragma once
#include "../config.h"
#include "device_utils.cuh"
#include "params.h"
#include "rcp_div.cuh"
#include "units.cuh"

namespace jit_mla {

// The planner's shared scratch: warp totals of its scans, the groups' cost range. Static shared
// memory in most kernels (start_cta); a kernel that needs all 227 KiB as dynamic shared memory
// (the static part would push its base off the 512-byte alignment its swizzled tiles need) lends
// the planner a piece of it instead.
template <int NT>
struct PlanScratch {
  long long warp[NT / 32];
  int count[NT / 32];
  int cost_min, cost_max;
};

// The block-wide half of the scans below: lane `writer` of each warp publishes its warp's total
// in s[warp]; every thread then sums the totals of the warps before its own (its exclusive base,
// returned) and of all (*total) from shared memory. The planner is a serial chain in each warp
// (perf-notes, Session 14: ~1 µs per step), so NT / 32 independent loads rather than a scan of
// the totals by warp 0 behind one more barrier. s is reused by the next scan after the barrier.
template <int NT, typename T>
__device__ __forceinline__ T block_warp_base(T warp_total, int writer, T* s, T* total) {
  static_assert(NT % 32 == 0 && NT <= 1024, "whole warps, at most 32 of them");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == writer) s[warp] = warp_total;
  __syncthreads();
  T base = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) {
    const T t = s[w];
    base += w < warp ? t : 0;
    sum += t;
  }
  *total = sum;
  __syncthreads();
  return base;
}

// Exclusive block-wide scan of one int64 per thread (NT threads); returns the thread's prefix,
// *total the sum. s_warp: NT / 32 values of shared scratch.
template <int NT>
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* total, long long* s_warp) {
  const int lane = threadIdx.x & 31;
  long long x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  return block_warp_base<NT>(x, 31, s_warp, total) + x - v;  // lane 31 holds the warp's total
}

// Exclusive block-wide count of the threads with `flag` set (NT threads), as the scan above with
// a ballot in place of the warp's shuffles; *total the count. s_count: NT / 32 ints of scratch.
template <int NT>
__device__ __forceinline__ int block_exclusive_count(bool flag, int* total, int* s_count) {
  const int lane = threadIdx.x & 31;
  const unsigned m = __ballot_sync(0xffffffffu, flag);
  return block_warp_base<NT>(__popc(m), 0, s_count, total) + __popc(m & ((1u << lane) - 1));
}

template <int NT>
__device__ void plan_splits(const MlaParams& p, PlanScratch<NT>& scratch) {
  const int tid = threadIdx.x;
  const int B = p.batch;
  // Values one thread needs from another: scan totals come back in registers, the groups' cost
  // range is reduced in shared memory (a global write, barrier and read is an L2 round trip).
  int& s_cost_min = scratch.cost_min;
  int& s_cost_max = scratch.cost_max;
  if (tid == 0) {
    s_cost_min = INT_MAX;
    s_cost_max = INT_MIN;
  }
  // The loops over requests, groups and sets below stay rolled (`#pragma unroll 1`): at B <= 256
  // a thread runs one iteration of most of them, and the compiler's 4x unrolling with remainders
  // was ~540 instructions of every kernel's cold code (Session 34: B8 0.991 without it).

  // 1. group_prefix[b]: first group of request b. Each thread scans a contiguous chunk serially.
  int num_groups;
  if (p.cum_q == nullptr) {
    // A uniform q_len: every request has the same number of groups, no scan.
    const long long ng = request_num_groups(p, 0);
#pragma unroll 1
    for (int b = tid; b <= B; b += NT) p.group_prefix[b] = (int)min(b * ng, (long long)p.max_groups);
    num_groups = (int)min(B * ng, (long long)p.max_groups);
  } else {
    const int chunk = (B + NT - 1) / NT;
    const int b0 = min(B, tid * chunk), b1 = min(B, b0 + chunk);
    long long local = 0;
#pragma unroll 1
    for (int b = b0; b < b1; ++b) local += request_num_groups(p, b);
    long long total;
    long long run = block_exclusive_scan<NT>(local, &total, scratch.warp);
    // Valid prefix sums never exceed max_groups (the workspace's bound); overlapping ragged
    // ranges (an invalid cum_seq_lens_q) could: their excess groups are dropped, not written.
#pragma unroll 1
    for (int b = b0; b < b1; ++b) {
      p.group_prefix[b] = (int)min(run, (long long)p.max_groups);
      run += request_num_groups(p, b);
    }
    num_groups = (int)min(total, (long long)p.max_groups);
    if (tid == 0) p.group_prefix[B] = num_groups;
  }
  __syncthreads();

  // 2. cost_prefix[g+1] = cost of groups 0..g.
  long long W;
  {
    const int chunk = (num_groups + NT - 1) / NT;
    const int g0 = min(num_groups, tid * chunk), g1 = min(num_groups, g0 + chunk);
    long long local = 0;
    int cmin = INT_MAX, cmax = INT_MIN;
    const int b_g0 = g0 < g1 ? find_request(p, g0) : 0;  // one search (a chain of global reads)
    int b = b_g0;
#pragma unroll 1
    for (int g = g0; g < g1; ++g) {
      while (p.group_prefix[b + 1] <= g) ++b;
      const int c = kUnitOverheadBlocks + group_num_blocks(p, b, g - p.group_prefix[b]);
      local += c;
      cmin = min(cmin, c);
      cmax = max(cmax, c);
    }
    if (g0 < g1) {
      atomicMin(&s_cost_min, cmin);
      atomicMax(&s_cost_max, cmax);
    }
    long long run = block_exclusive_scan<NT>(local, &W, scratch.warp);  // its barriers publish the atomics
    if (g1 - g0 == 1) {
      // One group per thread (up to NT groups: every decode batch of B <= NT): its cost is
      // `local`, not worked out again on the plan's serial chain. (Not kept in cost_prefix
      // between the loops: every CTA writes the same workspace words, so another CTA may
      // already hold its prefix sums there.)
      p.cost_prefix[g0 + 1] = run + local;
    } else {
      b = b_g0;
#pragma unroll 1
      for (int g = g0; g < g1; ++g) {
        while (p.group_prefix[b + 1] <= g) ++b;
        run += kUnitOverheadBlocks + group_num_blocks(p, b, g - p.group_prefix[b]);
        p.cost_prefix[g + 1] = run;
      }
    }
    if (tid == 0) p.cost_prefix[0] = 0;
  }
  __syncthreads();

  // 3. Set boundaries. Few sets for little work: each gets at least per_set_min of the cost W.
  const int S = num_sets(p);
  const long long per_set_min = kMinBlocksPerCta + kUnitOverheadBlocks;
  int s_eff = (int)max(1LL, min((long long)S, (W + per_set_min - 1) / per_set_min));

  // Equal groups (a uniform decode batch) that do not divide evenly over the sets would all be
  // cut in two: split partials written, read and merged for nearly every unit. Whole groups on
  // slightly fewer sets (>= kWholeGroupSetsPct % of them) balance exactly and split nothing.
  // Equal groups fewer than the sets: the cuts at multiples of W / s_eff fall at every offset
  // inside the groups, so many sets end one group and start the next, and pay a second unit
  // start (measured ~3 bf16 / ~6 fp8 blocks of time, Session 18, against the cost model's 2).
  // Each group in k equal pieces on k * num_groups sets instead, every set one piece, when the
  // largest piece is not more than a set's share of W plus that underestimate: never slower by
  // the measured costs. k = 1 (a group per set) splits nothing: no partials, no merge.
  // The divisions by runtime counts below are rcp_div.cuh's (S, k <= kMaxCtas; the work total W
  // and a group's blocks can be large), exactly `/` and `%` on their ranges.
  int groups_per_set = 0, pieces_per_group = 0;
  QuotRem piece_blocks{0, 0};  // a group's blocks / pieces_per_group, for the pieces' starts
  {
    // All groups cost the same <=> min == max (no groups: nothing to balance).
    const bool uniform = s_cost_min == s_cost_max;
    if (uniform && num_groups > S) {
      // k = ceil(num_groups / S) >= 2; sets = ceil(num_groups / k) <= S, a quotient small
      // enough for div_ceil_small (the old num_groups + k - 1 overflowed from ~2^30 groups)
      const int k = divmod_u31(num_groups - 1, S, rcp_approx(static_cast<float>(S))).quot + 1;
      const int sets = div_ceil_small(num_groups, k, rcp_approx(static_cast<float>(k)));
      if (sets * 100 >= S * kWholeGroupSetsPct) {
        groups_per_set = k;
        s_eff = sets;
      }
    } else if (uniform && num_groups > 1 && num_groups <= s_eff) {  // one group: no set crosses a group
      const int k = divmod_small(s_eff, num_groups, rcp_approx(static_cast<float>(num_groups))).quot;
      const int nb = s_cost_min - kUnitOverheadBlocks;
      const QuotRem qr = divmod_u31(nb, k, rcp_approx(static_cast<float>(k)));
      const long long largest = qr.quot + (qr.rem != 0);  // ceil(nb / k)
      if (nb >= k && largest * s_eff <= W + (long long)kPieceStartExtraBlocks * s_eff) {
        pieces_per_group = k;
        piece_blocks = qr;
        s_eff = k * num_groups;
      }
    }
  }
  // The even cuts s * W / s_eff as s * (W / s_eff) + s * (W % s_eff) / s_eff: one wide division
  // here, a small one (s * (W % s_eff) < s_eff^2 <= 2^20) per set.
  const float rcp_s_eff = rcp_approx(static_cast<float>(s_eff));
  QuotRem64 w_per_set{0, 0};
  if (groups_per_set == 0 && pieces_per_group == 0) w_per_set = divmod_u62(W, s_eff, rcp_s_eff);
  const float rcp_pieces = rcp_approx(static_cast<float>(pieces_per_group));  // inf when 0: then unused
#pragma unroll 1
  for (int s = tid; s <= S; s += NT) {
    WorkPos pos{num_groups, 0};
    if (groups_per_set > 0) {
      pos = WorkPos{(int)min((long long)s * groups_per_set, (long long)num_groups), 0};
    } else if (pieces_per_group > 0) {
      if (s < s_eff) {
        // piece i = s % k of group s / k starts at floor(i * nb / k) = i * (nb / k) +
        // i * (nb % k) / k, where i * (nb % k) < k^2 <= 2^20
        const QuotRem gi = divmod_small(s, pieces_per_group, rcp_pieces);
        const int frac = divmod_small(gi.rem * piece_blocks.rem, pieces_per_group, rcp_pieces).quot;
        pos = WorkPos{gi.quot, gi.rem * piece_blocks.quot + frac};
      }
    } else {
      // (unsigned: s and the quotient are >= 0, so their 64-bit sums need no sign extension)
      const long long x = s >= s_eff ? W
          : (unsigned)s * w_per_set.quot + (unsigned)divmod_small(s * w_per_set.rem, s_eff, rcp_s_eff).quot;
      if (x < W) {
        int lo = 0, hi = num_groups - 1;  // largest g with cost_prefix[g] <= x
        while (lo < hi) {
          const int mid = (lo + hi + 1) >> 1;
          if (p.cost_prefix[mid] <= x) lo = mid; else hi = mid - 1;
        }
        const long long k = x - p.cost_prefix[lo] - kUnitOverheadBlocks;
        pos = WorkPos{lo, k > 0 ? (int)k : 0};
      }
    }
    p.bounds[s] = pos;
  }
  __syncthreads();  // the caller reads bounds and group_prefix next
}

// 4. Groups split by at least one cut, listed once each (at their first cut s) for the combine,
//    with their first set s - 1 (its range holds the group's start: bounds[s - 1] is not inside
//    the group, or s would not be the first cut). Boundaries 1..S-1, NT at a time (the loop
//    bound is uniform: every thread scans). After plan_splits, by every thread of the CTA (its
//    barriers); the merge reads the list after the grid barrier, the CTA's own threads its count
//    before (combine_splits).
template <int NT>
__device__ void list_split_groups(const MlaParams& p, PlanScratch<NT>& scratch) {
  const int tid = threadIdx.x;
  const int S = num_sets(p);
  long long listed = 0;
#pragma unroll 1
  for (int base = 0; base < S; base += NT) {
    const int s = base + tid;
    bool first_cut = false;
    int group = 0;
    if (s >= 1 && s < S) {
      const WorkPos cur = p.bounds[s], prev = p.bounds[s - 1];
      first_cut = cur.block > 0 && !(prev.group == cur.group && prev.block > 0);
      group = cur.group;
    }
    int count;
    const int idx = block_exclusive_count<NT>(first_cut, &count, scratch.count);
    if (first_cut) {
      p.split_groups[1 + 2 * (listed + idx)] = group;
      p.split_groups[2 + 2 * (listed + idx)] = s - 1;
    }
    listed += count;
  }
  if (tid == 0) p.split_groups[0] = (int)listed;
  __syncthreads();  // the count is read by every thread of the CTA (combine_splits)
}

}  // namespace jit_mla
