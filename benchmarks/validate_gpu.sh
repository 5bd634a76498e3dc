#!/bin/bash
# The full validation of a kernel change in one device call (issue 4's rule: nothing counts until
# the GPU suite and the benchmark ran after the last kernel edit), then an optional same-run A/B.
#
#   bash benchmarks/validate_gpu.sh COMMIT [VARIANT...]
#
# Run on the H200 from the repository root (device tool, carry [".gpu-wheels"], plus ".ab" when
# VARIANTs are named: `python benchmarks/ab.py prepare NAME PATCH...` here first). In order, each
# under a timeout, logs in $LOGS (default /tmp/o): the cubin's LDGSTS forms, GPU suite, fuzz
# (200 examples), the four sanitizers, the main job, the full benchmark with FlashInfer (JSON +
# PNG under $LOGS/results, labelled COMMIT), then `ab.py run --rounds 2 VARIANT...`. Everything is packed
# into $OUT/all.tgz after the benchmark and again at the end, so a run cut short still returns
# its logs. About 6 minutes without variants (suite ~125 s, fuzz ~35 s, sanitizers ~55 s,
# benchmark ~130 s at 55 rows with FlashMLA's column (Session 44), start-up); each variant adds
# ~120 s (two rounds of main and it, all 55 shapes). Shorter (Session 41: 251 s with one variant
# on 19 rows and 100 fuzz examples; Session 44: 384 s with the benchmark, one variant on 5 rows):
# AB_SHAPES=0,3,4,... (bench_mla.py indices) and FUZZ_EXAMPLES=100. AB_REPLAN=1:
# the A/B also times calls that cannot reuse a plan (ab.py run --replan; twice the time).
set -u
commit="${1:?usage: validate_gpu.sh COMMIT [VARIANT...]}"
shift
source .gpu-wheels/activate.sh
export JIT_MLA_CACHE_DIR="$PWD/.jitcache"
logs="${LOGS:-/tmp/o}"
mkdir -p "$logs"
step() {  # step NAME SECONDS COMMAND...: run it, log its output, record its exit status
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$logs/$name.txt" 2>&1
  echo "$name rc $? $(date +%T)" >> "$logs/steps.txt"
}
pack() { [[ -n "${OUT:-}" ]] && tar czf "$OUT/all.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$logs/smi.txt" 2>&1
# The GPU suite's files: ab.py's list, the one place that names them.
read -ra suite <<< "$(python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import ab; print(*ab.SUITE)')"
# ptxas 13.0 has emitted `LDGSTS [R+UR], desc[UR]` for a cp.async kernel, which the H200 rejects
# as an illegal instruction (a sticky error that fails the rest of the suite; perf-notes Sessions 9
# and 14). The cubin build checks it where it finds a disassembler (jit_mla/sass.py, the one
# definition of the check); the shipped cubin is checked again here with the toolkit's, before the tests.
step sass_check 60 python3 -c 'import sys; from jit_mla import sass
sys.exit(0 if sass.check_cubin(open("cubins/sm_90a/mla_sm90.cubin", "rb").read(), "cubins/sm_90a") else "no disassembler")'
step suite 240 python3 -m pytest -q "${suite[@]}"
JIT_MLA_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-200}" step fuzz 150 python3 -m pytest -q -s tests/test_fuzz_gpu.py
OUT="$logs/san" step san 180 bash tests/gpu_sanitize.sh
step main_job 90 python3 -m jit_mla
step bench 420 python3 benchmarks/bench_mla.py --out-dir "$logs/results" --commit "$commit"
pack
if [[ $# -gt 0 ]]; then
  per_variant=100
  [[ -n "${AB_REPLAN:-}" ]] && per_variant=200
  step ab $((60 + per_variant * $#)) python3 benchmarks/ab.py run --rounds 2 \
    ${AB_SHAPES:+--shapes "$AB_SHAPES"} ${AB_REPLAN:+--replan} "$@"
  pack
fi
cat "$logs/steps.txt"
tail -n 2 "$logs/suite.txt"
grep -E "^\| [0-9]+ \|" "$logs/bench.txt" || tail -n 5 "$logs/bench.txt"
[[ -f "$logs/ab.txt" ]] && grep "^|" "$logs/ab.txt"
exit 0
