"""FlashMLA's sm90 dense bf16 decode as a third column of bench_mla.py (benchmark only).

The library is FlashMLA's own kernels behind a small C entry point (`flashmla/glue.cu`), built
here by `bash benchmarks/flashmla/build.sh FLASHMLA_DIR` into `.flashmla/libflashmla_side.so`
(or named by JIT_MLA_FLASHMLA_LIB) and carried to the GPU machine. Without it the column reads
n/a. FlashMLA takes a bf16 cache with 64-token pages and one q_len for every request: fp8 rows
and the ragged spec-decode rows are n/a too (the prefill row, 4 requests of 2048 tokens, runs: its
[total_q, H, 576] query is the [B, q_len, H, 576] one FlashMLA reads).

Its schedule (get_decoding_sched_meta) runs once per shape outside the timed calls, as
FlashMLA's own benchmark and the engines do (once per decode step, shared by every layer); the
timed call is its split-KV kernel and its combine kernel.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LIB = REPO_ROOT / ".flashmla" / "libflashmla_side.so"
BLOCK_M = 64  # FlashMLA's query rows per CTA
D_QK, D_V, PAGE = 576, 512, 64


def load() -> tuple[Optional[ctypes.CDLL], str]:
    """(library, its FlashMLA commit) or (None, why not). Call after torch has initialized CUDA:
    the library links the CUDA runtime that torch loaded."""
    path = Path(os.environ.get("JIT_MLA_FLASHMLA_LIB", DEFAULT_LIB))
    if not path.is_file():
        return None, f"no FlashMLA library at {path} (bash benchmarks/flashmla/build.sh FLASHMLA_DIR)"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"cannot load {path}: {e}"
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.fm_sched_meta_bytes.restype = i32
    lib.fm_plan.restype = i32
    lib.fm_plan.argtypes = [i32, i32, vp, vp, vp, i32, vp]
    lib.fm_decode.restype = i32
    lib.fm_decode.argtypes = [vp, vp, i64, i32, vp, i64, vp, i32, i32, i32, ctypes.c_float, i32,
                              vp, vp, vp, vp, vp, vp, i32, vp]
    stamp = path.with_name("FLASHMLA_COMMIT")
    return lib, stamp.read_text().strip() if stamp.is_file() else "unknown"


def not_applicable(shape) -> Optional[str]:
    """Why FlashMLA's dense decode cannot run this row, or None."""
    if shape.kv_fp8:
        return "FlashMLA's dense sm90 decode takes a bf16 cache only"
    if len(set(shape.q_lens)) != 1:  # a ragged row with one q_len (the prefill) is a plain view
        return "FlashMLA takes one q_len for every request"
    return None


def num_sm_parts(sm_count: int, q_len: int, num_heads: int) -> int:
    """Its CTAs per 64-row query tile (one KV head): its interface's formula."""
    return max(sm_count // -(-(q_len * num_heads) // BLOCK_M), 1)


def calls(lib: ctypes.CDLL, shape, data: dict, sm_count: int, scale: float) -> tuple[list[Callable[[], object]], list]:
    """One schedule for the shape's lengths, then a call per page set (its own query and output);
    the split buffers are shared (the calls run one after another on one stream)."""
    import torch

    dev = data["seq_lens"].device
    B, s_q, H = shape.batch, shape.max_q_len, shape.num_heads
    rows = s_q * H
    parts = num_sm_parts(sm_count, s_q, H)
    meta_words = parts * lib.fm_sched_meta_bytes() // 4
    sched = torch.empty(meta_words, dtype=torch.int32, device=dev)                  # [parts, 8]
    splits = torch.empty(B + 1, dtype=torch.int32, device=dev)                      # [B + 1]
    lse = torch.empty((B, s_q, H), dtype=torch.float32, device=dev)
    lse_acc = torch.empty((B + parts, rows), dtype=torch.float32, device=dev)
    o_acc = torch.empty((B + parts, rows, D_V), dtype=torch.float32, device=dev)
    seq_lens, table = data["seq_lens"], data["block_tables"]                         # [B], [B, pages]
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    err = lib.fm_plan(B, s_q, seq_lens.data_ptr(), sched.data_ptr(), splits.data_ptr(), parts, stream())
    torch.cuda.synchronize()
    if err:
        raise RuntimeError(f"FlashMLA's scheduler failed: CUDA error {err}")
    outs = []

    def make(i: int) -> Callable[[], object]:
        q = data["queries"][i]                             # [B, s_q, H, 576] (or [B * s_q, H, 576])
        kv = data["slabs"][i]                                                         # [pages, 64, 576]
        assert q.is_contiguous() and kv.stride(1) == D_QK and kv.shape[1] == PAGE
        out = torch.empty((B, s_q, H, D_V), dtype=torch.bfloat16, device=dev)
        outs.append(out)

        def call():
            e = lib.fm_decode(q.data_ptr(), kv.data_ptr(), kv.stride(0), kv.shape[0], table.data_ptr(),
                              table.stride(0), seq_lens.data_ptr(), B, s_q, H, scale, int(s_q > 1),
                              out.data_ptr(), lse.data_ptr(), lse_acc.data_ptr(), o_acc.data_ptr(),
                              sched.data_ptr(), splits.data_ptr(), parts, stream())
            if e:
                raise RuntimeError(f"FlashMLA's decode failed: CUDA error {e}")
            return out

        return call

    return [make(i) for i in range(len(data["slabs"]))], outs  # the closures hold the buffers
