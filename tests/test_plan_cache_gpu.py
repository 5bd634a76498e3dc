"""The split plan kept in the workspace across calls (csrc/common/plan_cache.cuh), on sm_90a.

A call reuses the plan a call left in the workspace when its key and input values are the same and
every word of the plan's span still equals the complement of its shadow; otherwise it plans
again. A call publishes a plan it made once every CTA has checked: after the merge's grid barrier
when it has splits, after every CTA's arrival at the launch's barrier word when it has none.
These cases run several calls on one workspace, with other inputs, other shapes, other kernels
and other writers in between, and check every result: against the float32 reference, and
bitwise against the same call on a fresh workspace (a plan is deterministic, so its output is).
"""

from __future__ import annotations

import random

import pytest
import torch

from mla_data import make_case, poisoned_lse, poisoned_out
from plan_layout import KEY_WORDS, PLAN_FORMAT, plan_layout
from test_guard_bands_gpu import check_case

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"


def _api():
    import jit_mla

    return jit_mla


def _case(B, q_len, H, kv_lens, *, ragged=False, seed=0, fp8=False):
    return make_case(B, q_len, H, 64, kv_lens, ragged=ragged, seed=seed, device=DEV,
                     dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)  # fmt: skip


def _total_q(case) -> int:
    return case.query.shape[0] if case.ragged else case.batch * case.query.shape[1]


def _ws_bytes(*cases) -> int:
    api = _api()
    return max(api.get_workspace_size(c.batch, c.num_heads, total_q=_total_q(c)) for c in cases)


def _call(case, ws):
    out = poisoned_out(case.query.shape[:-1] + (512,), DEV)
    lse = poisoned_lse(case.query.shape[:-1], DEV)
    _api().trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens,
        max(case.kv_lens), out=out, bmm1_scale=case.bmm1_scale, lse=lse,
        cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=case.max_q_len if case.ragged else None,
    )  # fmt: skip
    torch.cuda.synchronize()
    return out, lse


def _fresh(case):
    """The call on a workspace of its own, NaN-filled (no plan to reuse)."""
    return _call(case, torch.full((_ws_bytes(case),), 0xFF, dtype=torch.uint8, device=DEV))


def _same(a, b, label):
    for x, y, what in ((a[0], b[0], "out"), (a[1], b[1], "lse")):
        assert torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           y.view(torch.int16 if y.element_size() == 2 else torch.int32)), (
            f"{what} differs bitwise from the fresh workspace's ({label})")  # fmt: skip


def _header(ws) -> list[int]:
    return ws[: 4 * KEY_WORDS].view(torch.int32).tolist()


def test_calls_with_other_lengths_on_one_workspace():
    """X, Y, X, Z, Z, X: the same shapes, other seq_lens (one request's by one token in Z)."""
    rng = random.Random(5)
    base = [rng.randint(1, 9000) for _ in range(8)]
    lens = {"X": base, "Y": [rng.randint(1, 9000) for _ in range(8)], "Z": base[:-1] + [base[-1] + 1]}
    cases = {k: _case(8, 1, 128, v, seed=i) for i, (k, v) in enumerate(lens.items())}
    fresh = {k: _fresh(c) for k, c in cases.items()}
    ws = torch.full((_ws_bytes(*cases.values()),), 0xFF, dtype=torch.uint8, device=DEV)
    for i, k in enumerate("XYXZZX"):
        got = _call(cases[k], ws)
        check_case(cases[k], *got, label=f"plan cache {k} call {i}")
        _same(got, fresh[k], f"{k} call {i}")
        header = _header(ws)
        assert header[0] == PLAN_FORMAT and header[1] == 8, f"no plan published: header {header}"


@pytest.mark.parametrize("fp8", [False, True])
def test_other_shapes_and_kernels_on_one_workspace(fp8):
    """Shapes that take other kernels, layouts and CTA sets, in turn on one workspace, twice."""
    cases = [
        _case(1, 1, 16, 8192, seed=1, fp8=fp8),                       # narrow16, split 65 ways
        _case(8, 1, 128, 4096, seed=2, fp8=fp8),                      # seesaw / wide, equal pieces
        _case(5, [2, 0, 3, 1, 4], 128, [900, 0, 5000, 77, 12000], ragged=True, seed=3, fp8=fp8),
        _case(64, 2, 16, [(37 * b) % 3000 + 2 for b in range(64)], seed=4, fp8=fp8),
        _case(1, 1, 16, 8192, seed=5, fp8=fp8),                       # the first shape, other data
    ]  # fmt: skip
    fresh = [_fresh(c) for c in cases]
    ws = torch.full((_ws_bytes(*cases),), 0xFF, dtype=torch.uint8, device=DEV)
    for rnd in range(2):
        for i, c in enumerate(cases):
            got = _call(c, ws)
            _same(got, fresh[i], f"case {i} round {rnd}")
    p_dtype = torch.bfloat16
    for i, c in enumerate(cases):
        check_case(c, *fresh[i], label=f"plan cache shapes {i} fp8={fp8}", p_dtype=p_dtype)


def test_the_same_inputs_across_kernel_families():
    """A bf16 and an fp8 cache with the same lengths: the same key, so one plan for both."""
    lens = [(911 * b) % 7000 + 1 for b in range(6)]
    a, b = _case(6, 1, 128, lens, seed=7), _case(6, 1, 128, lens, seed=8, fp8=True)
    fa, fb = _fresh(a), _fresh(b)
    ws = torch.full((_ws_bytes(a, b),), 0xFF, dtype=torch.uint8, device=DEV)
    for i in range(3):
        _same(_call(a, ws), fa, f"bf16 {i}")
        _same(_call(b, ws), fb, f"fp8 {i}")


def test_scribbles_between_calls_are_caught():
    """Whatever another kernel writes into the workspace between two calls with the same inputs
    (zeros, a fill byte, random bytes over random ranges, a key word, an input copy), the second
    call's result is the fresh workspace's: the header and copies send it to plan, or a word of
    the plan's span disagrees with its shadow."""
    c = _case(2, 1, 128, [20000, 3000], seed=9)  # split: a split list, partials, the merge
    want = _fresh(c)
    check_case(c, *want, label="plan cache scribbles fresh")
    ws = torch.full((_ws_bytes(c),), 0xFF, dtype=torch.uint8, device=DEV)
    head = min(ws.numel(), 64 * 1024)  # the header, copies and plan words lie in the first KiBs
    gen = torch.Generator().manual_seed(3)
    scribbles = [("zeros", lambda: ws[:head].zero_()), ("0x7f", lambda: ws[:head].fill_(0x7F)),
                 ("past the header: zeros", lambda: ws[64:head].zero_()),
                 ("past the header: 0xff", lambda: ws[64:head].fill_(0xFF)),
                 ("batch in the key + 1", lambda: ws[4:8].view(torch.int32).add_(1)),
                 ("first input copy + 1", lambda: ws[256:260].view(torch.int32).add_(1))]  # fmt: skip
    for k in range(40):
        lo = int(torch.randint(0, head - 4, (1,), generator=gen))
        n = int(torch.randint(4, 2048, (1,), generator=gen))
        hi = min(head, lo + n)
        data = torch.randint(0, 256, (hi - lo,), dtype=torch.uint8, generator=gen).to(DEV)
        scribbles.append((f"random [{lo}, {hi})", lambda lo=lo, hi=hi, d=data: ws[lo:hi].copy_(d)))
    for name, scribble in scribbles:
        _same(_call(c, ws), want, f"before {name}")
        scribble()
        _same(_call(c, ws), want, f"after {name}")


@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_a_consistent_plan_in_the_workspace_is_used(split):
    """White box: after a call, a forged plan without work (every set's bounds (0, 0), no split
    groups) with matching shadows. The next call with the same inputs takes it (no set has work:
    out and lse keep their poison), which shows the reuse; a changed length plans again. With
    splits (one long request over every set) and without (equal requests, whole ones per set:
    the publish after the launch's barrier word, not the merge's barrier)."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    c = _case(1, 1, 128, 20000, seed=10) if split else _case(2 * sms, 1, 16, 1000, seed=14)
    ws = torch.full((_ws_bytes(c),), 0xFF, dtype=torch.uint8, device=DEV)
    check_case(c, *_call(c, ws), label="plan cache white box")
    header = _header(ws)
    assert header[0] == PLAN_FORMAT, f"no plan published: header {header}"
    lay = plan_layout(c.batch, _total_q(c), c.num_heads, sms)
    words = ws.view(torch.int32)
    span = slice(lay.group_prefix // 4, lay.shadow // 4)
    shadows = slice(lay.shadow // 4, lay.end // 4)
    assert torch.equal(words[shadows], ~words[span]), "layout mirror out of date, or no publish"
    assert (words[lay.split_groups // 4] != 0) == split, "the case does not split as it means to"
    num_ctas, m_group = header[8], header[7]
    b0 = lay.bounds // 4
    words[b0 : b0 + 2 * (num_ctas // m_group + 1)] = 0  # every set's range empty
    words[lay.split_groups // 4] = 0  # no split groups (no merge)
    words[shadows] = ~words[span]
    out, lse = _call(c, ws)
    assert bool(out.isnan().all()) and bool(lse.isnan().all()), "the consistent plan was not reused"
    c.seq_lens[0] -= 1  # other inputs: a new plan
    c.kv_lens[0] -= 1
    check_case(c, *_call(c, ws), label="plan cache white box replanned")


def test_calls_with_and_without_splits_alternating():
    """Each call publishes its plan, with splits or without: the header follows the last call
    (its batch), the shadows mirror the span, and calls alternating between the two stay exact."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    split = _case(2, 1, 16, [9000, 5000], seed=13)  # few requests: split
    whole = _case(2 * sms, 1, 16, 1000, seed=14)  # equal requests, two per set: whole groups
    want = {"split": _fresh(split), "whole": _fresh(whole)}
    ws = torch.full((_ws_bytes(split, whole),), 0xFF, dtype=torch.uint8, device=DEV)
    words = ws.view(torch.int32)
    for i, (name, c) in enumerate([("split", split), ("whole", whole)] * 3):
        _same(_call(c, ws), want[name], f"{name} call {i}")
        header = _header(ws)
        assert header[0] == PLAN_FORMAT and header[1] == c.batch, f"{name} call {i}: header {header}"
        lay = plan_layout(c.batch, _total_q(c), c.num_heads, sms)
        span, shadows = slice(lay.group_prefix // 4, lay.shadow // 4), slice(lay.shadow // 4, lay.end // 4)
        assert torch.equal(words[shadows], ~words[span]), f"{name} call {i}: shadows not published"
    check_case(whole, *want["whole"], label="plan cache whole groups")
    check_case(split, *want["split"], label="plan cache split")


def test_graph_replays_with_new_lengths():
    """A CUDA graph of x, x, y on one workspace (the second x reuses the first's plan), replayed
    with new lengths in x and then in y."""
    x = _case(4, 1, 128, [3000, 9000, 64, 5000], seed=11)
    y = _case(4, 1, 128, [7000, 1, 8000, 2500], seed=12)
    calls = [x, x, y]
    ws = torch.full((_ws_bytes(x, y),), 0xFF, dtype=torch.uint8, device=DEV)
    shapes = [c.query.shape[:-1] for c in calls]
    bufs = [(poisoned_out(q + (512,), DEV), poisoned_lse(q, DEV)) for q in shapes]

    def step():
        for c, (out, lse) in zip(calls, bufs):
            _api().trtllm_batch_decode_with_kv_cache_mla(
                c.query, c.kv_cache, ws, 128, 512, 64, c.block_tables, c.seq_lens, 9000,
                out=out, bmm1_scale=c.bmm1_scale, lse=lse)  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    new = {1: (x, [2999, 17, 64, 4000]), 2: (y, [6000, 1, 1, 2500])}  # never above a case's own
    for i in range(3):
        if i in new:
            c, lens = new[i]
            c.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
            c.kv_lens = list(lens)
        for out, lse in bufs:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for k, (c, (out, lse)) in enumerate(zip(calls, bufs)):
            check_case(c, out, lse, label=f"plan cache graph replay {i} call {k}")
