#!/bin/bash
# Session 34, call 2 (prepared in Session 33), after run_s34a.sh validated the merged
# s33-page-div (main = 2cf86c3's kernel). Variants on 2cf86c3:
#   .ab/ni    + docs/experiments/combine-row-weights-noinline.patch (row_weights __noinline__:
#             one shared copy instead of three inlined; ~590 instructions out of every kernel;
#             cubin sha256 85d692e4)
#   .ab/nipl  ni + docs/experiments/plan-loops-rolled.patch (the planner's runtime-bound loops
#             `#pragma unroll 1`; ~540 more; cubin e3fb44c5)
# Each variant's GPU suite, then a 3-round A/B on all rows (nipl / ni isolates the plan loops).
# Device: bash .ab/run_s34b.sh, carry [".gpu-wheels", ".ab/ni", ".ab/nipl", ".ab/run_s34b.sh"]
# (all of .ab is ~48 MB: with the wheels near the 64 MiB carry limit); ~250 s + ~230 s.
set -u
source .gpu-wheels/activate.sh
export JIT_MLA_CACHE_DIR="$PWD/.jitcache"
L=$OUT/s34b; mkdir -p $L
V="ni nipl"
read -ra suite <<< "$(python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import ab; print(*ab.SUITE)')"
ok=""
for v in $V; do
  (cd .ab/$v && JIT_MLA_CACHE_DIR=/tmp/ab_cache_$v PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -q "${suite[@]}" > $L/suite_$v.txt 2>&1; echo "suite $v rc $?" >> $L/steps.txt)
  grep -q "suite $v rc 0" $L/steps.txt && ok="$ok $v"
done
[ -n "$ok" ] && { timeout 300 python3 benchmarks/ab.py run --rounds 3 $ok > $L/ab.txt 2>&1; echo "ab rc $?" >> $L/steps.txt; }
cat $L/steps.txt; tail -qn 1 $L/suite_*.txt; grep "^|" $L/ab.txt | tail -n 50
