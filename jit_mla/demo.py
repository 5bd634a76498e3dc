"""``python -m jit_mla``: the main job.

On an sm_90a GPU: runs DeepSeek-V3-shaped MLA steps (decode, MTP verify, ragged speculative
decode) through the kernels, checks each against the float32 reference, and prints a table.
Without one: builds the launcher, runs the reference on a small case, and says what the kernels
need.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from . import env
from .api import get_workspace_size, trtllm_batch_decode_with_kv_cache_mla
from .launcher import build_launcher, get_launcher
from .reference import mla_reference

SM_SCALE = 1.0 / math.sqrt(128 + 64)  # DeepSeek-V3: qk_nope 128 + qk_rope 64


def _make_step(batch, q_lens, num_heads, kv_len, page_size, device, seed):
    """Random paged inputs for one step; q_lens: an int (uniform) or a list (ragged)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ragged = not isinstance(q_lens, int)
    lens = list(q_lens) if ragged else [q_lens] * batch
    pages_per = (kv_len + page_size - 1) // page_size
    kv = torch.randn(batch * pages_per, page_size, 576, generator=g).to(torch.bfloat16)
    table = torch.randperm(batch * pages_per, generator=g).to(torch.int32).view(batch, pages_per)
    total_q = sum(lens)
    q = torch.randn(total_q, num_heads, 576, generator=g).to(torch.bfloat16)
    if not ragged:
        q = q.view(batch, q_lens, num_heads, 576)
    cum = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32) if ragged else None
    seq = torch.full((batch,), kv_len, dtype=torch.int32)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(q), to(kv), to(table), to(seq), to(cum), max(lens)


def _prepare_launcher(load) -> None:
    """Run ``load`` (build_launcher or get_launcher), saying so first when it means a build."""
    from .cli import launcher_state

    try:
        so, built = launcher_state()
    except Exception:  # no toolkit, unreadable csrc/: the build itself reports it
        so, built = None, True
    if not built:
        print(f"building the launcher (first use, ~15 s) into {so.parent} ...", flush=True)
    t0 = time.perf_counter()
    load()
    print(f"launcher {'built' if not built else 'loaded'} in {time.perf_counter() - t0:.1f} s "
          f"(cache: {env.cache_dir()})", flush=True)


def _run_gpu(args: argparse.Namespace) -> int:
    from .cli import attention_kernel

    device = torch.device("cuda")
    repeat = args.repeat or 20
    steps = [
        ("decode", 64, 1, 128, 4096),
        ("MTP verify (q_len 2)", 64, 2, 128, 4096),
        ("ragged spec decode (1..4)", 64, "ragged", 128, 4096),
        ("TP8 decode (H 16)", 128, 1, 16, 8192),
    ]
    if args.shape:
        b, q, h, kv = (int(x) for x in args.shape.split(","))
        steps = [(f"custom B{b} q{q} H{h} kv{kv}", b, q, h, kv)]
    _prepare_launcher(get_launcher)  # builds on first use, then loads the verified cubin
    print(f"jit_mla on {torch.cuda.get_device_name()} ({env.device_arch()}); bf16, page 64: "
          f"{attention_kernel(64)}")
    print(f"{'step':28s} {'B':>4s} {'q_len':>6s} {'H':>4s} {'kv':>6s} {'µs/call':>9s} {'max |err|':>10s} {'rel err':>9s}")
    worst = 0.0
    for i, (name, batch, q_len, heads, kv_len) in enumerate(steps):
        if q_len == "ragged":
            g = torch.Generator().manual_seed(100 + i)
            q_lens = torch.randint(1, 5, (batch,), generator=g).tolist()
        else:
            q_lens = q_len
        q, kv, table, seq, cum, max_q = _make_step(batch, q_lens, heads, kv_len, 64, device, seed=i)
        total_q = q.shape[0] if cum is not None else batch * q.shape[1]
        ws = torch.empty(get_workspace_size(batch, heads, total_q=total_q), dtype=torch.uint8, device=device)

        def call():
            return trtllm_batch_decode_with_kv_cache_mla(
                q, kv, ws, 128, 512, 64, table, seq, kv_len, bmm1_scale=SM_SCALE,
                cum_seq_lens_q=cum, max_q_len=max_q if cum is not None else None)

        out = call()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            call()
        stop.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(stop) * 1e3 / repeat
        ref, _ = mla_reference(q, kv, table, seq, cum_seq_lens_q=cum, bmm1_scale=SM_SCALE)
        err = float((out.float() - ref).abs().max())
        rel = float((out.float() - ref).norm() / ref.norm())
        worst = max(worst, rel)
        label = "1..4" if q_len == "ragged" else str(q_len)
        print(f"{name:28s} {batch:4d} {label:>6s} {heads:4d} {kv_len:6d} {us:9.1f} {err:10.2e} {rel:9.2e}")
    ok = worst < 1e-2
    print("all steps match the float32 reference" if ok else "MISMATCH against the reference")
    return 0 if ok else 1


def _run_cpu() -> int:
    _prepare_launcher(build_launcher)
    q, kv, table, seq, cum, _ = _make_step(2, [1, 3], 16, 100, 32, "cpu", seed=0)
    out, lse = mla_reference(q, kv, table, seq, cum_seq_lens_q=cum, bmm1_scale=SM_SCALE)
    print(f"reference on CPU: ragged step (q_lens 1, 3; H 16; kv 100) -> out {list(out.shape)}, "
          f"lse {list(lse.shape)}, finite: {bool(torch.isfinite(out).all())}")
    print("the attention kernels need an sm_90a GPU (Hopper: H100/H200); none is visible here")
    return 0


def main(args: argparse.Namespace | None = None) -> int:
    args = args or argparse.Namespace(shape=None, dtype=None, repeat=None)
    if getattr(args, "dtype", None) not in (None, "bf16", "bfloat16"):
        raise SystemExit(f"--dtype: only bf16 is supported yet, got {args.dtype}")
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        return _run_gpu(args)
    return _run_cpu()
