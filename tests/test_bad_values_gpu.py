"""Bad values in device tensors on the GPU (sm_90a).

Without checks (the default): a page id outside the pool, a negative or too long ``seq_lens``, or
overlapping ``cum_seq_lens_q`` must not make the kernels touch memory outside their tensors
(guard bands intact), fault, or hang; the other requests' outputs stay correct; the next good call
is correct. With ``check_inputs=True``: the same inputs raise ``InputCheckError`` before any launch.
"""

from __future__ import annotations

import zlib

import pytest
import torch

import jit_mla
from mla_data import assert_close_fa3, make_case
from test_guard_bands_gpu import Banded, check_case

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"
B, H = 6, 128
KV_LENS = [300, 1000, 65, 2000, 7, 513]
Q_LENS = [1, 3, 0, 2, 1, 4]  # ragged cases


def _case(page: int, ragged: bool, seed: int):
    return make_case(B, Q_LENS if ragged else 2, H, page, KV_LENS, ragged=ragged, device=DEV, seed=seed)


def _rows(case, b: int) -> slice:
    """Rows of request b in out's leading dim (ragged) or the request index (uniform)."""
    if case.ragged:
        cum = case.cum_seq_lens_q.tolist()
        return slice(cum[b], cum[b + 1])
    return slice(b, b + 1)


def _call(case, *, block_tables=None, seq_lens=None, cum=None, check_inputs=None):
    ws_bytes = jit_mla.get_workspace_size(B, H, total_q=case.query.shape[0] if case.ragged else B * 2)
    ws = Banded((ws_bytes,), torch.uint8, fill=None)
    out = Banded(tuple(case.query.shape[:-1]) + (512,), torch.bfloat16)
    lse = Banded(tuple(case.query.shape[:-1]), torch.float32)
    jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws.tensor, 128, 512, 64,
        case.block_tables if block_tables is None else block_tables,
        case.seq_lens if seq_lens is None else seq_lens, max(KV_LENS),
        out=out.tensor, lse=lse.tensor, bmm1_scale=case.bmm1_scale,
        cum_seq_lens_q=case.cum_seq_lens_q if cum is None else cum,
        max_q_len=case.max_q_len if case.ragged else None, check_inputs=check_inputs,
    )  # fmt: skip
    torch.cuda.synchronize()  # a fault would surface here, as a sticky error
    for name, t in (("out", out), ("lse", lse), ("workspace", ws)):
        t.assert_bands_intact(name)
    return out.tensor, lse.tensor


def _bad_inputs(case, kind: str):
    """(keyword arguments that break request 1 (or the prefix sums), requests left intact)."""
    bt, sl = case.block_tables.clone(), case.seq_lens.clone()
    if kind == "page-past-pool":
        bt[1, 3] = case.kv_cache.shape[0] + 12345
        return dict(block_tables=bt), [0, 2, 3, 4, 5]
    if kind == "page-negative":
        bt[1, 0] = -7
        return dict(block_tables=bt), [0, 2, 3, 4, 5]
    if kind == "seq-huge":
        sl[1] = 2**31 - 1
        return dict(seq_lens=sl), [0, 2, 3, 4, 5]
    if kind == "seq-negative":
        sl[1] = -5
        return dict(seq_lens=sl), [0, 2, 3, 4, 5]
    if kind == "cum-overlap":  # requests 1..2 overlap earlier rows and run past total_q
        cum = case.cum_seq_lens_q.clone()
        cum[2] = 0
        cum[3] = case.query.shape[0] + 50
        return dict(cum=cum), []
    if kind == "cum-oversubscribed":  # three requests own all rows: more groups than the workspace
        T = case.query.shape[0]  # holds (33 against max_groups = 11 * 128 / 64 + 6 = 28): the
        cum = torch.tensor([0, T, 0, T, 0, T, T], dtype=torch.int32, device=DEV)  # planner caps
        return dict(cum=cum), []
    raise AssertionError(kind)


KINDS = [("page-past-pool", False), ("page-negative", True), ("seq-huge", False), ("seq-negative", True),
         ("cum-overlap", True), ("cum-oversubscribed", True)]  # fmt: skip


@pytest.mark.parametrize("page", [64, 24], ids=["tma", "any-page"])
@pytest.mark.parametrize("kind,ragged", KINDS, ids=[k for k, _ in KINDS])
def test_bad_values_stay_contained(kind, ragged, page):
    case = _case(page, ragged, seed=zlib.crc32(f"{kind}-{page}".encode()) & 0xFFFF)
    bad, intact = _bad_inputs(case, kind)
    out, lse = _call(case, **bad)
    ref, ref_lse = case.reference()
    ref_lowp, _ = case.reference(low_precision=True)
    for b in intact:
        rows = _rows(case, b)
        assert_close_fa3(out[rows].float(), ref[rows], ref_lowp[rows], name=f"out of intact request {b} ({kind})")
    # The process goes on: the next good call is correct.
    out, lse = _call(case)
    check_case(case, out, lse, label=f"after {kind}")


@pytest.mark.parametrize("kind,ragged", KINDS, ids=[k for k, _ in KINDS])
def test_check_inputs_refuses_before_launch(kind, ragged):
    case = _case(64, ragged, seed=7)
    bad, _ = _bad_inputs(case, kind)
    out = torch.full(tuple(case.query.shape[:-1]) + (512,), float("nan"), dtype=torch.bfloat16, device=DEV)
    ws = torch.empty(jit_mla.get_workspace_size(B, H, total_q=case.query.shape[0] if ragged else B * 2),
                     dtype=torch.uint8, device=DEV)
    with pytest.raises(jit_mla.InputCheckError):
        jit_mla.trtllm_batch_decode_with_kv_cache_mla(
            case.query, case.kv_cache, ws, 128, 512, 64, bad.get("block_tables", case.block_tables),
            bad.get("seq_lens", case.seq_lens), max(KV_LENS), out=out, bmm1_scale=case.bmm1_scale,
            cum_seq_lens_q=bad.get("cum", case.cum_seq_lens_q),
            max_q_len=case.max_q_len if ragged else None, check_inputs=True)  # fmt: skip
    torch.cuda.synchronize()
    assert bool(out.isnan().all()), "a kernel ran after a failed check (out was written)"
    out, lse = _call(case, check_inputs=True)
    check_case(case, out, lse, label=f"checked, after {kind}")


def test_check_inputs_refused_during_capture():
    case = _case(64, False, seed=1)
    ws = torch.empty(jit_mla.get_workspace_size(B, H, 2), dtype=torch.uint8, device=DEV)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="check_inputs=True"):
        with torch.cuda.graph(graph, stream=stream):
            jit_mla.trtllm_batch_decode_with_kv_cache_mla(
                case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 2000,
                bmm1_scale=case.bmm1_scale, check_inputs=True)
