"""The failure surface of the launcher and of the public API: every wrong argument gets the right
exception kind and a message naming the argument, what was expected and what came.

CPU only. The launcher validates dtypes and shapes first, then devices, then the arch, so a call
with CPU tensors reaches every dtype/shape check; a call that passes all of them stops at the
device check with ``ValueError: query must be a CUDA tensor``: that error is the "everything else
passed" signal of this file.

The device checks themselves (and the workspace-size check, which comes after them) are reached
with "fake CUDA" tensors: CPU tensors whose DLPack device field says cuda:N. The launcher only
reads their metadata before it asks for the loaded kernels, and a launcher built without
``get_launcher()`` has none, so such a call ends in ``RuntimeError: no kernels loaded`` without
touching a device. Those tests are skipped when kernels are loaded in this process (a GPU run
where ``get_launcher()`` came first): the call would then go on to launch on host pointers.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any, Callable, NamedTuple

import pytest
import torch
import tvm_ffi

import jit_mla
from jit_mla import api
from jit_mla.launcher import build_launcher
from mla_data import D_QK, D_V

# A small MTP-like call: B requests of Q_LEN query tokens, H heads, pages of PAGE tokens.
B, Q_LEN, H = 3, 2, 16
PAGES, PAGE, MAX_PAGES = 8, 64, 4
SM = 132  # any positive count: it only sizes the workspace
RAGGED_CUM = [0, 2, 2, 5]  # request 1 has no query tokens (legal)
TOTAL_Q = RAGGED_CUM[-1]

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32

# Argument order of csrc/launcher.cu's trtllm_paged_attention_decode.
ARG_NAMES = (
    "out", "out_scale_factor", "query", "key_cache", "value_cache", "workspace_buffer",
    "block_tables", "seq_lens", "max_q_len", "max_kv_len", "bmm1_scale", "bmm2_scale",
    "o_sf_scale", "o_sf_vec_size", "o_sf_start_index", "batch_size", "window_left",
    "sparse_mla_top_k", "sm_count", "enable_pdl", "workspace_size", "attention_sinks",
    "cum_seq_lens_q", "key_block_scales", "value_block_scales",
    "skip_softmax_threshold_scale_factor", "uses_shared_paged_kv_idx", "lse",
)  # fmt: skip
ARG_INDEX = {name: i for i, name in enumerate(ARG_NAMES)}

NOT_CUDA = ("query must be a CUDA tensor", "got device type 1 (CPU)")  # the "all else passed" signal
NO_KERNELS = ("no kernels loaded",)  # the same signal for fake-CUDA calls


@pytest.fixture(scope="module")
def launcher():
    return build_launcher()


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _ws_size(batch: int, total_q: int) -> int:
    return int(build_launcher().workspace_size(batch, total_q, H, SM))


@functools.lru_cache(maxsize=None)
def _data(ragged: bool) -> dict[str, torch.Tensor]:
    """Seeded random tensors, made once (each call's arguments are fresh clones of them)."""
    g = torch.Generator().manual_seed(0)
    lead = (TOTAL_Q,) if ragged else (B, Q_LEN)
    return {
        "query": torch.randn(lead + (H, D_QK), generator=g).to(BF16),  # query: [..., H, 576] bf16
        "kv": torch.randn(PAGES, PAGE, D_QK, generator=g).to(BF16),  # kv: [pages, page, 576] bf16
        "block_tables": torch.randint(0, PAGES, (B, MAX_PAGES), generator=g, dtype=I32),
        "sinks": torch.randn(H, generator=g),
    }


def baseline(ragged: bool = False) -> dict[str, Any]:
    """A valid argument set (CPU tensors): uniform [B, Q_LEN, H, 576] or ragged [TOTAL_Q, H, 576]."""
    data = {k: v.clone() for k, v in _data(ragged).items()}
    lead = (TOTAL_Q,) if ragged else (B, Q_LEN)
    total_q = TOTAL_Q if ragged else B * Q_LEN
    kv = data["kv"]
    ws = _ws_size(B, total_q)
    return {
        "out": torch.full(lead + (H, D_V), float("nan"), dtype=BF16),  # out: [..., H, 512] bf16
        "out_scale_factor": None,
        "query": data["query"],
        "key_cache": kv,
        "value_cache": kv,  # MLA's one-copy latent cache
        "workspace_buffer": torch.zeros(ws, dtype=torch.uint8),
        "block_tables": data["block_tables"],  # block_tables: [B, max_pages] int32
        "seq_lens": torch.tensor([70, 2, 200], dtype=I32),  # seq_lens: [B] int32
        "max_q_len": 3 if ragged else Q_LEN,
        "max_kv_len": 200,
        "bmm1_scale": 0.0721,
        "bmm2_scale": 1.0,
        "o_sf_scale": -1.0,
        "o_sf_vec_size": -1,
        "o_sf_start_index": 0,
        "batch_size": B,
        "window_left": -1,
        "sparse_mla_top_k": 0,
        "sm_count": SM,
        "enable_pdl": True,
        "workspace_size": ws,
        "attention_sinks": data["sinks"],  # sinks: [H] f32
        "cum_seq_lens_q": torch.tensor(RAGGED_CUM, dtype=I32) if ragged else None,  # [B+1] i32
        "key_block_scales": None,
        "value_block_scales": None,
        "skip_softmax_threshold_scale_factor": None,
        "uses_shared_paged_kv_idx": True,
        "lse": torch.full(lead + (H,), float("nan"), dtype=F32),  # lse: [..., H] f32
    }


def call(launcher, args: dict[str, Any]) -> None:
    launcher.trtllm_paged_attention_decode(*(args[n] for n in ARG_NAMES))


def check_raises(fn: Callable[[], Any], exc: type, fragments: tuple[str, ...]) -> None:
    """fn raises exactly `exc`, and its message holds every fragment (argument, expected, actual)."""
    with pytest.raises(Exception) as info:
        fn()
    msg = str(info.value)
    assert info.type is exc, f"expected {exc.__name__}, got {info.type.__name__}: {msg}"
    for frag in fragments:
        assert frag in msg, f"message should contain {frag!r}, got: {msg}"


def kv(t: torch.Tensor) -> dict[str, Any]:
    """A kv cache passed as both key_cache and value_cache (what the API does)."""
    return {"key_cache": t, "value_cache": t}


def noncontig(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` whose first two dims are swapped in memory (not contiguous)."""
    t = torch.zeros((shape[1], shape[0]) + tuple(shape[2:]), dtype=dtype).transpose(0, 1)
    assert t.shape == shape and not t.is_contiguous()
    return t


def kv_strided(shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> torch.Tensor:
    """A kv view with given element strides into a pool big enough for it."""
    span = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    return torch.zeros(span, dtype=BF16).as_strided(shape, strides, offset)


def shifted(t: torch.Tensor, elems: int) -> torch.Tensor:
    """A contiguous copy of `t`'s shape whose data starts `elems` elements into its storage."""
    return torch.zeros(t.numel() + elems, dtype=t.dtype)[elems:].view(t.shape)


# --------------------------------------------------------------------------------------------
# Launcher: one wrong argument per case
# --------------------------------------------------------------------------------------------


class Case(NamedTuple):
    id: str
    change: Callable[[dict[str, Any]], dict[str, Any]]  # baseline args -> the arguments to replace
    exc: type
    fragments: tuple[str, ...]
    ragged: bool = False


def _tvm_mismatch(name: str, expected: str, got: str = "None") -> tuple[str, ...]:
    # tvm-ffi rejects the Python value before our code runs; it names the position, not the name.
    return (f"argument #{ARG_INDEX[name]}", f"Expected `{expected}` but got `{got}`")


U = f"[{B}, {Q_LEN}, {H}"  # the uniform leading shape, as printed

# csrc/launcher.cu's kMaxKvTokens: the widest block table, in tokens. Tables that wide are views of
# one row (stride 0 across rows) and pages of WIDE_PAGE tokens, so the test allocates little.
MAX_KV_TOKENS = (1 << 31) - (1 << 16)
WIDE_PAGE = 4096


def wide_table(width: int) -> torch.Tensor:
    """int32 [B, width] block table, every row the same zeros."""
    return torch.zeros(1, width, dtype=I32).expand(B, width)

CASES = [
    # ---- features not supported yet: refused, never ignored --------------------------------
    Case("out_scale_factor-given", lambda a: {"out_scale_factor": torch.zeros(8, dtype=torch.uint8)},
         NotImplementedError, ("out_scale_factor", "not supported")),
    Case("sparse_mla_top_k", lambda a: {"sparse_mla_top_k": 2048},
         NotImplementedError, ("sparse_mla_top_k", "got 2048")),
    Case("window_left", lambda a: {"window_left": 128},
         NotImplementedError, ("window_left", "got 128")),
    Case("key_block_scales", lambda a: {"key_block_scales": torch.ones(PAGES, dtype=F32)},
         NotImplementedError, ("key_block_scales",)),
    Case("value_block_scales", lambda a: {"value_block_scales": torch.ones(PAGES, dtype=F32)},
         NotImplementedError, ("value_block_scales",)),
    Case("skip_softmax", lambda a: {"skip_softmax_threshold_scale_factor": 0.5},
         NotImplementedError, ("skip_softmax_threshold_scale_factor",)),
    Case("uses_shared_paged_kv_idx-false", lambda a: {"uses_shared_paged_kv_idx": False},
         NotImplementedError, ("uses_shared_paged_kv_idx=False",)),
    Case("kv_cache-fp8-row-stride-8", lambda a: kv(torch.zeros(PAGES * PAGE * (D_QK + 8), dtype=torch.float8_e4m3fn)
                                                  .as_strided((PAGES, PAGE, D_QK), (PAGE * (D_QK + 8), D_QK + 8, 1))),
         ValueError, ("multiples of 16 elements", f"got row stride {D_QK + 8}")),
    # ---- dtypes --------------------------------------------------------------------------------
    Case("query-float32", lambda a: {"query": a["query"].float()},
         TypeError, ("query must be bfloat16", f"got float32 {U}, {D_QK}]")),
    Case("query-fp8-bf16-cache", lambda a: {"query": a["query"].to(torch.float8_e4m3fn)},
         TypeError, ("query in float8_e4m3fn needs a float8_e4m3fn kv_cache", "got kv_cache bfloat16")),
    Case("query-float16", lambda a: {"query": a["query"].half()},
         TypeError, ("query must be bfloat16", "got float16")),
    Case("kv_cache-float16", lambda a: kv(a["key_cache"].half()),
         TypeError, ("kv_cache must be bfloat16", f"got float16 [{PAGES}, {PAGE}, {D_QK}]")),
    Case("out-float32", lambda a: {"out": a["out"].float()},
         TypeError, ("out must be bfloat16", f"got float32 {U}, {D_V}]")),
    Case("block_tables-int64", lambda a: {"block_tables": a["block_tables"].long()},
         TypeError, ("block_tables must be int32", f"got int64 [{B}, {MAX_PAGES}]")),
    Case("seq_lens-int64", lambda a: {"seq_lens": a["seq_lens"].long()},
         TypeError, ("seq_lens must be int32", f"got int64 [{B}]")),
    Case("cum_seq_lens_q-int64", lambda a: {"cum_seq_lens_q": a["cum_seq_lens_q"].long()},
         TypeError, ("cum_seq_lens_q must be int32", f"got int64 [{B + 1}]"), ragged=True),
    Case("sinks-bfloat16", lambda a: {"attention_sinks": a["attention_sinks"].to(BF16)},
         TypeError, ("sinks must be float32", f"got bfloat16 [{H}]")),
    Case("lse-bfloat16", lambda a: {"lse": a["lse"].to(BF16)},
         TypeError, ("lse must be float32", f"got bfloat16 {U}]")),
    # ---- scales: a float or a one-element float32 (CUDA) tensor ----------------------------
    Case("bmm1_scale-None", lambda a: {"bmm1_scale": None},
         TypeError, ("bmm1_scale must be a float or a one-element float32 CUDA tensor", "got None")),
    Case("bmm2_scale-None", lambda a: {"bmm2_scale": None},
         TypeError, ("bmm2_scale must be a float or a one-element float32 CUDA tensor", "got None")),
    Case("bmm1_scale-float64", lambda a: {"bmm1_scale": torch.ones(1, dtype=torch.float64)},
         TypeError, ("bmm1_scale tensor must be float32", "got float64")),
    Case("bmm2_scale-bfloat16", lambda a: {"bmm2_scale": torch.ones(1, dtype=BF16)},
         TypeError, ("bmm2_scale tensor must be float32", "got bfloat16")),
    Case("bmm1_scale-2-elements", lambda a: {"bmm1_scale": torch.ones(2, dtype=F32)},
         ValueError, ("bmm1_scale tensor must have exactly one element", "got 2")),
    Case("bmm2_scale-empty", lambda a: {"bmm2_scale": torch.ones(0, dtype=F32)},
         ValueError, ("bmm2_scale tensor must have exactly one element", "got 0")),
    Case("bmm1_scale-str", lambda a: {"bmm1_scale": "0.5"},
         TypeError, _tvm_mismatch("bmm1_scale", "Variant<float, ffi.Tensor>", "ffi.SmallStr")),
    # ---- None where a Tensor is required: tvm-ffi's TypeError, before our code ---------------
    *[
        Case(f"{name}-None", lambda a, name=name: {name: None},
             TypeError, _tvm_mismatch(name, "DLTensor*"))
        for name in ("out", "query", "key_cache", "value_cache", "workspace_buffer",
                     "block_tables", "seq_lens")
    ],
    Case("sinks-list", lambda a: {"attention_sinks": [a["attention_sinks"]]},
         TypeError, _tvm_mismatch("attention_sinks", "Optional<DLTensor*>", "ffi.Array")),
    # ---- batch, block tables, seq_lens -------------------------------------------------------
    Case("batch_size-negative", lambda a: {"batch_size": -1},
         ValueError, ("batch_size must be >= 0", "got -1")),
    Case("block_tables-1d", lambda a: {"block_tables": a["block_tables"][:, 0].contiguous()},
         ValueError, ("block_tables must be int32 [batch_size, max_pages]", f"= [{B}, ...]",
                      f"got int32 [{B}]")),
    Case("block_tables-3d", lambda a: {"block_tables": a["block_tables"][:, None].repeat(1, 2, 1)},
         ValueError, ("block_tables must be int32 [batch_size, max_pages]",
                      f"got int32 [{B}, 2, {MAX_PAGES}]")),
    Case("block_tables-rows", lambda a: {"block_tables": torch.zeros(B + 1, MAX_PAGES, dtype=I32)},
         ValueError, (f"block_tables must have batch_size = {B} rows", f"got int32 [{B + 1}, {MAX_PAGES}]")),
    Case("block_tables-row-stride", lambda a: {"block_tables": noncontig((B, MAX_PAGES), I32)},
         ValueError, ("block_tables rows must be contiguous (stride(1) == 1)", f"got stride {B}")),
    Case("block_tables-too-wide", lambda a: {**kv(torch.zeros(1, WIDE_PAGE, D_QK, dtype=BF16)),
                                             "block_tables": wide_table(MAX_KV_TOKENS // WIDE_PAGE + 1)},
         ValueError, (f"block_tables.size(1) * page_size must be <= {MAX_KV_TOKENS} tokens",
                      f"got {MAX_KV_TOKENS // WIDE_PAGE + 1} * {WIDE_PAGE}")),
    Case("seq_lens-length", lambda a: {"seq_lens": a["seq_lens"][:2].clone()},
         ValueError, (f"seq_lens must have shape [{B}]", "got int32 [2]")),
    Case("seq_lens-2d", lambda a: {"seq_lens": a["seq_lens"][:, None].clone()},
         ValueError, (f"seq_lens must have shape [{B}]", f"got int32 [{B}, 1]")),
    Case("seq_lens-0d", lambda a: {"seq_lens": torch.tensor(1, dtype=I32)},
         ValueError, (f"seq_lens must have shape [{B}]", "got int32 []")),
    Case("seq_lens-noncontiguous", lambda a: {"seq_lens": torch.zeros(B, 2, dtype=I32)[:, 0]},
         ValueError, ("seq_lens must be contiguous", f"got int32 [{B}]")),
    # ---- query --------------------------------------------------------------------------------
    Case("query-2d", lambda a: {"query": a["query"].reshape(-1, D_QK)},
         ValueError, ("query must be [B, q_len, H, 576] or [total_q, H, 576]",
                      f"got bfloat16 [{B * Q_LEN * H}, {D_QK}]")),
    Case("query-5d", lambda a: {"query": a["query"][None]},
         ValueError, ("query must be [B, q_len, H, 576] or [total_q, H, 576]",
                      f"got bfloat16 [1, {B}, {Q_LEN}, {H}, {D_QK}]")),
    Case("query-last-dim", lambda a: {"query": a["query"][..., :D_V].contiguous()},
         ValueError, ("query's last dim must be 576", f"got bfloat16 {U}, {D_V}]")),
    Case("query-noncontiguous", lambda a: {"query": noncontig((B, Q_LEN, H, D_QK), BF16)},
         ValueError, ("query must be contiguous", f"got bfloat16 {U}, {D_QK}]")),
    Case("query-no-heads", lambda a: {"query": torch.zeros(B, Q_LEN, 0, D_QK, dtype=BF16)},
         ValueError, ("query must have at least one head", f"got bfloat16 [{B}, {Q_LEN}, 0, {D_QK}]")),
    Case("query-batch", lambda a: {"query": torch.zeros(B + 1, Q_LEN, H, D_QK, dtype=BF16)},
         ValueError, (f"must have B = batch_size = {B}", f"got bfloat16 [{B + 1}, {Q_LEN}, {H}, {D_QK}]")),
    Case("query-3d-not-divisible", lambda a: {"query": torch.zeros(7, H, D_QK, dtype=BF16)},
         ValueError, (f"without cum_seq_lens_q needs total_q divisible by batch_size = {B}",
                      f"got bfloat16 [7, {H}, {D_QK}]")),
    Case("query-3d-batch-0",
         lambda a: {"query": a["query"].reshape(-1, H, D_QK), "batch_size": 0,
                    "block_tables": torch.zeros(0, MAX_PAGES, dtype=I32),
                    "seq_lens": torch.zeros(0, dtype=I32)},
         ValueError, ("divisible by batch_size = 0", f"got bfloat16 [{B * Q_LEN}, {H}, {D_QK}]")),
    Case("max_q_len-negative", lambda a: {"max_q_len": -1},
         ValueError, ("max_q_len must be >= 0", "got -1")),
    # ---- cum_seq_lens_q (ragged layout) ----------------------------------------------------
    Case("cum_seq_lens_q-with-4d-query", lambda a: {"cum_seq_lens_q": torch.tensor(RAGGED_CUM, dtype=I32)},
         ValueError, ("cum_seq_lens_q needs the ragged query layout [total_q, H, 576]",
                      f"got query bfloat16 {U}, {D_QK}]")),
    Case("cum_seq_lens_q-short", lambda a: {"cum_seq_lens_q": a["cum_seq_lens_q"][:B].clone()},
         ValueError, (f"cum_seq_lens_q must have shape [{B + 1}]", f"got int32 [{B}]"), ragged=True),
    Case("cum_seq_lens_q-long", lambda a: {"cum_seq_lens_q": torch.tensor(RAGGED_CUM + [5], dtype=I32)},
         ValueError, (f"cum_seq_lens_q must have shape [{B + 1}]", f"got int32 [{B + 2}]"), ragged=True),
    Case("cum_seq_lens_q-2d", lambda a: {"cum_seq_lens_q": a["cum_seq_lens_q"][:, None].clone()},
         ValueError, (f"cum_seq_lens_q must have shape [{B + 1}]", f"got int32 [{B + 1}, 1]"), ragged=True),
    Case("cum_seq_lens_q-noncontiguous", lambda a: {"cum_seq_lens_q": torch.zeros(B + 1, 2, dtype=I32)[:, 0]},
         ValueError, ("cum_seq_lens_q must be contiguous", f"got int32 [{B + 1}]"), ragged=True),
    # ---- out, lse, sinks --------------------------------------------------------------------
    Case("out-last-dim", lambda a: {"out": torch.zeros(B, Q_LEN, H, D_QK, dtype=BF16)},
         ValueError, (f"out must have shape {U}, {D_V}]", f"got bfloat16 {U}, {D_QK}]")),
    Case("out-heads", lambda a: {"out": torch.zeros(B, Q_LEN, H + 1, D_V, dtype=BF16)},
         ValueError, (f"out must have shape {U}, {D_V}]", f"got bfloat16 [{B}, {Q_LEN}, {H + 1}, {D_V}]")),
    Case("out-ragged-rank", lambda a: {"out": torch.zeros(1, TOTAL_Q, H, D_V, dtype=BF16)},
         ValueError, (f"out must have shape [{TOTAL_Q}, {H}, {D_V}]", f"got bfloat16 [1, {TOTAL_Q}, {H}, {D_V}]"),
         ragged=True),
    Case("out-noncontiguous", lambda a: {"out": noncontig((B, Q_LEN, H, D_V), BF16)},
         ValueError, ("out must be contiguous", f"got bfloat16 {U}, {D_V}]")),
    Case("lse-shape", lambda a: {"lse": a["lse"][..., None].clone()},
         ValueError, (f"lse must have shape {U}]", f"got float32 {U}, 1]")),
    Case("lse-ragged-shape", lambda a: {"lse": torch.zeros(TOTAL_Q, H + 1, dtype=F32)},
         ValueError, (f"lse must have shape [{TOTAL_Q}, {H}]", f"got float32 [{TOTAL_Q}, {H + 1}]"),
         ragged=True),
    Case("lse-noncontiguous", lambda a: {"lse": noncontig((B, Q_LEN, H), F32)},
         ValueError, ("lse must be contiguous", f"got float32 {U}]")),
    Case("sinks-length", lambda a: {"attention_sinks": torch.zeros(H + 1, dtype=F32)},
         ValueError, (f"sinks must have shape [{H}]", f"got float32 [{H + 1}]")),
    Case("sinks-2d", lambda a: {"attention_sinks": torch.zeros(1, H, dtype=F32)},
         ValueError, (f"sinks must have shape [{H}]", f"got float32 [1, {H}]")),
    Case("sinks-noncontiguous", lambda a: {"attention_sinks": torch.zeros(H, 2, dtype=F32)[:, 0]},
         ValueError, ("sinks must be contiguous", f"got float32 [{H}]")),
    # ---- kv cache -------------------------------------------------------------------------------
    Case("kv_cache-2d", lambda a: kv(a["key_cache"].reshape(-1, D_QK)),
         ValueError, ("kv_cache must be [num_pages, page_size, 576] or [num_pages, 1, page_size, 576]",
                      f"got bfloat16 [{PAGES * PAGE}, {D_QK}]")),
    Case("kv_cache-4d-dim1", lambda a: kv(a["key_cache"].reshape(PAGES // 2, 2, PAGE, D_QK)),
         ValueError, ("kv_cache must be [num_pages, page_size, 576] or [num_pages, 1, page_size, 576]",
                      f"got bfloat16 [{PAGES // 2}, 2, {PAGE}, {D_QK}]")),
    Case("kv_cache-last-dim", lambda a: kv(a["key_cache"][..., :D_V].contiguous()),
         ValueError, ("kv_cache's last dim must be 576", f"got bfloat16 [{PAGES}, {PAGE}, {D_V}]")),
    Case("kv_cache-last-stride", lambda a: kv(kv_strided((PAGES, PAGE, D_QK), (PAGE * D_QK * 2, D_QK * 2, 2))),
         ValueError, ("kv_cache's last dim must be contiguous (stride 1)", "got stride 2")),
    Case("kv_cache-row-stride", lambda a: kv(kv_strided((PAGES, PAGE, D_QK), (PAGE * 580, 580, 1))),
         ValueError, ("row stride and page stride must be multiples of 8",
                      f"got row stride 580, page stride {PAGE * 580}")),
    Case("kv_cache-page-stride", lambda a: kv(kv_strided((PAGES, PAGE, D_QK), (PAGE * D_QK + 4, D_QK, 1))),
         ValueError, ("row stride and page stride must be multiples of 8",
                      f"got row stride {D_QK}, page stride {PAGE * D_QK + 4}")),
    Case("kv_cache-rows-overlap", lambda a: kv(kv_strided((PAGES, PAGE, D_QK), (PAGE * 8, 8, 1))),
         ValueError, ("row stride >= 576", "got row stride 8")),
    Case("kv_cache-misaligned", lambda a: kv(kv_strided((PAGES, PAGE, D_QK), (PAGE * D_QK, D_QK, 1), offset=4)),
         ValueError, ("kv_cache's data pointer must be 16-byte aligned",)),
    # Contiguous views that start off the kernels' load and store (16 B) boundaries.
    Case("query-misaligned", lambda a: {"query": shifted(a["query"], 4)},
         ValueError, ("query's data pointer must be 16-byte aligned", "(offset 8 bytes)")),
    Case("out-misaligned", lambda a: {"out": shifted(a["out"], 2)},
         ValueError, ("out's data pointer must be 16-byte aligned", "(offset 4 bytes)")),
    # 8 bytes off: the merge of split rows stores 16 bytes per lane (an 8-byte check let it fault).
    Case("out-misaligned-8", lambda a: {"out": shifted(a["out"], 4)},
         ValueError, ("out's data pointer must be 16-byte aligned", "(offset 8 bytes)")),
    Case("value_cache-copy", lambda a: {"value_cache": a["key_cache"].clone()},
         ValueError, ("value_cache must be the same tensor as key_cache",
                      f"got bfloat16 [{PAGES}, {PAGE}, {D_QK}] vs bfloat16 [{PAGES}, {PAGE}, {D_QK}]")),
    Case("value_cache-4d-view", lambda a: {"value_cache": a["key_cache"][:, None]},
         ValueError, ("value_cache must be the same tensor as key_cache",
                      f"got bfloat16 [{PAGES}, 1, {PAGE}, {D_QK}] vs bfloat16 [{PAGES}, {PAGE}, {D_QK}]")),
    Case("value_cache-v-slice", lambda a: {"value_cache": a["key_cache"][..., :D_V]},
         ValueError, ("value_cache must be the same tensor as key_cache",
                      f"got bfloat16 [{PAGES}, {PAGE}, {D_V}]")),
    # ---- workspace -----------------------------------------------------------------------------
    Case("workspace_size-over-buffer", lambda a: {"workspace_size": a["workspace_size"] + 1},
         ValueError, ("workspace_size = ", "exceeds workspace_buffer's")),
    Case("workspace-noncontiguous",
         lambda a: {"workspace_buffer": torch.zeros(a["workspace_size"], 2, dtype=torch.uint8)[:, 0]},
         ValueError, ("workspace_buffer must be contiguous",)),
]  # fmt: skip


def _args_for(case: Case) -> dict[str, Any]:
    args = baseline(case.ragged)
    args.update(case.change(args))
    return args


def test_cases_are_many_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_wrong_argument(launcher, case):
    args = _args_for(case)
    check_raises(lambda: call(launcher, args), case.exc, case.fragments)


def test_workspace_size_over_buffer_names_both_sizes(launcher):
    args = baseline()
    ws = args["workspace_size"]
    args["workspace_size"] = ws + 1
    check_raises(lambda: call(launcher, args), ValueError,
                 (f"workspace_size = {ws + 1} bytes exceeds workspace_buffer's {ws} bytes",))


# ---- calls that pass every dtype/shape check: they stop at the device check ------------------


def _valid_variants() -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    def with_(ragged=False, **change):
        def make():
            a = baseline(ragged)
            a.update({k: (v(a) if callable(v) else v) for k, v in change.items()})
            return a
        return make

    pool = lambda: kv_strided((PAGES, PAGE, D_QK), (PAGE * 640, 640, 1))  # noqa: E731
    return [
        ("uniform", with_()),
        ("ragged", with_(ragged=True)),
        ("ragged-max_q_len-0", with_(ragged=True, max_q_len=0)),  # a host hint, never checked
        ("no-lse-no-sinks", with_(lse=None, attention_sinks=None)),
        ("uniform-as-3d", with_(query=lambda a: a["query"].reshape(-1, H, D_QK),
                                out=lambda a: a["out"].reshape(-1, H, D_V),
                                lse=lambda a: a["lse"].reshape(-1, H))),
        ("kv-4d", with_(key_cache=lambda a: a["key_cache"][:, None], value_cache=lambda a: a["key_cache"][:, None])),
        ("kv-pool-view", with_(**kv(pool()))),
        ("kv-page-size-1", with_(**kv(torch.zeros(PAGES * PAGE, 1, D_QK, dtype=BF16)))),
        # fp8 takes every query layout (the narrow kernels; beyond 32 rows with TMA pages the wide
        # kernels, else 32-row units)
        ("kv-fp8-ragged", with_(ragged=True, **kv(torch.zeros(PAGES, PAGE, D_QK).to(torch.float8_e4m3fn)))),
        ("kv-fp8-query-fp8", with_(query=lambda a: a["query"].to(torch.float8_e4m3fn),
                                   **kv(torch.zeros(PAGES, PAGE, D_QK).to(torch.float8_e4m3fn)))),
        # CPU scale tensors pass parse_scale; their device check comes after the query's.
        ("scales-cpu-tensors", with_(bmm1_scale=torch.full((1,), 0.07), bmm2_scale=torch.ones(1))),
        ("scale-0d-tensor", with_(bmm1_scale=torch.tensor(0.07))),
        ("scale-int", with_(bmm1_scale=1)),
        ("workspace-float32", with_(workspace_buffer=lambda a: torch.zeros(a["workspace_size"] // 4 + 1))),
        ("workspace_size-smaller", with_(workspace_size=0)),  # too small: only known after devices
        ("batch-0", with_(batch_size=0, query=torch.zeros(0, Q_LEN, H, D_QK, dtype=BF16),
                          out=torch.zeros(0, Q_LEN, H, D_V, dtype=BF16), lse=torch.zeros(0, Q_LEN, H),
                          block_tables=torch.zeros(0, MAX_PAGES, dtype=I32), seq_lens=torch.zeros(0, dtype=I32))),
        ("block_tables-widest", with_(**kv(torch.zeros(1, WIDE_PAGE, D_QK, dtype=BF16)),
                                      block_tables=wide_table(MAX_KV_TOKENS // WIDE_PAGE))),
        ("block_tables-no-column", with_(block_tables=torch.zeros(B, 0, dtype=I32))),
        ("block_tables-row-view", with_(block_tables=lambda a: torch.zeros(B, 2 * MAX_PAGES, dtype=I32)[:, :MAX_PAGES])),
        ("enable_pdl-false-sm_count-0", with_(enable_pdl=False, sm_count=0)),
        ("o_sf-ignored", with_(o_sf_scale=2.0, o_sf_vec_size=16, o_sf_start_index=3)),
    ]  # fmt: skip


VALID = _valid_variants()


@pytest.mark.parametrize("make", [m for _, m in VALID], ids=[i for i, _ in VALID])
def test_valid_call_reaches_device_check(launcher, make):
    check_raises(lambda: call(launcher, make()), ValueError, NOT_CUDA)


# ---- the process goes on after a failure ------------------------------------------------------


def test_failures_leave_launcher_usable(launcher):
    good = baseline()
    for _ in range(3):
        for case in CASES:
            check_raises(lambda: call(launcher, _args_for(case)), case.exc, case.fragments)
            check_raises(lambda: call(launcher, good), ValueError, NOT_CUDA)
    assert launcher.workspace_size(B, B * Q_LEN, H, SM) == good["workspace_size"]


def test_many_failing_calls_release_their_tensors(launcher):
    """A call that throws after its tensors were converted must release them (no reference kept)."""
    args = baseline()
    query = args["query"]
    if not hasattr(query, "_use_count"):
        pytest.skip("this torch has no Tensor._use_count()")
    args["out"] = args["out"].float()  # fails after query and out were converted
    refs = query._use_count()
    good = {**args, "out": baseline()["out"]}
    for _ in range(200):
        with pytest.raises(TypeError):
            call(launcher, args)
        with pytest.raises(ValueError):
            call(launcher, good)  # the device check, at the very end
    assert query._use_count() == refs


# --------------------------------------------------------------------------------------------
# Device checks, reached with "fake CUDA" tensors (metadata only; see the module docstring)
# --------------------------------------------------------------------------------------------

_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_KDLCUDA = 2
# DLManagedTensor starts with DLTensor {void* data; DLDevice {int32 type; int32 id}; ...}.
_DEVICE_OFFSET = struct.calcsize("P")


def fake_cuda(t: torch.Tensor, device_id: int = 0) -> tvm_ffi.Tensor:
    """`t`'s memory and layout, labelled as living on cuda:device_id."""
    capsule = t.__dlpack__()  # legacy (unversioned) capsule: a DLManagedTensor
    ptr = _capsule_pointer(capsule, b"dltensor")
    ctypes.c_int32.from_address(ptr + _DEVICE_OFFSET).value = _KDLCUDA
    ctypes.c_int32.from_address(ptr + _DEVICE_OFFSET + 4).value = device_id
    return tvm_ffi.from_dlpack(capsule)


def fake_baseline(ragged: bool = False) -> dict[str, Any]:
    a = baseline(ragged)
    kv_t = fake_cuda(a["key_cache"])
    for name, v in a.items():
        if isinstance(v, torch.Tensor):
            a[name] = fake_cuda(v)
    a["key_cache"] = a["value_cache"] = kv_t
    return a


@pytest.fixture
def no_kernels(launcher):
    if launcher.cubin_loaded():
        pytest.skip("kernels are loaded in this process: a fake-CUDA call would launch on host memory")
    return launcher


def test_fake_cuda_tensor_is_seen_as_cuda(no_kernels):
    t = fake_cuda(torch.zeros(4, dtype=F32), 1)
    assert str(t.device) == "cuda:1"


@pytest.mark.parametrize("ragged", [False, True], ids=["uniform", "ragged"])
def test_fake_cuda_valid_call_passes_every_check(no_kernels, ragged):
    check_raises(lambda: call(no_kernels, fake_baseline(ragged)), RuntimeError, NO_KERNELS)


@pytest.mark.parametrize("ragged", [False, True], ids=["uniform", "ragged"])
@pytest.mark.parametrize("page", [PAGE, 24, 1])
def test_fake_cuda_fp8_cache_passes_every_check(no_kernels, page, ragged):
    # An fp8 cache, uniform or ragged: the narrow fp8 kernels, by TMA (page 64) or by cp.async (24, 1).
    args = fake_baseline(ragged)
    pool, width = PAGES * PAGE // page, MAX_PAGES * PAGE // page
    args["block_tables"] = fake_cuda(torch.arange(B * width, dtype=torch.int32).view(B, width) % pool)
    kv_t = fake_cuda(torch.zeros(pool, page, D_QK).to(torch.float8_e4m3fn))
    args["key_cache"] = args["value_cache"] = kv_t
    check_raises(lambda: call(no_kernels, args), RuntimeError, NO_KERNELS)


DEVICE_TENSORS = ("key_cache", "out", "workspace_buffer", "block_tables", "seq_lens",
                  "cum_seq_lens_q", "attention_sinks", "lse")  # fmt: skip
_SHOWN = {"key_cache": "kv_cache", "attention_sinks": "sinks"}


@pytest.mark.parametrize("name", DEVICE_TENSORS)
def test_fake_cuda_tensor_on_cpu(no_kernels, name):
    args = fake_baseline(ragged=True)
    cpu = baseline(ragged=True)[name]
    args[name] = cpu
    if name == "key_cache":
        args["value_cache"] = cpu
    shown = _SHOWN.get(name, name)
    check_raises(lambda: call(no_kernels, args), ValueError,
                 (f"{shown} must be a CUDA tensor", "got device type 1 (CPU)"))


@pytest.mark.parametrize("name", DEVICE_TENSORS)
def test_fake_cuda_tensor_on_other_gpu(no_kernels, name):
    args = fake_baseline(ragged=True)
    other = fake_cuda(baseline(ragged=True)[name], 1)
    args[name] = other
    if name == "key_cache":
        args["value_cache"] = other
    shown = _SHOWN.get(name, name)
    check_raises(lambda: call(no_kernels, args), ValueError,
                 (f"{shown} must be on cuda:0 (the query's device)", "got cuda:1"))


@pytest.mark.parametrize("scale", ["bmm1_scale", "bmm2_scale"])
def test_fake_cuda_scale_tensor_device(no_kernels, scale):
    args = fake_baseline()
    args[scale] = torch.ones(1, dtype=F32)  # a CPU tensor: the kernel could not read it
    check_raises(lambda: call(no_kernels, args), ValueError, (f"{scale} tensor must be on cuda:0", "got CPU"))
    args[scale] = fake_cuda(torch.ones(1, dtype=F32), 1)
    check_raises(lambda: call(no_kernels, args), ValueError, (f"{scale} tensor must be on cuda:0", "got cuda:1"))
    args[scale] = fake_cuda(torch.ones(1, dtype=F32), 0)
    check_raises(lambda: call(no_kernels, args), RuntimeError, NO_KERNELS)


@pytest.mark.parametrize("ragged", [False, True], ids=["uniform", "ragged"])
def test_fake_cuda_workspace_too_small(no_kernels, ragged):
    args = fake_baseline(ragged)
    need = args["workspace_size"]
    total_q = TOTAL_Q if ragged else B * Q_LEN
    args["workspace_size"] = need - 1
    check_raises(lambda: call(no_kernels, args), ValueError,
                 ("workspace_buffer is too small", f"needs {need} bytes",
                  f"batch_size={B}, total_q={total_q}, H={H}, sm_count={SM}",
                  f"got workspace_size = {need - 1}", "get_workspace_size"))
    args["workspace_size"] = need
    check_raises(lambda: call(no_kernels, args), RuntimeError, NO_KERNELS)


# ---- the compact entry (mla_decode), which the Python wrapper calls --------------------------


def compact(args: dict[str, Any], *, max_q_len: Any = "same", batch_size: Any = "same") -> tuple:
    """mla_decode's 16 arguments from a trtllm-entry argument set."""
    return (
        args["out"], args["lse"], args["query"], args["key_cache"], args["workspace_buffer"],
        args["block_tables"], args["seq_lens"], args["cum_seq_lens_q"], args["attention_sinks"],
        args["bmm1_scale"], args["bmm2_scale"],
        args["max_q_len"] if max_q_len == "same" else max_q_len,
        args["batch_size"] if batch_size == "same" else batch_size,
        args["sm_count"], args["enable_pdl"], args["max_kv_len"],
    )  # fmt: skip


@pytest.mark.parametrize("ragged", [False, True], ids=["uniform", "ragged"])
def test_compact_entry_runs_the_same_checks(launcher, ragged):
    args = baseline(ragged)
    check_raises(lambda: launcher.mla_decode(*compact(args)), ValueError, NOT_CUDA)
    # batch size and (uniform) max_q_len are derived when not given
    derived = compact(args, batch_size=None, max_q_len=None if not ragged else args["max_q_len"])
    check_raises(lambda: launcher.mla_decode(*derived), ValueError, NOT_CUDA)
    args["seq_lens"] = args["seq_lens"].long()
    check_raises(lambda: launcher.mla_decode(*compact(args)), TypeError, ("seq_lens must be int32", "int64"))


def test_compact_entry_without_max_q_len(launcher):
    # The kernels read each request's length on the device: max_q_len is only a checked hint.
    args = baseline(ragged=True)
    check_raises(lambda: launcher.mla_decode(*compact(args, max_q_len=None)), ValueError, NOT_CUDA)


def test_ragged_rows_without_requests(launcher):
    # batch 0 but query rows: nobody would write them (the uniform layout has its own check).
    args = baseline(ragged=True)
    args.update(batch_size=0, block_tables=args["block_tables"][:0], seq_lens=args["seq_lens"][:0],
                cum_seq_lens_q=torch.zeros(1, dtype=I32))
    check_raises(lambda: call(launcher, args), ValueError,
                 (f"query has total_q = {TOTAL_Q} rows but batch_size is 0",))


@pytest.mark.parametrize("ragged", [False, True], ids=["uniform", "ragged"])
def test_compact_entry_workspace_from_the_buffer(no_kernels, ragged):
    args = fake_baseline(ragged)
    need = args["workspace_size"]
    args["workspace_buffer"] = fake_cuda(torch.zeros(need - 1, dtype=torch.uint8), 0)
    check_raises(lambda: no_kernels.mla_decode(*compact(args)), ValueError,
                 ("workspace_buffer is too small", f"needs {need} bytes", f"got workspace_size = {need - 1}"))


# --------------------------------------------------------------------------------------------
# workspace_size export and get_workspace_size
# --------------------------------------------------------------------------------------------


def test_workspace_size_positive_and_growing(launcher):
    ws = launcher.workspace_size
    assert ws(0, 0, 1, 1) > 0
    assert ws(1, 1, 16, SM) > 0
    by_batch = [ws(b, b, 128, SM) for b in (1, 64, 1024, 8192)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1], by_batch
    by_heads = [ws(1024, 1024, h, SM) for h in (16, 64, 128)]
    assert by_heads == sorted(by_heads) and by_heads[0] < by_heads[-1], by_heads
    by_total_q = [ws(8, q, 128, SM) for q in (8, 512, 8192)]  # ragged: long requests, few of them
    assert by_total_q == sorted(by_total_q) and by_total_q[0] < by_total_q[-1], by_total_q
    assert ws(1, 1, 16, 1) < ws(1, 1, 16, SM)  # split partials: per CTA
    assert ws(1, 1, 16, 4096) == ws(1, 1, 16, 100000)  # CTA count capped


def test_get_workspace_size_matches_launcher(launcher):
    assert jit_mla.get_workspace_size(B, H, Q_LEN, sm_count=SM) == launcher.workspace_size(B, B * Q_LEN, H, SM)
    assert jit_mla.get_workspace_size(B, H, total_q=TOTAL_Q, sm_count=SM) == baseline(True)["workspace_size"]


@pytest.mark.parametrize(
    "bad",
    [(-1, 1, 16, SM), (1, -1, 16, SM), (1, 1, 0, SM), (1, 1, 16, 0), (1, 1, 16, -5)],
    ids=["batch", "total_q", "num_heads", "sm_count-0", "sm_count-negative"],
)
def test_workspace_size_bad_arguments(launcher, bad):
    got = ", ".join(str(x) for x in bad)
    check_raises(lambda: launcher.workspace_size(*bad), ValueError,
                 ("workspace_size needs batch >= 0, total_q >= 0, num_heads >= 1, sm_count >= 1", f"got {got}"))


def test_get_workspace_size_bad_arguments():
    check_raises(lambda: jit_mla.get_workspace_size(-1, H, sm_count=SM), ValueError, ("got -1, -1, 16, 132",))
    check_raises(lambda: jit_mla.get_workspace_size(B, 0, sm_count=SM), ValueError, ("got 3, 3, 0, 132",))


# --------------------------------------------------------------------------------------------
# The public API. Its own checks run before any launcher call; for the rest it hands CPU tensors
# to the real launcher (built without kernels, so no GPU is needed) and stops at the device check.
# --------------------------------------------------------------------------------------------


@pytest.fixture
def api_launcher(monkeypatch, launcher):
    # get_launcher() would ask for the GPU's arch to load its cubin; the argument checks need none.
    monkeypatch.setattr(api, "get_launcher", lambda: launcher)
    return launcher


def api_args(ragged: bool = False, **change) -> dict[str, Any]:
    a = baseline(ragged)
    kw = dict(
        query=a["query"], kv_cache=a["key_cache"], workspace_buffer=a["workspace_buffer"],
        qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64,
        block_tables=a["block_tables"], seq_lens=a["seq_lens"], max_seq_len=200,
        bmm1_scale=0.0721, bmm2_scale=1.0, sinks=a["attention_sinks"],
        cum_seq_lens_q=a["cum_seq_lens_q"],
    )  # fmt: skip
    kw.update(change)
    return kw


def run_api(**kw):
    return jit_mla.trtllm_batch_decode_with_kv_cache_mla(**kw)


def _cum(values) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


API_CASES = [
    # ---- Python-side checks (before the launcher) -------------------------------------------
    ("kv_lora_rank", dict(kv_lora_rank=256), ValueError,
     ("kv_lora_rank and qk_rope_head_dim must be 512 and 64", "got 256 and 64")),
    ("qk_rope_head_dim", dict(qk_rope_head_dim=128), ValueError,
     ("kv_lora_rank and qk_rope_head_dim must be 512 and 64", "got 512 and 128")),
    ("backend", dict(backend="fa3"), ValueError, ("backend must be one of", "'trtllm-gen'", "got 'fa3'")),
    ("sparse_mla_top_k", dict(sparse_mla_top_k=2048), NotImplementedError, ("sparse_mla_top_k", "got 2048")),
    ("skip_softmax", dict(skip_softmax_threshold_scale_factor=0.1), NotImplementedError,
     ("skip_softmax_threshold_scale_factor",)),
    ("uses_shared_paged_kv_idx", dict(uses_shared_paged_kv_idx=False), NotImplementedError,
     ("uses_shared_paged_kv_idx=False",)),
    ("sinks-list-of-2", dict(sinks=[torch.zeros(H), torch.zeros(H)]), ValueError,
     ("sinks as a list must hold one float32 [H] tensor", "got 2 items")),
    ("sinks-empty-list", dict(sinks=[]), ValueError, ("sinks as a list", "got 0 items")),
    ("cum-with-4d-query", dict(cum_seq_lens_q=_cum(RAGGED_CUM)), ValueError,
     ("cum_seq_lens_q needs the ragged query layout [total_q, H, 576]", f"got query of shape ({B}, {Q_LEN}, {H}, {D_QK})")),
    # cum_seq_lens_q without max_q_len: validated on the host
    ("cum-start", dict(ragged=True, cum_seq_lens_q=_cum([1, 2, 2, 5])), ValueError,
     ("cum_seq_lens_q[0] must be 0", "got 1")),
    ("cum-decreasing", dict(ragged=True, cum_seq_lens_q=_cum([0, 3, 2, 5])), ValueError,
     ("cum_seq_lens_q must be non-decreasing", "got cum[1] = 3 > cum[2] = 2")),
    ("cum-end", dict(ragged=True, cum_seq_lens_q=_cum([0, 2, 2, 4])), ValueError,
     (f"cum_seq_lens_q[B] must equal total_q = query.shape[0] = {TOTAL_Q}", "got 4")),
    ("cum-short", dict(ragged=True, cum_seq_lens_q=_cum([0, 2, 5])), ValueError,
     (f"cum_seq_lens_q must be int32 of shape [B+1] = [{B + 1}]", f"got int32 [{B}]")),
    ("cum-2d", dict(ragged=True, cum_seq_lens_q=_cum([RAGGED_CUM])), ValueError,
     (f"cum_seq_lens_q must be int32 of shape [B+1] = [{B + 1}]", f"got int32 [1, {B + 1}]")),
    # ---- launcher-side checks, through the API ----------------------------------------------
    ("query-float32", dict(query=torch.zeros(B, Q_LEN, H, D_QK)), TypeError,
     ("query must be bfloat16", f"got float32 {U}, {D_QK}]")),
    ("kv_cache-last-dim", dict(kv_cache=torch.zeros(PAGES, PAGE, D_V, dtype=BF16)), ValueError,
     ("kv_cache's last dim must be 576", f"got bfloat16 [{PAGES}, {PAGE}, {D_V}]")),
    ("bmm1_scale-float64", dict(bmm1_scale=torch.ones(1, dtype=torch.float64)), TypeError,
     ("bmm1_scale tensor must be float32", "got float64")),
    ("bmm2_scale-2-elements", dict(bmm2_scale=torch.ones(2)), ValueError,
     ("bmm2_scale tensor must have exactly one element", "got 2")),
    ("out-shape", dict(out=torch.zeros(B, Q_LEN, H, D_QK, dtype=BF16)), ValueError,
     (f"out must have shape {U}, {D_V}]", f"got bfloat16 {U}, {D_QK}]")),
    ("lse-dtype", dict(lse=torch.zeros(B, Q_LEN, H, dtype=BF16), return_lse=True), TypeError,
     ("lse must be float32", f"got bfloat16 {U}]")),
    ("sinks-shape", dict(sinks=torch.zeros(H + 1)), ValueError, (f"sinks must have shape [{H}]", f"got float32 [{H + 1}]")),
    ("sinks-list-wrong-dtype", dict(sinks=[torch.zeros(H, dtype=BF16)]), TypeError, ("sinks must be float32",)),
    ("seq_lens-length", dict(seq_lens=torch.ones(B + 1, dtype=I32)), ValueError,
     (f"seq_lens must have shape [{B}]", f"got int32 [{B + 1}]")),
    ("block_tables-int64", dict(block_tables=torch.zeros(B, MAX_PAGES, dtype=torch.int64)), TypeError,
     ("block_tables must be int32", "got int64")),
    ("query-3d-not-divisible", dict(query=torch.zeros(7, H, D_QK, dtype=BF16)), ValueError,
     (f"divisible by batch_size = {B}", f"got bfloat16 [7, {H}, {D_QK}]")),
    ("workspace-too-small-declared", dict(workspace_buffer=torch.zeros(0, dtype=torch.uint8)), ValueError,
     NOT_CUDA),  # size 0 is consistent with itself; "too small" is only known after the device check
]  # fmt: skip


def _api_kwargs(change: dict[str, Any]) -> dict[str, Any]:
    change = dict(change)
    ragged = change.pop("ragged", False)
    return api_args(ragged, **change)


@pytest.mark.parametrize("change,exc,fragments", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_wrong_argument(api_launcher, change, exc, fragments):
    kw = _api_kwargs(change)
    check_raises(lambda: run_api(**kw), exc, fragments)


def test_api_cum_seq_lens_q_wrong_dtype(api_launcher):
    # The host validation (no max_q_len) and the launcher (with max_q_len) both raise TypeError
    # for an int64 tensor, naming the argument, the expected and the actual dtype.
    kw = api_args(True, cum_seq_lens_q=torch.tensor(RAGGED_CUM, dtype=torch.int64))
    check_raises(lambda: run_api(**kw), TypeError, ("cum_seq_lens_q must be int32", f"got int64 [{B + 1}]"))
    check_raises(lambda: run_api(**kw, max_q_len=3), TypeError, ("cum_seq_lens_q must be int32", "got int64"))


API_VALID = [
    ("uniform", dict()),
    ("uniform-no-sinks", dict(sinks=None)),
    ("ragged-host-validated", dict(ragged=True)),
    ("ragged-zero-length-last", dict(ragged=True, cum_seq_lens_q=_cum([0, 2, 5, 5]))),
    # with max_q_len the prefix sums are not read on the host (no sync): only the shape is checked
    ("ragged-max_q_len-unchecked-sums", dict(ragged=True, cum_seq_lens_q=_cum([7, 0, 0, 1]), max_q_len=3)),
    ("sinks-list-of-1", dict(sinks=[torch.zeros(H)])),
    ("return_lse", dict(return_lse=True)),
    ("return_lse-ragged", dict(ragged=True, return_lse=True)),
    ("backend-trtllm-gen", dict(backend="trtllm-gen")),
    ("backend-jit_mla-pdl-off", dict(backend="jit_mla", enable_pdl=False)),
    ("scales-folded-tensors", dict(bmm1_scale=torch.full((1,), 0.07), bmm2_scale=torch.ones(1))),
    ("kv-4d", dict(kv_cache=torch.zeros(PAGES, 1, PAGE, D_QK, dtype=BF16))),
    ("qk_nope_head_dim-any", dict(qk_nope_head_dim=64, is_var_seq=False)),
]  # fmt: skip


@pytest.mark.parametrize("change", [c[1] for c in API_VALID], ids=[c[0] for c in API_VALID])
def test_api_valid_call_reaches_device_check(api_launcher, change):
    kw = _api_kwargs(change)
    check_raises(lambda: run_api(**kw), ValueError, NOT_CUDA)


def test_api_prefill_alias_checks_the_same(api_launcher):
    kw = api_args(True, cum_seq_lens_q=_cum([0, 3, 2, 5]))
    check_raises(lambda: jit_mla.trtllm_prefill_with_kv_cache_mla(**kw), ValueError, ("non-decreasing",))


def test_api_failures_leave_it_usable(api_launcher):
    for _ in range(3):
        for _id, change, exc, fragments in API_CASES:
            kw = _api_kwargs(change)
            check_raises(lambda: run_api(**kw), exc, fragments)
            good = api_args()
            check_raises(lambda: run_api(**good), ValueError, NOT_CUDA)


def test_api_none_block_tables_is_type_error(api_launcher):
    kw = api_args(block_tables=None)
    with pytest.raises(TypeError):
        run_api(**kw)


def test_probe_dump_needs_a_probe_build(launcher):
    # The shipped cubin has no mla_probe_dump (csrc/common/probe.h): a RuntimeError that says so,
    # or, before any cubin is loaded (no GPU), one that says that.
    with pytest.raises(RuntimeError, match="no cubin loaded|not a probe build"):
        launcher.probe_dump()
