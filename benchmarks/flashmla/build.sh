#!/usr/bin/env bash
# Builds libflashmla_side.so: FlashMLA's sm90 dense bf16 decode (its split-KV kernel, combine and
# scheduler, from a FlashMLA checkout) behind our C entry points (glue.cu), for the benchmark's
# FlashMLA column. Benchmark-only: jit_mla never loads it. Build here (nvcc, no GPU needed) and
# carry the .so to the H200; benchmarks/flashmla_side.py finds it through JIT_MLA_FLASHMLA_LIB or
# .flashmla/.
#
#   bash benchmarks/flashmla/build.sh FLASHMLA_DIR [OUT_DIR]     # OUT_DIR defaults to .flashmla
#
# FLASHMLA_DIR: a checkout of deepseek-ai/FlashMLA (measured at 9241ae3), or a bare clone of it
# (its HEAD is extracted into a temporary folder). An empty CUTLASS submodule is fine: the headers
# of the nvidia-cutlass wheel (4.2) are used then. The commit goes into OUT_DIR/FLASHMLA_COMMIT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fm="$(cd "${1:?usage: build.sh FLASHMLA_DIR [OUT_DIR]}" && pwd)"
out="${2:-$root/.flashmla}"
mkdir -p "$out"
commit="$(git -C "$fm" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ ! -d "$fm/csrc" ] && [ "$commit" != unknown ]; then  # a bare clone: take its HEAD's csrc
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  git -C "$fm" archive HEAD csrc | tar x -C "$tmp"
  fm="$tmp"
fi

cutlass="$fm/csrc/cutlass"
if [ ! -f "$cutlass/include/cute/tensor.hpp" ]; then
  cutlass="$(python -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source"))')"
fi

# FlashMLA's own nvcc flags (its setup.py), sm_90a only, bf16 only.
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16 -Wno-deprecated-declarations
       -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
       -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
       --ptxas-options=--register-usage-level=10 -gencode arch=compute_90a,code=sm_90a
       -Xcompiler -fPIC
       -I"$fm/csrc" -I"$fm/csrc/kerutils/include" -I"$fm/csrc/sm90"
       -I"$cutlass/include" -I"$cutlass/tools/util/include")
sources=("$here/glue.cu"
         "$fm/csrc/sm90/decode/dense/instantiations/bf16.cu"
         "$fm/csrc/smxx/decode/combine/combine.cu"
         "$fm/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu")

objs=() pids=()
for src in "${sources[@]}"; do
  obj="$out/$(basename "$src" .cu).o"
  nvcc "${flags[@]}" -c "$src" -o "$obj" &
  objs+=("$obj") pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
# The CUDA runtime shared (the one torch loaded; the driver is reached through it: CUTLASS's
# host adapter asks cudaGetDriverEntryPoint for cuTensorMapEncodeTiled, so no libcuda link).
nvcc -shared -cudart shared -gencode arch=compute_90a,code=sm_90a -o "$out/libflashmla_side.so" "${objs[@]}"
rm -f "${objs[@]}"
echo "deepseek-ai/FlashMLA $commit" > "$out/FLASHMLA_COMMIT"
echo "FlashMLA $commit -> $out/libflashmla_side.so"
