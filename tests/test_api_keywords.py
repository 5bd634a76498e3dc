"""FlashInfer's full keyword list: accepted at defaults, refused (NotImplementedError naming the
keyword) otherwise; LSE base conversion. CPU: the launcher is replaced by a recorder."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import jit_mla
from jit_mla import api

# FlashInfer 0.7.2.post1's trtllm_batch_decode_with_kv_cache_mla, in order.
FLASHINFER_PARAMS = [
    "query", "kv_cache", "workspace_buffer", "qk_nope_head_dim", "kv_lora_rank", "qk_rope_head_dim",
    "block_tables", "seq_lens", "max_seq_len", "sparse_mla_top_k", "out", "bmm1_scale", "bmm2_scale",
    "sinks", "skip_softmax_threshold_scale_factor", "enable_pdl", "backend", "is_var_seq",
    "uses_shared_paged_kv_idx", "lse", "return_lse", "cute_dsl_impl", "kv_scale_format",
    "cum_seq_lens_q", "max_q_len", "multi_ctas_kv_counter_buffer", "sparse_mla_top_k_lens",
    "enable_dcp", "cp_world", "cp_rank", "causal_seqlens_kv_global", "use_fp16_softmax",
    "return_lse_base",
]  # fmt: skip


class _Recorder:
    """Stands in for the launcher: writes a known base-2 LSE so the conversion can be checked."""

    def __init__(self):
        self.calls = 0

    def mla_decode(self, *args):
        self.calls += 1
        lse = args[1]
        if lse is not None:
            lse.fill_(3.0)
            lse.view(-1)[0] = float("-inf")


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(api, "get_launcher", lambda: rec)
    monkeypatch.setattr(api, "_sm_count", lambda device: 132)
    return rec


def _call(**kw):
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 576, dtype=torch.bfloat16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    sl = torch.ones(2, dtype=torch.int32)
    return jit_mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, ws, 128, 512, 64, bt, sl, 1, **kw)


def test_signature_follows_flashinfer_order():
    params = inspect.signature(jit_mla.trtllm_batch_decode_with_kv_cache_mla).parameters
    assert list(params)[: len(FLASHINFER_PARAMS)] == FLASHINFER_PARAMS
    # Our own additions come after FlashInfer's, keyword-only, so positional calls are unchanged.
    extras = list(params)[len(FLASHINFER_PARAMS):]
    assert extras == ["check_inputs"]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in extras)


def test_defaults_are_accepted(recorder):
    _call(cute_dsl_impl="auto", kv_scale_format="auto", multi_ctas_kv_counter_buffer=None,
          sparse_mla_top_k_lens=None, enable_dcp=False, cp_world=1, cp_rank=0,
          causal_seqlens_kv_global=None, use_fp16_softmax=False, return_lse_base="base2")
    assert recorder.calls == 1


@pytest.mark.parametrize("name,value", [
    ("cute_dsl_impl", "monolithic"),
    ("kv_scale_format", "arbitrary_fp32"),
    ("multi_ctas_kv_counter_buffer", torch.zeros(4, dtype=torch.int32)),
    ("sparse_mla_top_k_lens", torch.zeros(2, dtype=torch.int32)),
    ("enable_dcp", True),
    ("cp_world", 2),
    ("cp_rank", 1),
    ("causal_seqlens_kv_global", torch.zeros(2, dtype=torch.int32)),
    ("use_fp16_softmax", True),
])  # fmt: skip
def test_non_defaults_are_refused_by_name(recorder, name, value):
    with pytest.raises(NotImplementedError, match=name):
        _call(**{name: value})
    assert recorder.calls == 0


def test_bad_lse_base_is_value_error(recorder):
    with pytest.raises(ValueError, match="return_lse_base"):
        _call(return_lse_base="base10")


@pytest.mark.parametrize("base,factor", [(None, 1.0), ("base2", 1.0), ("basee", math.log(2.0))])
def test_lse_base(recorder, base, factor):
    _, lse = _call(return_lse=True, return_lse_base=base)
    assert lse.view(-1)[0] == float("-inf")
    assert torch.allclose(lse.view(-1)[1:], torch.full_like(lse.view(-1)[1:], 3.0 * factor))
