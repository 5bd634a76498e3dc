"""The opt-in checks of device values (jit_mla/checks.py), on CPU tensors: every bad value is
found and named; valid inputs (zero-length requests, garbage in unused table entries) pass; the
switch (argument, environment variable, capture/compile) behaves as documented.

The same checks on CUDA tensors, through the public API, are in tests/test_bad_values_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

import jit_mla
from jit_mla import api, checks, env
from mla_data import make_case

B, H, PAGE = 4, 16, 16


def _case(ragged: bool):
    q_lens = [2, 0, 3, 1] if ragged else 2
    return make_case(B, q_lens, H, PAGE, [40, 5, 17, 64], ragged=ragged, seed=3)


def _check(case, *, cum="same", max_q_len="same", seq_lens=None, block_tables=None):
    checks.check_device_inputs(
        case.query, case.kv_cache,
        case.block_tables if block_tables is None else block_tables,
        case.seq_lens if seq_lens is None else seq_lens,
        case.cum_seq_lens_q if cum == "same" else cum,
        case.max_q_len if max_q_len == "same" else max_q_len,
        case.batch,
    )  # fmt: skip


@pytest.mark.parametrize("ragged", [False, True])
def test_valid_inputs_pass(ragged):
    case = _case(ragged)
    _check(case)
    # Entries past a request's pages are never read: any value there is fine (engines pad with -1).
    table = case.block_tables.clone()
    table[:, -1] = -1
    _check(case, block_tables=table)


def _bad_table(case, b, p, value):
    t = case.block_tables.clone()
    t[b, p] = value
    return t


# (label, ragged, how to break the case, exact fragments of the message)
BAD = [
    ("page-past-pool", False, lambda c: dict(block_tables=_bad_table(c, 2, 1, c.kv_cache.shape[0])),
     ["block_tables[2, 1] = ", "outside the pool", "[0, "]),
    ("page-negative", True, lambda c: dict(block_tables=_bad_table(c, 3, 3, -1)),
     ["block_tables[3, 3] = -1", "outside the pool"]),
    ("seq-negative", False, lambda c: dict(seq_lens=torch.tensor([40, -3, 17, 64], dtype=torch.int32)),
     ["seq_lens must be >= 0", "seq_lens[1] = -3"]),
    ("seq-below-q", False, lambda c: dict(seq_lens=torch.tensor([40, 5, 1, 64], dtype=torch.int32)),
     ["seq_lens[2] = 1", "query length 2"]),
    ("seq-below-q-ragged", True, lambda c: dict(seq_lens=torch.tensor([40, 5, 2, 64], dtype=torch.int32)),
     ["seq_lens[2] = 2", "query length 3"]),
    ("seq-past-table", False, lambda c: dict(seq_lens=torch.tensor([40, 5, 17, 10_000], dtype=torch.int32)),
     ["block_tables has", "seq_lens[3] = 10000", "needs 625 pages"]),
    ("cum-start", True, lambda c: dict(cum=torch.tensor([1, 3, 3, 6, 7], dtype=torch.int32)),
     ["cum_seq_lens_q[0] must be 0, got 1"]),
    ("cum-decreasing", True, lambda c: dict(cum=torch.tensor([0, 3, 2, 5, 6], dtype=torch.int32)),
     ["non-decreasing", "cum_seq_lens_q[1] = 3 > cum_seq_lens_q[2] = 2"]),
    ("cum-end", True, lambda c: dict(cum=torch.tensor([0, 2, 2, 5, 5], dtype=torch.int32)),
     ["cum_seq_lens_q[4] must equal total_q", "= 6, got 5"]),
    ("max-q-len", True, lambda c: dict(max_q_len=2),
     ["max_q_len = 2", "request 2 has 3 tokens"]),
]


@pytest.mark.parametrize("label,ragged,breaker,fragments", BAD, ids=[b[0] for b in BAD])
def test_bad_values_are_named(label, ragged, breaker, fragments):
    case = _case(ragged)
    with pytest.raises(jit_mla.InputCheckError) as info:
        _check(case, **breaker(case))
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{label}: {f!r} not in {msg!r}"
    assert isinstance(info.value, ValueError)


def test_non_dividing_uniform_rows_are_left_to_the_launcher():
    case = _case(False)
    q3 = case.query.reshape(-1, H, 576)[:-1]  # [7, H, 576] for B = 4: the launcher's shape error
    checks.check_device_inputs(q3, case.kv_cache, case.block_tables, case.seq_lens, None, None, B)


def test_wrong_dtypes_are_left_to_the_launcher():
    case = _case(False)
    # int64 tables: the checks step aside; the launcher names the dtype.
    _check(case, block_tables=case.block_tables.long(), seq_lens=case.seq_lens.long())


# ---- the switch -------------------------------------------------------------------------------


# The launcher replaced by a call counter (shared with the keyword tests).
from test_api_keywords import recorder  # noqa: E402,F401 - a fixture


def _api_call(case, **kw):
    ws = torch.zeros(1 << 22, dtype=torch.uint8)
    return jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 64,
        cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=case.max_q_len if case.ragged else None, **kw)


def _broken_case():
    case = _case(False)
    case.block_tables[0, 0] = 10_000
    return case


def test_api_checks_before_launching(recorder):
    with pytest.raises(jit_mla.InputCheckError, match=r"block_tables\[0, 0\] = 10000"):
        _api_call(_broken_case(), check_inputs=True)
    assert recorder.calls == 0, "the launch must not happen after a failed check"
    _api_call(_case(True), check_inputs=True)  # the next good call goes through
    assert recorder.calls == 1


def test_api_default_is_off(recorder):
    _api_call(_broken_case())  # no sync, no check: the kernels clamp (tests/test_bad_values_gpu.py)
    assert recorder.calls == 1


def test_environment_variable(recorder, monkeypatch):
    monkeypatch.setenv("JIT_MLA_CHECK_INPUTS", "1")
    env.reload()
    try:
        with pytest.raises(jit_mla.InputCheckError):
            _api_call(_broken_case())
        _api_call(_broken_case(), check_inputs=False)  # the argument wins
        assert recorder.calls == 1
    finally:
        monkeypatch.delenv("JIT_MLA_CHECK_INPUTS")
        env.reload()
    assert not env.check_inputs_enabled()


def test_refused_inside_compile_and_skipped_from_env(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match="check_inputs=True reads device values back"):
        checks.wanted(True)
    monkeypatch.setattr(env, "_check_inputs", True)
    assert checks.wanted(None) is False
    assert checks.wanted(False) is False
