"""One MLA call on a benchmark shape, for profilers (ncu, compute-sanitizer): no timing, no checks.

    ncu --kernel-name mla_sm90_attention --launch-skip 1 --launch-count 1 \\
        python benchmarks/profile_one.py --shape 128,1,128,4096

FlashInfer's fa3 MLA on a benchmark row instead (its data and plan as bench_mla.py makes them):

    ncu --kernel-name-base demangled --kernel-name regex:flashinfer --launch-skip 2 \\
        --launch-count 1 python benchmarks/profile_one.py --flashinfer-row 4 --calls 4

FlashMLA's sm90 dense decode likewise (`--flashmla-row INDEX`: flashmla_side.py's library, its
schedule made once before the calls; kernel regex:flash_fwd_splitkv_mla).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

import jit_mla
from bench_mla import SM_SCALE  # benchmarks/ is on sys.path: this script's folder


@dataclass
class UniformCall:
    """Inputs of one uniform decode call: B requests of kv tokens on random distinct pages."""

    q: torch.Tensor      # [B, q_len, H, 576] bf16
    cache: torch.Tensor  # [B * pages, page, 576] bf16 or float8_e4m3fn
    table: torch.Tensor  # [B, pages] int32, a permutation of the pool
    seq: torch.Tensor    # [B] int32, all kv
    ws: torch.Tensor     # workspace bytes
    kv: int

    def run(self, table: torch.Tensor | None = None, **kw) -> None:
        jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            self.q, self.cache, self.ws, 128, 512, 64, self.table if table is None else table, self.seq,
            self.kv, bmm1_scale=SM_SCALE, **kw)


def uniform_call(b: int, q_len: int, h: int, kv: int, page: int = 64, dev: str = "cuda",
                 fp8: bool = False, fp8_query: bool = False) -> UniformCall:
    """fp8: the cache in float8_e4m3fn (the same random values, rounded), as issue 5's kernels read it;
    fp8_query: the query too (with fp8)."""
    pages = (kv + page - 1) // page
    cache = torch.randn(b * pages, page, 576, device=dev)
    return UniformCall(
        q=torch.randn(b, q_len, h, 576, device=dev).to(torch.float8_e4m3fn if fp8_query else torch.bfloat16),
        cache=cache.to(torch.float8_e4m3fn if fp8 else torch.bfloat16),
        table=torch.randperm(b * pages, device=dev, dtype=torch.int32).view(b, pages),
        seq=torch.full((b,), kv, dtype=torch.int32, device=dev),
        ws=torch.empty(jit_mla.get_workspace_size(b, h, q_len), dtype=torch.uint8, device=dev),
        kv=kv,
    )


def competitor_row(which: str, index: int, calls: int) -> None:
    """`calls` eager calls of FlashInfer's fa3 wrapper (which "flashinfer") or FlashMLA's dense
    decode ("flashmla") on bench_mla.py's row `index` (one page set, data as the benchmark makes it)."""
    import bench_mla

    shape = bench_mla.shape_table()[index]
    bench = bench_mla.Bench(quick=True)
    data = bench.shape_data(shape, 1)
    if which == "flashinfer":
        import flashinfer.mla as fi_mla

        ws = torch.empty(bench_mla.FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=bench.dev)
        (call,), _ = bench.flashinfer_calls(fi_mla, shape, data, ws)
    else:
        import flashmla_side

        lib, why = flashmla_side.load()
        if lib is None:
            raise SystemExit(why)
        if (na := flashmla_side.not_applicable(shape)) is not None:
            raise SystemExit(f"row {index}: {na}")
        (call,), _ = bench.flashmla_calls(lib, shape, data)
    for _ in range(calls):
        call()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="128,1,128,4096", help="B,Q_LEN,H,KV_LEN")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--fp8", action="store_true", help="a float8_e4m3fn KV cache")
    ap.add_argument("--fp8-query", action="store_true", help="the query in float8_e4m3fn too (implies --fp8)")
    ap.add_argument("--flashinfer-row", type=int, metavar="INDEX",
                    help="run FlashInfer's fa3 MLA on bench_mla.py's row INDEX instead (--shape ignored)")
    ap.add_argument("--flashmla-row", type=int, metavar="INDEX",
                    help="run FlashMLA's dense decode on bench_mla.py's row INDEX instead (--shape ignored)")
    args = ap.parse_args()
    for which, index in (("flashinfer", args.flashinfer_row), ("flashmla", args.flashmla_row)):
        if index is not None:
            competitor_row(which, index, args.calls)
            torch.cuda.synchronize()
            return
    b, q_len, h, kv = (int(x) for x in args.shape.split(","))
    call = uniform_call(b, q_len, h, kv, args.page, fp8=args.fp8 or args.fp8_query, fp8_query=args.fp8_query)
    for _ in range(args.calls):
        call.run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
