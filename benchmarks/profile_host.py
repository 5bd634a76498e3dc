"""Where the host time of one eager call goes: the wrapper, TVM-FFI, validation, launches.

    python benchmarks/profile_host.py [--json PATH]

Each line is the median host time of one call (bursts of 100 calls, then a sync, so the launch
queue never fills and no call waits for the GPU; the last lines repeat some with shorter bursts,
down to 1: a sync before every call), on a one-page shape (B 1, kv 64, H 16, q 1).
Differences between lines attribute the time:

    api (out given)         the public function as an engine calls it
    api (out allocated)     + torch.empty for out
    api, check_inputs=True  + the opt-in checks of device values (a few kernels, one sync)
    launcher                the TVM-FFI call alone (mla_decode, 16 arguments, as the wrapper calls it)
    launcher, 28-arg entry  the same through trtllm_paged_attention_decode (FlashInfer's arguments)
    launcher, no PDL        the same without the programmatic-launch attribute
    launcher, B = 0         FFI + validation, no launch (returns before the stream and launches)
    ffi, 0 args             cubin_loaded(): the floor of one TVM-FFI call
    ffi, 4 ints             workspace_size(...)
    torch.empty, x.zero_()  PyTorch's own costs for comparison (an allocation, one launch)
"""

from __future__ import annotations

import argparse
import json

import torch

import jit_mla
from bench_mla import SM_SCALE, host_median_us  # benchmarks/ is on sys.path: this script's folder
from jit_mla import api
from jit_mla.launcher import get_launcher


def host_median(fn, burst: int = 100, samples_wanted: int = 3000) -> float:
    """Median host time of one call; `burst` calls between syncs (1: the GPU is idle at every call)."""
    return host_median_us(fn, torch.cuda.synchronize, samples_wanted, burst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--import-flashinfer", action="store_true",
                    help="import flashinfer first (as bench_mla.py does), to see whether it changes the costs")
    args = ap.parse_args()
    if args.import_flashinfer:
        import flashinfer.mla  # noqa: F401
    dev = "cuda"
    b, h, page = 1, 16, 64
    cache = torch.randn(4, page, 576, device=dev).to(torch.bfloat16)
    table = torch.tensor([[2]], dtype=torch.int32, device=dev)
    seq = torch.full((b,), page, dtype=torch.int32, device=dev)
    q = torch.randn(b, 1, h, 576, device=dev).to(torch.bfloat16)
    out = torch.empty(b, 1, h, 512, device=dev, dtype=torch.bfloat16)
    ws = torch.empty(jit_mla.get_workspace_size(b, h, 1), dtype=torch.uint8, device=dev)
    scale = SM_SCALE
    fn = jit_mla.trtllm_batch_decode_with_kv_cache_mla

    def api_out():
        fn(q, cache, ws, 128, 512, 64, table, seq, page, out=out, bmm1_scale=scale)

    def api_checked():
        fn(q, cache, ws, 128, 512, 64, table, seq, page, out=out, bmm1_scale=scale, check_inputs=True)

    def api_alloc():
        fn(q, cache, ws, 128, 512, 64, table, seq, page, bmm1_scale=scale)

    launcher = get_launcher()
    sm = api._sm_count(q.device)
    nbytes = ws.numel()

    def trtllm_args(pdl: bool, batch: int):  # FlashInfer's 28-argument entry
        qq, tt, ss, oo = (q, table, seq, out) if batch else (q[:0], table[:0], seq[:0], out[:0])
        return (oo, None, qq, cache, cache, ws, tt, ss, 1, page, scale, 1.0, -1.0, -1, 0, batch, -1, 0,
                sm, pdl, nbytes, None, None, None, None, None, True, None)

    def compact_args(pdl: bool, batch: int):  # the 16-argument entry the wrapper uses
        qq, tt, ss, oo = (q, table, seq, out) if batch else (q[:0], table[:0], seq[:0], out[:0])
        return (oo, None, qq, cache, ws, tt, ss, None, None, scale, 1.0, 1, batch, sm, pdl, page)

    a_pdl, a_nopdl, a_empty = compact_args(True, b), compact_args(False, b), compact_args(True, 0)
    a_trtllm = trtllm_args(True, b)
    entry, trtllm = launcher.mla_decode, launcher.trtllm_paged_attention_decode
    small = torch.empty(16, device=dev)
    rows = [
        ("api (out given)", api_out),
        ("api (out allocated)", api_alloc),
        ("api, check_inputs=True", api_checked),
        ("launcher", lambda: entry(*a_pdl)),
        ("launcher, FlashInfer's 28-arg entry", lambda: trtllm(*a_trtllm)),
        ("launcher, no PDL", lambda: entry(*a_nopdl)),
        ("launcher, B = 0", lambda: entry(*a_empty)),
        ("ffi, 0 args", launcher.cubin_loaded),
        ("ffi, 4 ints", lambda: launcher.workspace_size(1, 1, 16, 132)),
        ("torch.empty(out)", lambda: torch.empty(b, 1, h, 512, device=dev, dtype=torch.bfloat16)),
        ("x.zero_() (one torch launch)", small.zero_),
        ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
    ]
    for _, f in rows:  # warm up: build, load, allocator
        for _ in range(200):
            f()
    torch.cuda.synchronize()
    result = {}
    for name, f in rows:
        result[name] = host_median(f)
        print(f"{name:34s} {result[name]:7.2f} us", flush=True)
    # Does the depth of the launch queue matter? The one-page call takes ~12 us of GPU time, about
    # its host time, so in bursts of 100 the queue grows; with bursts of 1 the GPU is idle.
    for name, f in (("api (out given)", api_out), ("launcher", lambda: entry(*a_pdl)),
                    ("x.zero_() (one torch launch)", small.zero_)):
        for burst in (20, 5, 1):
            key = f"{name}, bursts of {burst}"
            result[key] = host_median(f, burst=burst, samples_wanted=2000)
            print(f"{key:34s} {result[key]:7.2f} us", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
