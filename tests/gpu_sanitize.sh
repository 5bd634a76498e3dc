#!/usr/bin/env bash
# A reduced GPU matrix under compute-sanitizer's four tools, one pytest run per tool (sm_90a GPU).
#
#   bash tests/gpu_sanitize.sh            # all four tools
#   bash tests/gpu_sanitize.sh racecheck  # only the named ones
#
# Cases (tests/test_mla_gpu.py, picked by -k on their parameter ids; initcheck runs
# tests/gpu_initcheck.py instead, whose cases put no PyTorch kernel on the GPU): B <= 16, short KV, both
# kernel paths (page 64: TMA; page 1: cp.async, any page size), uniform and ragged, sinks, zero
# lengths. The kernels are checked only where their names contain "mla_" (our kernels), so
# PyTorch's and cuBLAS's kernels (the reference) run uninstrumented and fast.
#
# Knobs: COMPUTE_SANITIZER (binary), SANITIZE_K (the -k expression), SANITIZE_TOOL_TIMEOUT
# (seconds per tool, default 240), SANITIZE_ALL_KERNELS=1 (instrument every kernel).
# Writes <tool>.log and summary.txt under $OUT when it is set. Exit status: 0 when every tool ran
# clean and every test passed, else 1 (the summary names the tool and why).
set -uo pipefail
cd "$(dirname "$0")/.."

san="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
if [[ ! -x "$san" ]]; then
  echo "gpu_sanitize: compute-sanitizer not found (not on PATH, not $san); set COMPUTE_SANITIZER" >&2
  exit 2
fi

# [B-q-H-page-kind-ragged: uniform page 64; uniform q2 page 1; ragged page 1 with sinks; ragged
# page 64 (B 3); an fp8 cache of page 8 (the narrow fp8 kernel, 8 TMA chunks per block) and of
# page 1 (its cp.async twin); fp8 at H 128: uniform q2 page 32 (the wide kernels, 64-row units,
# with either query), ragged page 1 (32-row units, four CTAs side by side); the bf16 narrow
# kernel at 32 rows (q8 H3); plus the zero-length (padded slot) test; the fp8 cases run with a
# bf16 and with an e4m3 query (the _fp8q kernels).
k_default='[1-1-16-64-short-False or [8-2-16-1-short-False or 128-1-short-True'
k_default+=' or [3-q_len17-128-64-mixed-True or [8-1-16-8-mixed or [4-1-16-1-mixed or test_zero_length_requests'
k_default+=' or [8-2-128-32-mixed or [8-q_len23-128-1-short or [64-8-3-64-short-False'
k_expr="${SANITIZE_K:-$k_default}"
tool_timeout="${SANITIZE_TOOL_TIMEOUT:-240}"
tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(memcheck racecheck initcheck synccheck)

out_dir="${OUT:-}"
log_dir="${out_dir:-$(mktemp -d)}"
mkdir -p "$log_dir"
summary="$log_dir/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

filter=()
if [[ "${SANITIZE_ALL_KERNELS:-0}" != 1 ]]; then
  help="$("$san" --help 2>&1)"
  if grep -q -- '--kernel-name' <<<"$help"; then
    filter=(--kernel-name kns=mla_)
  elif grep -q -- '--filter' <<<"$help"; then
    filter=(--filter kns=mla_)  # older releases
  fi
fi

say "compute-sanitizer: $("$san" --version 2>&1 | tail -n 1)"
say "cases: -k \"$k_expr\"  kernel filter: ${filter[*]:-none}"
# Build the launcher and load the cubin before any tool runs: compiles are not what we check.
if ! python3 -c 'import jit_mla.launcher as l; l.get_launcher()'; then
  say "FAIL: the launcher or its cubin did not load outside the sanitizer"
  exit 1
fi
python3 -m pytest -q --collect-only tests/test_mla_gpu.py -k "$k_expr" 2>&1 | grep '::' | tee -a "$summary"

status=0
for tool in "${tools[@]}"; do
  extra=()
  case "$tool" in
    memcheck | initcheck | synccheck) ;;
    racecheck) extra=(--racecheck-report all) ;;
    *) say "FAIL: unknown tool $tool"; status=1; continue ;;
  esac
  log="$log_dir/$tool.log"
  start=$SECONDS
  if [[ "$tool" == initcheck ]]; then
    # Its own cases, with no PyTorch kernel on the GPU (see tests/gpu_initcheck.py): under pytest
    # the uninstrumented reductions of the test itself read as uninitialized memory.
    timeout -k 10 "$tool_timeout" "$san" --tool initcheck --target-processes all --error-exitcode 99 \
      python3 tests/gpu_initcheck.py >"$log" 2>&1
  else
    timeout -k 10 "$tool_timeout" "$san" --tool "$tool" --target-processes all --error-exitcode 99 \
      "${filter[@]}" "${extra[@]}" \
      python3 -m pytest -q -x -p no:cacheprovider tests/test_mla_gpu.py -k "$k_expr" >"$log" 2>&1
  fi
  rc=$?
  secs=$((SECONDS - start))
  errors="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY' "$log" | tail -n 3 | tr '\n' ' ')"
  tests="$(grep -E '^[0-9]+ (passed|failed|skipped|errors?|deselected)\b|initcheck cases passed' "$log" | tail -n 1)"
  case "$rc" in
    0) verdict="clean" ;;
    99) verdict="ERRORS REPORTED" ;;
    124 | 137) verdict="TIMED OUT after ${tool_timeout} s (raise SANITIZE_TOOL_TIMEOUT)" ;;
    *) verdict="FAILED (exit $rc: a test failed or the run crashed)" ;;
  esac
  say "$tool: $verdict in ${secs} s; ${errors:-no summary line}; pytest: ${tests:-no result line}"
  if [[ $rc -ne 0 ]]; then
    status=1
    # The first reports, so the summary alone says what broke.
    grep -m 20 -E '^========= (Invalid|Error|Race|Uninitialized|Barrier|Program hit|  )' "$log" \
      | sed 's/^/    /' | tee -a "$summary"
  fi
done

say "logs: $log_dir"
exit "$status"
