"""Property-based fuzzing of the attention kernels against the float32 reference (sm_90a).

Hypothesis draws a call: bf16, an fp8 e4m3 cache with a bf16 query, or both e4m3; batch 1..40,
heads, page size, uniform (4-D or flattened 3-D query) or
ragged layout with per-request query lengths 0..8, KV lengths from the query length up to 3000
(the shortest legal ones and page boundaries included), 3-D/4-D cache, pool padding, sinks,
float or device-tensor scales, lse or not, PDL on/off, loose max_q_len/max_seq_len hints. Data are
built by ``mla_data.make_case`` (NaN in every byte a kernel must not read, NaN-poisoned outputs)
and compared by FlashAttention-3's rule (``check_case``).

Bounded for a shared GPU:
- ``JIT_MLA_FUZZ_EXAMPLES`` examples (default 60), no per-example deadline;
- ``JIT_MLA_FUZZ_BUDGET_S`` seconds in total (default 360): later examples pass without running,
  and the number skipped is printed (never once a failure was seen, so the report is exact);
- no shrinking unless ``JIT_MLA_FUZZ_SHRINK=1`` (each example costs a GPU call and two
  references; a failing example is printed as drawn);
- ``JIT_MLA_FUZZ_SEED=<int>`` fixes hypothesis' seed (default: a fresh one per run).

Every example prints ``fuzz case: {...}`` before it runs (pytest shows the output of a failing
test; with ``-s`` live), so the log names the failing case. To rerun exactly one case, pass that
dict back: ``JIT_MLA_FUZZ_CASE="{...}" python -m pytest -q tests/test_fuzz_gpu.py -k replay``.
"""

from __future__ import annotations

import ast
import os
import time
import warnings

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mla_data import make_case, poisoned_lse, poisoned_out  # noqa: E402
from test_guard_bands_gpu import check_case  # noqa: E402

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"
MAX_EXAMPLES = int(os.environ.get("JIT_MLA_FUZZ_EXAMPLES", "60"))
BUDGET_S = float(os.environ.get("JIT_MLA_FUZZ_BUDGET_S", "360"))
SHRINK = os.environ.get("JIT_MLA_FUZZ_SHRINK", "").strip().lower() in ("1", "true", "yes", "on")
SEED = os.environ.get("JIT_MLA_FUZZ_SEED", "").strip()

HEADS = (1, 3, 16, 32, 64, 128)
PAGE_SIZES = (1, 8, 16, 24, 32, 64, 128)  # 8..128 take the TMA kernel, 1 and 24 the cp.async one
MAX_BATCH = 40
MAX_Q = 8
MAX_KV = 3000


# --------------------------------------------------------------------------------------------
# What a call looks like
# --------------------------------------------------------------------------------------------


def _kv_len(q: int, page: int) -> st.SearchStrategy[int]:
    """seq_len of a request with ``q`` query tokens: >= q; 0 only for an empty padded slot."""
    lo = max(q, 1)
    boundary = st.integers(1, MAX_KV // page).flatmap(
        lambda k: st.sampled_from([k * page - 1, k * page, k * page + 1])
    ).filter(lambda n: lo <= n <= MAX_KV)
    options = [st.just(lo), st.integers(lo, 256), st.integers(lo, MAX_KV), boundary]
    if q <= 1:
        options.append(st.just(0))  # a padded CUDA-graph slot: no key at all (out 0, lse -inf)
    return st.one_of(options)


@st.composite
def calls(draw) -> dict:
    batch = draw(st.integers(1, MAX_BATCH))
    page = draw(st.sampled_from(PAGE_SIZES))
    layout = draw(st.sampled_from(["uniform", "uniform_3d", "ragged"]))
    if layout == "ragged":
        q_lens = draw(st.lists(st.integers(0, MAX_Q), min_size=batch, max_size=batch))
    else:
        q_lens = [draw(st.integers(1, MAX_Q))] * batch
    return {
        "kv": draw(st.sampled_from(["bf16", "fp8", "fp8q"])),  # fp8q: e4m3 query and cache
        "batch": batch,
        "heads": draw(st.sampled_from(HEADS)),
        "page": page,
        "layout": layout,
        "q_lens": q_lens,
        "kv_lens": [draw(_kv_len(q, page)) for q in q_lens],
        "cache_4d": draw(st.booleans()),
        "pool_padding": draw(st.sampled_from([0, 8, 16])),
        "sinks": draw(st.booleans()),
        "tensor_scales": draw(st.booleans()),
        "bmm1_factor": draw(st.sampled_from([1.0, 0.5, 1.7])),
        "bmm2": draw(st.sampled_from([1.0, 0.5, 2.0])),
        "lse": draw(st.booleans()),
        "pdl": draw(st.sampled_from([None, True, False])),
        "max_q_len_slack": draw(st.sampled_from([0, 0, 3])) if layout == "ragged" else 0,
        "max_seq_len": draw(st.sampled_from(["exact", "one", "huge"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


# --------------------------------------------------------------------------------------------
# One call, checked
# --------------------------------------------------------------------------------------------


def run_call(p: dict) -> None:
    """Build the case, call the kernel, compare with the reference. Prints the case first."""
    import jit_mla

    print(f"fuzz case: {p!r}", flush=True)
    ragged = p["layout"] == "ragged"
    B, H = p["batch"], p["heads"]
    kind = p.get("kv", "bf16")  # cases printed before the fp8 draw replay as bf16
    fp8 = torch.float8_e4m3fn
    case = make_case(
        B, p["q_lens"] if ragged else p["q_lens"][0], H, p["page"], p["kv_lens"], ragged=ragged,
        cache_4d=p["cache_4d"], pool_padding=p["pool_padding"], device=DEV, seed=p["seed"],
        dtype=torch.bfloat16 if kind == "bf16" else fp8, q_dtype=fp8 if kind == "fp8q" else torch.bfloat16,
    )
    # query: [B, q, H, 576] (uniform), [B*q, H, 576] without cum_seq_lens_q (uniform_3d), or
    # [total_q, H, 576] with it (ragged). out/lse follow the query's layout.
    query = case.query.reshape(-1, H, 576) if p["layout"] == "uniform_3d" else case.query
    total_q = query.shape[0] if query.dim() == 3 else B * query.shape[1]
    ws_bytes = jit_mla.get_workspace_size(B, H, total_q=total_q)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
    out = poisoned_out(query.shape[:-1] + (512,), DEV)
    lse = poisoned_lse(query.shape[:-1], DEV) if p["lse"] else None
    bmm1 = case.bmm1_scale * p["bmm1_factor"]
    s1, s2 = bmm1, p["bmm2"]
    if p["tensor_scales"]:
        s1 = torch.tensor([s1], dtype=torch.float32, device=DEV)
        s2 = torch.tensor([s2], dtype=torch.float32, device=DEV)
    max_seq_len = {"exact": max(case.kv_lens), "one": 1, "huge": 1 << 20}[p["max_seq_len"]]

    jit_mla.trtllm_batch_decode_with_kv_cache_mla(
        query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, max_seq_len,
        out=out, bmm1_scale=s1, bmm2_scale=s2, sinks=case.sinks if p["sinks"] else None, lse=lse,
        enable_pdl=p["pdl"], cum_seq_lens_q=case.cum_seq_lens_q,
        max_q_len=case.max_q_len + p["max_q_len_slack"] if ragged else None,
    )
    torch.cuda.synchronize()

    shape = case.query.shape[:-1]  # back to the layout the reference returns
    check_case(
        case, out.view(shape + (512,)), None if lse is None else lse.view(shape),
        bmm1=bmm1, bmm2=p["bmm2"], sinks=p["sinks"],
        label=f"fuzz {kind} B{B} H{H} p{p['page']} {p['layout']} seed {p['seed']}",
        p_dtype=fp8 if kind == "fp8q" else torch.bfloat16,
    )


# --------------------------------------------------------------------------------------------
# The fuzz test, bounded in examples and in time
# --------------------------------------------------------------------------------------------

_budget = {"start": None, "skipped": 0, "failed": False}

_phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
_settings = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,  # nothing written into the checkout; the printed case reproduces a failure
    print_blob=True,
    phases=_phases,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _seeded(test):
    return hypothesis.seed(int(SEED))(test) if SEED else test


@_settings
@_seeded
@given(p=calls())
def test_fuzz_against_reference(p):
    now = time.monotonic()
    if _budget["start"] is None:
        _budget["start"] = now
    if not _budget["failed"] and now - _budget["start"] > BUDGET_S:
        _budget["skipped"] += 1
        return
    try:
        run_call(p)
    except BaseException:
        _budget["failed"] = True  # replays of the failing example must run, not be skipped
        raise


def test_fuzz_budget_report():
    """Warns when the time budget cut the fuzz test short (runs after it, in file order)."""
    if _budget["start"] is None:
        pytest.skip("the fuzz test did not run")
    if _budget["skipped"]:
        warnings.warn(
            f"fuzz: the {BUDGET_S:.0f} s budget (JIT_MLA_FUZZ_BUDGET_S) was used up; "
            f"{_budget['skipped']} of {MAX_EXAMPLES} examples did not run"
        )


def test_fuzz_replay():
    """``JIT_MLA_FUZZ_CASE="<the printed dict>"``: rerun one case exactly."""
    raw = os.environ.get("JIT_MLA_FUZZ_CASE", "").strip()
    if not raw:
        pytest.skip("set JIT_MLA_FUZZ_CASE to a printed 'fuzz case: {...}' dict to replay it")
    run_call(ast.literal_eval(raw))
