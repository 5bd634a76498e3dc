"""Properties of the float32 reference (CPU; one test also runs on CUDA when present)."""

import math

import pytest
import torch

import jit_mla.reference as reference
from jit_mla.reference import mla_reference
from mla_data import (
    D_QK,
    D_V,
    SM_SCALE,
    assert_close_fa3,
    lse_tolerance,
    make_case,
    max_error,
    poisoned_lse,
    poisoned_out,
)


def _dense_by_hand(case, sinks=None, bmm1_scale=SM_SCALE, bmm2_scale=1.0):
    """softmax(Q K^T) V per request and token, in float64, from the cache read row by row."""
    outs, lses = [], []
    ps = case.page_size
    cum = [0]
    for n in case.q_lens:
        cum.append(cum[-1] + n)
    q_rows = case.query.reshape(-1, case.num_heads, D_QK).double()
    cache = case.kv_cache.reshape(case.kv_cache.shape[0], ps, D_QK)
    for b, (n, L) in enumerate(zip(case.q_lens, case.kv_lens)):
        rows = [cache[int(case.block_tables[b, j // ps]), j % ps] for j in range(L)]
        K = torch.stack(rows).double() if rows else torch.zeros(0, D_QK, dtype=torch.float64)
        for t in range(n):
            o = torch.zeros(case.num_heads, D_V, dtype=torch.float64)
            lse = torch.full((case.num_heads,), -math.inf, dtype=torch.float64)
            visible = L - n + t + 1
            if visible > 0:
                Kt = K[:visible]
                s = bmm1_scale * q_rows[cum[b] + t] @ Kt.T  # [H, visible]
                e = torch.exp(s)
                denom = e.sum(-1)
                if sinks is not None:
                    denom = denom + torch.exp(sinks.double())
                o = bmm2_scale * (e / denom[:, None]) @ Kt[:, :D_V]
                lse = torch.log2(denom)
            outs.append(o)
            lses.append(lse)
    return torch.stack(outs).float(), torch.stack(lses).float()


def _flat(case, x):
    """Uniform [B, q_len, H, ...] -> [total_q, H, ...] (ragged is already flat)."""
    return x if case.ragged else x.reshape(-1, *x.shape[2:])


# ---- the math ---------------------------------------------------------------------------------


@pytest.mark.parametrize("with_sinks", [False, True])
def test_matches_dense_softmax(with_sinks):
    case = make_case(2, [1, 3], 3, 16, [5, 37], seed=1)
    sinks = case.sinks if with_sinks else None
    out, lse = case.reference(sinks=sinks, bmm2_scale=0.75)
    assert out.shape == (4, 3, D_V) and lse.shape == (4, 3)
    assert out.dtype == lse.dtype == torch.float32
    want_out, want_lse = _dense_by_hand(case, sinks=sinks, bmm2_scale=0.75)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_uniform_matches_dense_softmax():
    case = make_case(2, 3, 4, 16, [9, 40], seed=2)
    out, lse = case.reference()
    assert out.shape == (2, 3, 4, D_V) and lse.shape == (2, 3, 4)
    want_out, want_lse = _dense_by_hand(case)
    torch.testing.assert_close(_flat(case, out), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_flat(case, lse), want_lse, rtol=1e-5, atol=1e-5)


def test_sinks_rescale_denominator():
    # With a sink: p_j = exp(s_j) / (sum exp(s) + exp(sink)), lse = log2(sum exp(s) + exp(sink)).
    case = make_case(3, [2, 1, 4], 5, 16, [20, 33, 7], seed=3)
    out0, lse0 = case.reference()
    sum_exp = torch.exp2(lse0.double())  # sum_j exp(s_j)
    # Extreme sinks (+-100: exp overflows float32) need the max taken over the sink too.
    for values in ([-2.0, 0.0, 1.5, 3.0, 8.0], [-100.0, 0.0, 100.0, 3.0, 30.0]):
        sinks = torch.tensor(values)
        out1, lse1 = case.reference(sinks=sinks)
        assert torch.isfinite(out1).all() and torch.isfinite(lse1).all()
        with_sink = sum_exp + torch.exp(sinks.double())[None, :]
        torch.testing.assert_close(lse1.double(), torch.log2(with_sink), rtol=1e-6, atol=1e-5)
        factor = (sum_exp / with_sink).float()[..., None]
        torch.testing.assert_close(out1, out0 * factor, rtol=1e-5, atol=1e-6)
        assert (out1.abs().sum() < out0.abs().sum()).item()


def test_lse_is_log2_sum_exp_even_for_large_logits():
    # bmm1_scale = 1 makes logits ~ N(0, 24^2): exp() overflows float32 unless the max is removed.
    case = make_case(1, 2, 4, 64, 300, seed=4)
    out, lse = case.reference(bmm1_scale=1.0)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    want_out, want_lse = _dense_by_hand(case, bmm1_scale=1.0)  # float64: no overflow there
    torch.testing.assert_close(_flat(case, lse), want_lse, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(_flat(case, out), want_out, rtol=1e-4, atol=1e-4)


def test_ragged_equals_per_request_calls():
    case = make_case(4, [2, 0, 5, 1], 3, 16, [7, 3, 40, 1], seed=5)
    out, lse = case.reference(sinks=case.sinks)
    cum = case.cum_seq_lens_q.tolist()
    for b in range(case.batch):
        q_b = case.query[cum[b] : cum[b + 1]].unsqueeze(0)  # uniform [1, n, H, 576]
        o_b, l_b = mla_reference(
            q_b,
            case.kv_cache,
            case.block_tables[b : b + 1],
            case.seq_lens[b : b + 1],
            bmm1_scale=case.bmm1_scale,
            sinks=case.sinks,
        )
        assert o_b.shape == (1, case.q_lens[b], 3, D_V)
        torch.testing.assert_close(o_b[0], out[cum[b] : cum[b + 1]], rtol=0, atol=0)
        torch.testing.assert_close(l_b[0], lse[cum[b] : cum[b + 1]], rtol=0, atol=0)


def test_uniform_equals_ragged_layout():
    # make_case draws the same values for both layouts.
    uni = make_case(3, 4, 2, 32, [50, 4, 70], seed=6)
    rag = make_case(3, 4, 2, 32, [50, 4, 70], ragged=True, seed=6)
    assert rag.cum_seq_lens_q.tolist() == [0, 4, 8, 12]
    out_u, lse_u = uni.reference()
    out_r, lse_r = rag.reference()
    torch.testing.assert_close(out_u.reshape(out_r.shape), out_r, rtol=0, atol=0)
    torch.testing.assert_close(lse_u.reshape(lse_r.shape), lse_r, rtol=0, atol=0)


# ---- the causal rule --------------------------------------------------------------------------


def _bump_key(case, b, j):
    """A copy of the cache with KV row j of request b changed (K and V parts)."""
    cache = case.kv_cache.clone()
    view = cache.reshape(cache.shape[0], case.page_size, D_QK)
    page = int(case.block_tables[b, j // case.page_size])
    view[page, j % case.page_size] += 3.0
    return cache


@pytest.mark.parametrize("n, L", [(4, 20), (3, 3), (5, 33)])
def test_causal_edges(n, L):
    # Token t sees exactly keys 0 .. L-n+t: bumping key L-n+t+1 leaves it alone, key L-n+t not.
    case = make_case(1, n, 2, 16, L, seed=7, dtype=torch.float32)
    out, lse = case.reference()
    for t in range(n):
        last = L - n + t
        for j, changes in ((last, True), (last + 1, False)):
            if not 0 <= j < L:
                continue
            o2, l2 = mla_reference(
                case.query,
                _bump_key(case, 0, j),
                case.block_tables,
                case.seq_lens,
                bmm1_scale=case.bmm1_scale,
            )
            same = torch.equal(o2[0, t], out[0, t]) and torch.equal(l2[0, t], lse[0, t])
            assert same != changes, f"token {t}, key {j}: expected changed={changes}"
            # Tokens after t see key j too whenever t does.
            if changes:
                assert not torch.equal(o2[0, t:], out[0, t:])


def test_rows_with_no_visible_key():
    # Request 0: L = 0 (a padded CUDA-graph slot). Request 1: L = 2 < n = 4, so tokens 0 and 1
    # see no key (L-n+t < 0), token 2 sees 1 key, token 3 sees 2. Request 2: normal decode.
    case = make_case(3, [1, 4, 1], 3, 16, [0, 2, 9], seed=8)
    for sinks in (None, case.sinks):
        out, lse = case.reference(sinks=sinks)
        empty = torch.tensor([True, True, True, False, False, False])
        assert (out[empty] == 0).all()
        assert torch.isneginf(lse[empty]).all()
        assert torch.isfinite(out[~empty]).all() and torch.isfinite(lse[~empty]).all()
    # Token 2 of request 1 sees only key 0: its output is v_0 (no sink), its lse is s_0 / ln 2.
    out, lse = case.reference()
    page = int(case.block_tables[1, 0])
    k0 = case.kv_cache[page, 0].float()
    torch.testing.assert_close(out[3], k0[:D_V].expand(3, D_V), rtol=1e-6, atol=1e-6)
    s0 = case.bmm1_scale * case.query[3].float() @ k0
    torch.testing.assert_close(lse[3], s0 / math.log(2), rtol=1e-5, atol=1e-5)


def test_uniform_batch_with_zero_length_request():
    case = make_case(2, 1, 4, 64, [0, 100], seed=9)
    out, lse = case.reference(sinks=case.sinks)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all()


# ---- scales, layouts, poison ------------------------------------------------------------------


def test_tensor_and_float_scales_agree():
    case = make_case(2, 2, 3, 16, [17, 30], seed=10)
    out_f, lse_f = case.reference(bmm1_scale=0.0625, bmm2_scale=0.5)
    for shape in ((1,), ()):
        s1 = torch.tensor(0.0625, dtype=torch.float32).reshape(shape)
        s2 = torch.tensor(0.5, dtype=torch.float32).reshape(shape)
        out_t, lse_t = case.reference(bmm1_scale=s1, bmm2_scale=s2)
        torch.testing.assert_close(out_t, out_f, rtol=0, atol=0)
        torch.testing.assert_close(lse_t, lse_f, rtol=0, atol=0)
    # bmm2_scale only scales the output; bmm1_scale only the logits.
    out_1, lse_1 = case.reference(bmm1_scale=0.0625, bmm2_scale=1.0)
    torch.testing.assert_close(out_f, 0.5 * out_1, rtol=0, atol=0)
    torch.testing.assert_close(lse_f, lse_1, rtol=0, atol=0)


@pytest.mark.parametrize("cache_4d", [False, True])
@pytest.mark.parametrize("pool_padding", [0, 8])
def test_cache_layouts_agree(cache_4d, pool_padding):
    args = (3, [1, 3, 2], 4, 16, [5, 37, 64])
    base = make_case(*args, ragged=True, seed=11)
    case = make_case(*args, ragged=True, cache_4d=cache_4d, pool_padding=pool_padding, seed=11)
    assert case.kv_cache.dim() == (4 if cache_4d else 3)
    if pool_padding:
        assert case.kv_cache.stride(0) == (16 + pool_padding) * D_QK
        assert not case.kv_cache.is_contiguous()
        assert case.kv_cache.storage_offset() > 0
        assert case.pool.float().isnan().any()
    torch.testing.assert_close(
        case.kv_cache.reshape(base.kv_cache.shape), base.kv_cache, rtol=0, atol=0, equal_nan=True
    )
    want = base.reference(sinks=base.sinks)
    got = case.reference(sinks=case.sinks)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_nan_poison_never_reaches_output():
    case = make_case(4, [3, 1, 2, 5], 2, 16, [19, 1, 32, 40], pool_padding=8, seed=12)
    cache = case.kv_cache.float()
    # The data really is poisoned: page tails, spare pages, the unused table entries.
    assert cache.isnan().any()
    for b, L in enumerate(case.kv_lens):
        used = -(-L // 16)
        for page in case.block_tables[b, used:].tolist():
            assert cache[page].isnan().all()
        if L % 16:
            assert cache[int(case.block_tables[b, used - 1]), L % 16 :].isnan().all()
    out, lse = case.reference(sinks=case.sinks)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_float32_and_fp8_caches():
    # fp32 data of the same seed gives (nearly) the bf16 answer; an fp8 cache is upcast exactly.
    bf16 = make_case(2, 2, 2, 16, [10, 20], seed=13)
    fp32 = make_case(2, 2, 2, 16, [10, 20], dtype=torch.float32, seed=13)
    out_b, _ = bf16.reference()
    out_f, _ = fp32.reference()
    assert max_error(out_b, out_f) < 0.05
    fp8 = make_case(2, 2, 2, 16, [10, 20], dtype=torch.float8_e4m3fn, seed=13)
    assert fp8.query.dtype == torch.bfloat16
    out8, lse8 = fp8.reference()
    out_up, lse_up = mla_reference(
        fp8.query, fp8.kv_cache.float(), fp8.block_tables, fp8.seq_lens, bmm1_scale=SM_SCALE
    )
    torch.testing.assert_close(out8, out_up, rtol=0, atol=0)
    torch.testing.assert_close(lse8, lse_up, rtol=0, atol=0)


# ---- low precision (the FA3 baseline) ---------------------------------------------------------


def _low_precision_by_hand(case, round_p, bmm2_scale=1.0):
    """Per query row of a ragged page-16 case: P = exp(S - max) rounded by round_p, P @ V in fp32,
    normalized by the unrounded row sum, rounded to bf16."""
    rows = []
    for b, (n, L) in enumerate(zip(case.q_lens, case.kv_lens)):
        K = case.kv_cache[case.block_tables[b, : -(-L // 16)].long()].reshape(-1, D_QK)[:L].float()
        for t in range(n):
            Kt = K[: L - n + t + 1]
            S = case.bmm1_scale * case.query[len(rows)].float() @ Kt.T
            P = torch.exp(S - S.amax(-1, keepdim=True))
            O = (round_p(P) @ Kt[:, :D_V]) * (bmm2_scale / P.sum(-1, keepdim=True))
            rows.append(O.bfloat16().float())
    return torch.stack(rows)


def test_low_precision_is_the_bf16_computation():
    case = make_case(2, [1, 3], 3, 16, [5, 37], seed=14)
    ref, lse = case.reference(bmm2_scale=0.5)
    lowp, lse_lowp = case.reference(bmm2_scale=0.5, low_precision=True)
    assert torch.equal(lowp, lowp.bfloat16().float())  # output rounded to bf16
    torch.testing.assert_close(lse_lowp, lse, rtol=0, atol=0)  # lse stays fp32
    err = max_error(lowp, ref)
    assert 0 < err < 2e-2
    by_hand = _low_precision_by_hand(case, lambda p: p.bfloat16().float(), bmm2_scale=0.5)
    # Equal up to fp32 summation order, which may flip a rare bf16 rounding by one ulp.
    assert (lowp != by_hand).float().mean() < 0.01
    torch.testing.assert_close(lowp, by_hand, rtol=0, atol=1e-2)
    # Rounding P matters: it is not just the fp32 result rounded to bf16.
    assert (lowp != ref.bfloat16().float()).float().mean() > 0.05


def test_low_precision_with_e4m3_p():
    """p_dtype=float8_e4m3fn: P rounded to e4m3 as 2^8 P (the e4m3-query kernels' P), row sums and
    lse from unrounded P; coarser than bf16 P, and not the bf16 computation."""
    case = make_case(2, [1, 3], 3, 16, [5, 37], seed=14)
    ref, lse = case.reference()
    e4m3, lse_e4m3 = case.reference(low_precision=True, p_dtype=torch.float8_e4m3fn)
    bf16, _ = case.reference(low_precision=True)
    assert torch.equal(e4m3, e4m3.bfloat16().float())  # output rounded to bf16
    torch.testing.assert_close(lse_e4m3, lse, rtol=0, atol=0)
    assert max_error(bf16, ref) < max_error(e4m3, ref) < 0.1
    by_hand = _low_precision_by_hand(case, lambda p: (p * 256).to(torch.float8_e4m3fn).float() / 256)
    torch.testing.assert_close(e4m3, by_hand, rtol=0, atol=1e-2)


def test_chunked_queries_match_unchunked(monkeypatch):
    # A prefill chunk (n = 300 tokens, L = 400 keys) split into many token blocks.
    case = make_case(2, [300, 7], 2, 64, [400, 7], seed=15)
    want = case.reference(sinks=case.sinks)
    monkeypatch.setattr(reference, "_SCORE_BLOCK_ELEMS", 2 * 400 * 17)  # 17-token chunks
    got = case.reference(sinks=case.sinks)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_long_decode_stays_fast():
    # 32k keys, decode: O(L * H) work, a fraction of a second on a CPU.
    case = make_case(1, 1, 16, 64, 32768, seed=16)
    out, lse = case.reference()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


# ---- arguments --------------------------------------------------------------------------------


def test_argument_errors():
    case = make_case(2, [1, 2], 2, 16, [5, 9], seed=17)
    args = (case.query, case.kv_cache, case.block_tables, case.seq_lens)
    cum = case.cum_seq_lens_q
    with pytest.raises(ValueError, match="cum_seq_lens_q"):
        mla_reference(*args)  # ragged query needs cum_seq_lens_q
    with pytest.raises(ValueError, match=r"\[B\+1\] = \[3\]"):
        mla_reference(*args, cum_seq_lens_q=cum[:2])
    with pytest.raises(ValueError, match="non-decreasing"):
        mla_reference(*args, cum_seq_lens_q=torch.tensor([0, 4, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="576"):
        mla_reference(*args, cum_seq_lens_q=cum, kv_lora_rank=128)
    with pytest.raises(ValueError, match=r"\[num_pages, 1, page_size"):
        mla_reference(case.query, case.kv_cache.unsqueeze(1).expand(-1, 2, -1, -1), *args[2:],
                      cum_seq_lens_q=cum)
    with pytest.raises(ValueError, match="block_tables has only"):
        mla_reference(*args[:3], torch.tensor([5, 9000], dtype=torch.int32), cum_seq_lens_q=cum)
    with pytest.raises(ValueError, match="one-element"):
        mla_reference(*args, cum_seq_lens_q=cum, bmm1_scale=torch.ones(2))
    with pytest.raises(ValueError, match="sinks"):
        mla_reference(*args, cum_seq_lens_q=cum, sinks=torch.zeros(3))
    bad_tables = case.block_tables.clone()
    bad_tables[0, 0] = -1
    with pytest.raises(ValueError, match="must index pages"):
        mla_reference(*args[:2], bad_tables, case.seq_lens, cum_seq_lens_q=cum)


# ---- the comparison helpers -------------------------------------------------------------------


def test_assert_close_fa3():
    case = make_case(2, 2, 2, 16, [0, 30], seed=18)
    ref, lse = case.reference()
    lowp, _ = case.reference(low_precision=True)
    # The low-precision result passes against itself (error = 1x), and so does a bf16 copy.
    assert_close_fa3(lowp, ref, lowp)
    assert_close_fa3(ref.bfloat16(), ref, lowp)
    assert_close_fa3(lse, lse, lse, name="lse")  # -inf rows at the same places
    # An unwritten (NaN) row is caught, with its index.
    out = ref.bfloat16().clone()
    out[1, 1, 1, 7] = math.nan
    with pytest.raises(AssertionError, match=r"NaN positions differ.*\(1, 1, 1, 7\)"):
        assert_close_fa3(out, ref, lowp)
    # A -inf LSE row written as a finite number is caught.
    bad_lse = lse.clone()
    bad_lse[0, 0, 0] = 0.0
    with pytest.raises(AssertionError, match="-inf positions differ"):
        assert_close_fa3(bad_lse, lse, lse, name="lse")
    # A real error is caught and located.
    out = ref.clone()
    out[1, 0, 1, 3] += 1.0
    with pytest.raises(AssertionError, match=r"at \(1, 0, 1, 3\)"):
        assert_close_fa3(out, ref, lowp)
    assert poisoned_out((2, 3), "cpu").dtype == torch.bfloat16
    assert poisoned_out((2, 3), "cpu").isnan().all()
    assert poisoned_lse((2, 3), "cpu").dtype == torch.float32
    assert poisoned_lse((2, 3), "cpu").isnan().all()


@pytest.mark.requires_gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    args = (3, [2, 0, 5], 8, 64, [100, 3, 700])
    cpu = make_case(*args, pool_padding=8, seed=19)
    gpu = make_case(*args, pool_padding=8, seed=19, device="cuda")
    want = cpu.reference(sinks=cpu.sinks, bmm2_scale=0.5)
    got = gpu.reference(
        sinks=gpu.sinks, bmm2_scale=torch.tensor([0.5], device="cuda")
    )
    assert got[0].device.type == "cuda"
    torch.testing.assert_close((got[0].cpu(), got[1].cpu()), want, rtol=1e-5, atol=1e-5)


def test_lse_tolerance_grows_with_the_fp8_logits():
    # bf16 cache: the fixed bound; fp8: 2^-11 of the largest sum |q_i k_i| in log2 units, which
    # scales with the data (here K and V x 4, exact in e4m3 away from its range ends).
    bf16 = make_case(3, 2, 16, 16, [40, 1, 77], seed=2)
    assert lse_tolerance(bf16) == 0.02
    fp8 = make_case(3, 2, 16, 16, [40, 1, 77], dtype=torch.float8_e4m3fn, seed=2)
    base = lse_tolerance(fp8)
    fp8.kv_cache = (fp8.kv_cache.float() * 4).to(torch.float8_e4m3fn)
    assert lse_tolerance(fp8) == pytest.approx(max(0.02, 4 * base), rel=1e-5) and lse_tolerance(fp8) > 0.02
    assert lse_tolerance(fp8, fp8.bmm1_scale / 8) == pytest.approx(max(0.02, base / 2), rel=1e-5)

