"""The attention kernels against the float32 reference, on an sm_90a GPU.

Every case: fresh seeded random data, unused pages / page tails / pool padding NaN, outputs
NaN-poisoned before the call, tolerance by FlashAttention-3's rule (at most twice the error of the
same computation done by PyTorch in bf16, or 1e-2 relative).
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

import error_log
from mla_data import SM_SCALE, assert_close_fa3, make_case, poisoned_lse, poisoned_out
from test_guard_bands_gpu import check_case

pytestmark = pytest.mark.requires_sm90a

DEV = "cuda"


def _api():
    import jit_mla

    return jit_mla


def _kv_lens(rng: random.Random, q_lens: list[int], kind: str) -> list[int]:
    """seq_lens per request, each >= its query length: 1-token and non-page-multiple ones included."""
    if kind == "uniform":  # equal lengths: the plan's whole-group path (no split at all)
        return [max(max(q_lens), 1000)] * len(q_lens)
    hi = {"short": 300, "mixed": 4096, "long": 32768}[kind]
    lens = []
    for i, n in enumerate(q_lens):
        lo = max(n, 1)
        if i % 7 == 1:
            lens.append(lo)  # the shortest legal length (1 for decode)
        elif kind == "long" and i % 5 == 0:
            lens.append(rng.randint(hi // 2, hi))
        else:
            lens.append(rng.randint(lo, max(lo, hi)))
    return lens


def _run(case, *, sinks=False, tensor_scales=False, bmm2=1.0, max_seq_len=None, out=None, lse=None):
    api = _api()
    B, H = case.batch, case.num_heads
    total_q = case.query.shape[0] if case.ragged else B * case.query.shape[1]
    ws = torch.empty(api.get_workspace_size(B, H, total_q=total_q), dtype=torch.uint8, device=DEV)
    out = poisoned_out(case.query.shape[:-1] + (512,), DEV) if out is None else out
    lse = poisoned_lse(case.query.shape[:-1], DEV) if lse is None else lse
    s1, s2 = case.bmm1_scale, bmm2
    if tensor_scales:
        s1 = torch.tensor([s1], dtype=torch.float32, device=DEV)
        s2 = torch.tensor([s2], dtype=torch.float32, device=DEV)
    api.trtllm_batch_decode_with_kv_cache_mla(
        case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens,
        max(case.kv_lens) if max_seq_len is None else max_seq_len,
        out=out, bmm1_scale=s1, bmm2_scale=s2, sinks=case.sinks if sinks else None, lse=lse,
        cum_seq_lens_q=case.cum_seq_lens_q, max_q_len=case.max_q_len if case.ragged else None,
    )
    torch.cuda.synchronize()
    return out, lse


def _check(case, out, lse, *, sinks=False, bmm2=1.0, label="", p_dtype=torch.bfloat16):
    check_case(case, out, lse, bmm2=bmm2, sinks=sinks, label=label, p_dtype=p_dtype)


# (B, q_len, H, page, kv kind, ragged, extras)
MATRIX = [
    (1, 1, 16, 64, "short", False, {}),
    (1, 1, 128, 64, "long", False, {}),
    (1, 1, 16, 32, "long", False, {"sinks": True}),
    (3, 1, 3, 32, "mixed", False, {}),
    (3, 2, 128, 32, "mixed", False, {"cache_4d": True}),
    (3, 8, 64, 64, "mixed", False, {"sinks": True}),
    (3, 32, 16, 32, "mixed", False, {}),
    (64, 1, 16, 64, "mixed", False, {"tensor_scales": True}),
    (64, 1, 128, 64, "mixed", False, {}),
    (64, 2, 32, 32, "mixed", False, {"pool_padding": 8}),
    (64, 4, 16, 32, "mixed", False, {"bmm2": 0.5}),
    (64, 8, 3, 64, "short", False, {"sinks": True}),
    (257, 1, 32, 32, "mixed", False, {}),
    (257, 2, 64, 64, "short", False, {"cache_4d": True, "pool_padding": 8}),
    (257, 1, 128, 64, "short", False, {"sinks": True, "tensor_scales": True}),
    (257, 4, 16, 32, "short", False, {}),
    (1, 1, 64, 64, "long", False, {}),
    # ragged: random per-request lengths, zeros included
    (3, (0, 4), 128, 64, "mixed", True, {}),
    (3, (1, 8), 3, 32, "mixed", True, {"sinks": True}),
    (64, (0, 4), 16, 32, "mixed", True, {"tensor_scales": True}),
    (64, (1, 32), 32, 64, "short", True, {}),
    (257, (0, 8), 3, 64, "short", True, {"cache_4d": True}),
    (257, (0, 2), 128, 32, "short", True, {"pool_padding": 8}),
    (1, (5, 5), 64, 32, "long", True, {}),
    (64, (1, 4), 128, 64, "mixed", True, {"sinks": True}),
    # other page sizes: 8..256 take the TMA kernel, 1 and 24 the cp.async (any page size) one
    (16, 1, 16, 16, "mixed", False, {}),
    (16, 2, 128, 128, "mixed", False, {}),
    (16, (0, 4), 64, 16, "mixed", True, {}),
    (8, 1, 128, 8, "mixed", False, {}),
    (8, 2, 16, 1, "short", False, {}),
    (8, (0, 4), 128, 1, "short", True, {"sinks": True}),
    (8, 1, 64, 24, "mixed", False, {}),
    (4, 3, 128, 256, "mixed", False, {"pool_padding": 8}),
    # TMA pages that are not a power of two: page ids and rows by multiply-shift (fast_div.h)
    (8, (0, 4), 128, 192, "mixed", True, {}),
    (16, 2, 16, 192, "mixed", False, {}),
    (16, 1, 16, 192, "mixed", False, {}),  # narrow16
    (8, 1, 128, 192, "short", False, {}),  # the seesaw without its steady pair body (_short)
    # uniform lengths, more groups than CTA sets: whole groups per set, no split
    (257, 1, 32, 64, "uniform", False, {}),
    (130, 1, 128, 64, "uniform", False, {"sinks": True}),
    (300, 2, 16, 1, "uniform", False, {}),
]


@pytest.mark.parametrize("B,q_len,H,page,kind,ragged,extra", MATRIX)
def test_matrix(B, q_len, H, page, kind, ragged, extra):
    rng = random.Random(zlib.crc32(repr((B, q_len, H, page, kind, ragged)).encode()) & 0xFFFF)
    q_lens = [rng.randint(*q_len) for _ in range(B)] if ragged else [q_len] * B
    kv_lens = _kv_lens(rng, q_lens, kind)
    case = make_case(
        B, q_lens if ragged else q_len, H, page, kv_lens, ragged=ragged,
        cache_4d=extra.get("cache_4d", False), pool_padding=extra.get("pool_padding", 0),
        device=DEV, seed=rng.randint(0, 1 << 30),
    )
    sinks, bmm2 = extra.get("sinks", False), extra.get("bmm2", 1.0)
    out, lse = _run(case, sinks=sinks, tensor_scales=extra.get("tensor_scales", False), bmm2=bmm2)
    _check(case, out, lse, sinks=sinks, bmm2=bmm2, label=f"B{B} q{q_len} H{H} p{page} {kind} {extra}")


# fp8 e4m3 KV cache with a bf16 query: the narrow kernels (TMA page sizes, and others by
# cp.async); requests of more than 32 rows (H 64 / 128, MTP, ragged) on the wide kernel's 64-row
# units with TMA pages, else as 32-row units side by side. The kernel multiplies K in e4m3 against Q split into two e4m3 parts per row (exact for
# every bf16 element within ~2^13 of its row's largest), and V in e4m3 against P kept to bf16's
# precision as two e4m3 parts (hi + lo), so the reference on the upcast cache and the bf16
# tolerance hold as they are.
# (B, q_len or ragged (lo, hi), H, page, kv kind, extras)
FP8_MATRIX = [
    (1, 1, 16, 64, "long", {}),
    (64, 1, 16, 64, "mixed", {"tensor_scales": True}),
    (64, 2, 16, 32, "mixed", {"sinks": True}),
    (257, 1, 32, 16, "short", {"cache_4d": True, "pool_padding": 8}),
    (8, 1, 16, 8, "mixed", {"bmm2": 0.5}),
    (16, 2, 16, 128, "mixed", {}),
    (16, 2, 16, 192, "mixed", {}),  # TMA pages that are not a power of two (fast_div.h)
    (257, 1, 16, 64, "uniform", {}),
    (3, 8, 3, 32, "mixed", {"sinks": True}),
    # page sizes TMA does not fit: the cp.async twins (_fp8_any)
    (4, 1, 16, 1, "mixed", {}),
    (5, 2, 16, 3, "mixed", {"sinks": True}),
    (64, 1, 16, 24, "short", {"tensor_scales": True}),
    (3, 1, 32, 100, "long", {"cache_4d": True, "pool_padding": 8}),
    (300, 2, 16, 1, "uniform", {}),  # many units per CTA: the stages' parity across units
    # more than 32 rows per request: the wide kernels (64-row units) with TMA pages, else 32-row
    # units, 4 per token side by side at H 128
    (64, 1, 128, 64, "mixed", {}),
    (1, 1, 128, 64, "long", {"sinks": True}),
    (8, 2, 128, 32, "mixed", {"tensor_scales": True, "cache_4d": True}),
    (16, 1, 64, 1, "mixed", {"pool_padding": 8}),
    (64, 4, 16, 64, "mixed", {"bmm2": 0.5}),
    (3, 17, 3, 24, "mixed", {}),
    (130, 1, 128, 64, "uniform", {}),
    (8, 1, 128, 192, "mixed", {}),  # the wide kernel on TMA pages of 192 tokens
    # ragged (zero-length requests included)
    (64, (0, 4), 16, 64, "mixed", {"tensor_scales": True}),
    (64, (0, 2), 16, 64, "mixed", {"sinks": True}),
    (16, (1, 4), 128, 32, "mixed", {"sinks": True}),
    (8, (0, 3), 128, 1, "short", {}),
    (257, (0, 8), 3, 16, "short", {"cache_4d": True}),
]


# q8: the query in e4m3 too (mode 2, the _fp8q kernels): QK^T on the bytes as they are, P rounded
# to e4m3 (as 2^8 P) for PV. The reference on the upcast query and cache; the tolerance is
# FlashAttention-3's rule against the same computation in PyTorch with P rounded the same way
# (p_dtype=e4m3: twice that computation's error).
@pytest.mark.parametrize("q8", [False, True], ids=["q-bf16", "q-e4m3"])
@pytest.mark.parametrize("B,q_len,H,page,kind,extra", FP8_MATRIX)
def test_fp8_kv_cache(B, q_len, H, page, kind, extra, q8):
    rng = random.Random(zlib.crc32(repr(("fp8", B, q_len, H, page, kind)).encode()) & 0xFFFF)
    ragged = isinstance(q_len, tuple)
    q_lens = [rng.randint(*q_len) for _ in range(B)] if ragged else [q_len] * B
    kv_lens = _kv_lens(rng, q_lens, kind)
    q_dtype = torch.float8_e4m3fn if q8 else torch.bfloat16
    case = make_case(
        B, q_lens if ragged else q_len, H, page, kv_lens, ragged=ragged, dtype=torch.float8_e4m3fn,
        q_dtype=q_dtype, cache_4d=extra.get("cache_4d", False), pool_padding=extra.get("pool_padding", 0),
        device=DEV, seed=rng.randint(0, 1 << 30),
    )
    assert case.kv_cache.dtype == torch.float8_e4m3fn and case.query.dtype == q_dtype
    sinks, bmm2 = extra.get("sinks", False), extra.get("bmm2", 1.0)
    out, lse = _run(case, sinks=sinks, tensor_scales=extra.get("tensor_scales", False), bmm2=bmm2)
    _check(case, out, lse, sinks=sinks, bmm2=bmm2, label=f"fp8 B{B} q{q_len} H{H} p{page} {kind} {extra} q8={q8}",
           p_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16)


def _scale_pages(case, seed: int) -> None:
    """Each page of case.kv_cache times its own factor in [0.3, 3], in the cache's dtype (NaN
    stays NaN): the max-moves-late cases below."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    factor = torch.empty(case.kv_cache.shape[0]).uniform_(0.3, 3.0, generator=gen).to(DEV)
    case.kv_cache = (case.kv_cache.float() * factor[:, None, None]).to(case.kv_cache.dtype)


# The running max moving late in the KV, many times: each page's K and V scaled by its own factor
# in [0.3, 3] (logits up to ~3x), pages in random order, so blocks far into a request raise a
# row's max by several log2 units, past the kernels' lazy threshold, and O (and the sums) are
# rescaled mid-way (random N(0, 1) data alone moves it mostly in the first blocks). Both query
# types; H 128 and MTP 2 at H 64 take the wide kernel with an e4m3 query. The LSE bound scales
# with the logits here (mla_data.lse_tolerance: fp8 wgmma accumulation).
@pytest.mark.parametrize("q8", [False, True], ids=["q-bf16", "q-e4m3"])
@pytest.mark.parametrize("B,q_len,H,page,kv_lens", [
    (4, 1, 128, 64, [3000, 700, 65, 4097]),
    (3, 2, 64, 32, [2000, 129, 5000]),
])
def test_fp8_max_moves_late(B, q_len, H, page, kv_lens, q8):
    case = make_case(B, q_len, H, page, kv_lens, dtype=torch.float8_e4m3fn,
                     q_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16, device=DEV, seed=29 + H)
    _scale_pages(case, seed=31)
    out, lse = _run(case)
    _check(case, out, lse, label=f"fp8 max moves late B{B} q{q_len} H{H} q8={q8}",
           p_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16)


# The same for a bf16 cache: the seesaw kernel (H 128; MTP 2 at H 64, ragged included) rescales O
# and its warpgroups' P hand-off when a late block moves a row's max, the narrow kernels (H 16,
# MTP 2 at H 16) their O^T; pages of 8 and 32 put several TMA boxes on one block.
@pytest.mark.parametrize("B,q_len,H,page,kv_lens", [
    (4, 1, 128, 64, [3000, 700, 65, 4097]),
    (3, 2, 64, 32, [2000, 129, 5000]),
    (3, [1, 4, 3], 128, 64, [2500, 300, 4100]),
    (4, 1, 16, 64, [3000, 700, 65, 4097]),
    (3, 2, 16, 8, [2000, 129, 1500]),
])
def test_bf16_max_moves_late(B, q_len, H, page, kv_lens):
    case = make_case(B, q_len, H, page, kv_lens, ragged=isinstance(q_len, list), device=DEV, seed=37 + H)
    _scale_pages(case, seed=41)
    out, lse = _run(case)
    _check(case, out, lse, label=f"bf16 max moves late B{B} q{q_len} H{H} p{page}")


# Long PV chains in fp8: Hopper's fp8 wgmma accumulates with ~14 bits (DeepSeek-V3), so the fp8
# kernels promote O^T to fp32 in the unit's partial slot every kPromoteBlocks (64) blocks of one
# accumulator (attention_narrow_fp8.cuh). The launcher is given few SMs so that units run long
# chains in one CTA. For the wide kernel (e4m3 query, H 128: one group of two 64-row units per
# request, CTA pairs; the plan as the CPU model of session 12's review gives it): 2 SMs, one set
# running both requests whole (an inner unit promoting into the set's end slot, then the last);
# 4 SMs on [8193, 30000, 12000], an inner unit of 129 blocks (= 1 mod 64), a unit split at the
# end (263 blocks, 4 promotions, end slot), one split at the start (206 blocks, own slot) and an
# unsplit one; 6 SMs on one 60000-token request, the middle set's piece split at both ends. The
# narrow kernels (bf16 query; H 16) get other plans from the same inputs, with splits at 2-3 SMs.
# Without the promotion the wide kernel's error at 2 SMs was 3.4x PyTorch's (session 12).
@pytest.mark.parametrize("q8", [False, True], ids=["q-bf16", "q-e4m3"])
@pytest.mark.parametrize("H,sms,kv_lens", [
    (128, 2, [32768, 32000]),
    (16, 2, [32768, 32000]),
    (128, 4, [20000, 9000, 30001]),
    (16, 3, [20000, 9000, 30001]),
    (128, 4, [8193, 30000, 12000]),
    (128, 6, [60000]),
])
def test_fp8_long_pv_chain(H, sms, kv_lens, q8, monkeypatch):
    import jit_mla.api as api

    case = make_case(len(kv_lens), 1, H, 64, kv_lens, dtype=torch.float8_e4m3fn,
                     q_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16, device=DEV, seed=41 + sms)
    monkeypatch.setitem(api._sm_counts, torch.device(DEV).index or 0, sms)
    out, lse = _run(case)
    _check(case, out, lse, label=f"fp8 long PV chain H{H} {sms} SMs q8={q8}",
           p_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16)


# The merge with several whole rows per warp and few splits: merge_rows merges up to 4 of a
# warp's rows of a unit together (their copies in flight at once). At 3-5 SMs (24-40 warps) the
# split units' rows go 3-6 to a warp, so batches end inside units, at a unit's end and at a
# partial unit (H 16, q_len 3: units of 32 and 16 rows); sinks and the LSE go through its
# per-row finalize. Every kernel family that splits: seesaw, wide (e4m3 query), narrow.
@pytest.mark.parametrize("dtype,q8", [(torch.bfloat16, False), (torch.float8_e4m3fn, False),
                                      (torch.float8_e4m3fn, True)], ids=["bf16", "fp8", "fp8q"])
@pytest.mark.parametrize("q_lens,H,sms", [
    (1, 128, 4),
    (2, 64, 5),
    ([3, 1, 4, 2], 16, 3),
    ([2, 1, 3, 2], 128, 5),
])
def test_merge_rows_together(q_lens, H, sms, dtype, q8, monkeypatch):
    import jit_mla.api as api

    case = make_case(4, q_lens, H, 64, [3000, 700, 2500, 1200], dtype=dtype,
                     q_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16, device=DEV, seed=53 + sms)
    monkeypatch.setitem(api._sm_counts, torch.device(DEV).index or 0, sms)
    out, lse = _run(case, sinks=True)
    _check(case, out, lse, sinks=True, label=f"merge rows H{H} {sms} SMs {dtype} q8={q8}",
           p_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16)


# Query rows far outside e4m3's (and f16's) range (|q| up to ~2^19, or ~2^-18), bmm1_scale scaled
# back by the same power of 2, so the logits are those of N(0, 1) data: a kernel that put Q in
# e4m3 without its per-row exponent would saturate, or lose the small rows' digits. H 16: the
# narrow kernel; H 128: the wide one (64-row units).
@pytest.mark.parametrize("H", [16, 128])
@pytest.mark.parametrize("q_scale", [2.0**17, 2.0**-20])
def test_fp8_query_rows_outside_e4m3_range(q_scale, H):
    case = make_case(8, 1, H, 64, [1000, 77, 64, 4096, 1, 300, 2048, 513], dtype=torch.float8_e4m3fn,
                     device=DEV, seed=11)
    case.query = (case.query.float() * q_scale).to(torch.bfloat16)  # exact: a power of 2
    case.bmm1_scale = SM_SCALE / q_scale
    out, lse = _run(case)
    _check(case, out, lse, label=f"fp8 q x {q_scale:g}")


# A query row holding inf: the fp8 kernel stores Q as e4m3, which saturates inf, so it makes that
# row's scores NaN instead (as the reference's row is); every other row is untouched.
@pytest.mark.parametrize("H", [16, 128])
def test_fp8_query_row_with_inf_is_nan(H):
    case = make_case(4, 1, H, 64, [1000, 300, 77, 2048], dtype=torch.float8_e4m3fn, device=DEV, seed=23)
    ref, _ = case.reference()
    ref_lowp, _ = case.reference(low_precision=True)
    case.query[2, 0, 5, 100] = float("inf")
    out, _ = _run(case)
    assert bool(out[2, 0, 5].isnan().all()), "the row with inf in q is not NaN"
    keep = torch.ones(out.shape[:-1], dtype=torch.bool, device=DEV)
    keep[2, 0, 5] = False
    assert_close_fa3(out[keep].float(), ref[keep], ref_lowp[keep], name="rows without inf")


# A zero or negative bmm1_scale (a device tensor's value is not checked on the host): the kernels
# keep S unscaled and apply a positive scale in P's FFMA (the max of the scaled scores is the
# scaled max only then), so these take their other path, S scaled first. Every kernel family:
# seesaw (H 128), narrow16/32, any page size, and the fp8 ones (narrow, wide with an e4m3 query).
@pytest.mark.parametrize("scale", [-SM_SCALE, 0.0], ids=["negative", "zero"])
@pytest.mark.parametrize("q_len,H,page,dtype,q8", [
    (1, 128, 64, torch.bfloat16, False),
    (1, 16, 64, torch.bfloat16, False),
    (2, 16, 32, torch.bfloat16, False),
    (1, 16, 1, torch.bfloat16, False),
    (1, 128, 64, torch.float8_e4m3fn, False),
    (1, 16, 64, torch.float8_e4m3fn, False),
    (1, 16, 1, torch.float8_e4m3fn, False),
    (1, 128, 64, torch.float8_e4m3fn, True),
    (2, 16, 64, torch.float8_e4m3fn, True),
])
def test_non_positive_bmm1_scale(q_len, H, page, dtype, q8, scale):
    case = make_case(4, q_len, H, page, [3000, 65, 700, 1], dtype=dtype,
                     q_dtype=torch.float8_e4m3fn if q8 else torch.bfloat16, device=DEV, seed=37 + H)
    case.bmm1_scale = scale
    p_dtype = torch.float8_e4m3fn if q8 else torch.bfloat16
    for tensor_scales in (False, True):
        out, lse = _run(case, tensor_scales=tensor_scales)
        _check(case, out, lse, label=f"bmm1_scale {scale:g} q{q_len} H{H} p{page} {dtype} q8={q8} "
               f"tensor={tensor_scales}", p_dtype=p_dtype)


# A non-finite query row that sees no key (MTP: q_len 2 on a 1-token request, its first token):
# zero and -inf LSE as any row without keys, not NaN. The bf16-query fp8 kernels keep a per-row
# score scale (NaN for such a row); its masked scores must still give P = 0. H 16: 32 rows per
# request, the narrow kernel; H 32: 64 rows, the wide one.
@pytest.mark.parametrize("H", [16, 32])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_fp8_non_finite_query_row_without_keys_is_zero(value, H):
    case = make_case(3, 2, H, 64, [1, 500, 64], dtype=torch.float8_e4m3fn, device=DEV, seed=43)
    case.query[0, 0, 5, 100] = value
    out, lse = _run(case)
    assert bool((out[0, 0, 5] == 0).all()), "the row without keys is not zero"
    assert float(lse[0, 0, 5]) == float("-inf"), f"its lse is {float(lse[0, 0, 5])}, not -inf"
    ref, _ = case.reference()
    ref_lowp, _ = case.reference(low_precision=True)
    keep = torch.ones(out.shape[:-1], dtype=torch.bool, device=DEV)
    keep[0, 0, 5] = False
    assert_close_fa3(out[keep].float(), ref[keep], ref_lowp[keep], name="the other rows")


# max_q_len only picks the kernel: a hint below the longest request (16-row units for requests
# of up to 64 rows) still gives every row, for bf16 (narrow16) and fp8.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_ragged_max_q_len_below_the_longest_request(dtype):
    q_lens = [4, 1, 0, 3, 4, 2, 1, 4]
    case = make_case(8, q_lens, 16, 64, [4000, 77, 5, 300, 4, 2048, 1, 999], ragged=True, dtype=dtype,
                     device=DEV, seed=17)
    case.max_q_len = 1
    out, lse = _run(case, sinks=True)
    _check(case, out, lse, sinks=True, label=f"max_q_len 1 < 4 {dtype}")


def test_tensor_and_float_scales_match_bitwise():
    case = make_case(8, 2, 128, 64, [100, 4000, 1, 77, 2048, 640, 3, 999], device=DEV, seed=3)
    a, la = _run(case, bmm2=0.75)
    b, lb = _run(case, tensor_scales=True, bmm2=0.75)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_deterministic_and_independent_of_max_seq_len():
    case = make_case(5, 1, 16, 32, [5000, 1, 300, 4096, 70], device=DEV, seed=4)
    a, la = _run(case, max_seq_len=5000)
    b, lb = _run(case, max_seq_len=1 << 20)
    c, lc = _run(case, max_seq_len=1)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(la, lb) and torch.equal(la, lc)


def test_zero_length_requests_write_zero_and_minus_inf():
    # A padded CUDA-graph batch: some requests have seq_lens 0 (and q_len 1): no visible key.
    case = make_case(6, 1, 16, 64, [0, 100, 0, 1, 0, 64], device=DEV, seed=5)
    out, lse = _run(case)
    dead = case.seq_lens == 0
    assert torch.all(out[dead] == 0) and torch.all(lse[dead] == float("-inf"))
    _check(case, out, lse, label="zero-length")


def test_cuda_graph_replay_reads_new_scales_and_lengths():
    api = _api()
    case = make_case(16, 1, 128, 64, 1024, device=DEV, seed=6)
    ws = torch.empty(api.get_workspace_size(16, 128), dtype=torch.uint8, device=DEV)
    s1 = torch.tensor([case.bmm1_scale], dtype=torch.float32, device=DEV)
    s2 = torch.tensor([1.0], dtype=torch.float32, device=DEV)
    out = poisoned_out(case.query.shape[:-1] + (512,), DEV)
    lse = poisoned_lse(case.query.shape[:-1], DEV)

    def step():
        api.trtllm_batch_decode_with_kv_cache_mla(
            case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 1024,
            out=out, bmm1_scale=s1, bmm2_scale=s2, lse=lse)

    step()  # warm-up outside capture (JIT, cubin load)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)

    new_lens = [1024 - 37 * i for i in range(16)]
    case.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    case.kv_lens = new_lens
    s1.fill_(case.bmm1_scale * 1.7)
    s2.fill_(0.5)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    case.bmm1_scale = case.bmm1_scale * 1.7
    _check(case, out, lse, bmm2=0.5, label="graph replay")


def test_prefill_sized_ragged_call():
    # Chunked prefill: 4 requests x 2048 query tokens on 8192 KV tokens, H = 128.
    case = make_case(4, [2048] * 4, 128, 64, [8192] * 4, ragged=True, device=DEV, seed=7)
    out, lse = _run(case)
    _check(case, out, lse, label="prefill 4x2048")


def test_batch_above_65535():
    # B = 70000 decode requests (FlashInfer's #3125 skipped attention here). Data built on the
    # GPU; the reference checks a sample of requests, and every row must be written.
    api = _api()
    B, H, page = 70000, 16, 16
    g = torch.Generator(device=DEV).manual_seed(8)
    kv_lens = torch.randint(1, 2 * page + 1, (B,), generator=g, device=DEV, dtype=torch.int32)
    kv_lens[0] = 2 * page
    pages_per = 2
    kv = torch.randn(B * pages_per + 1, page, 576, generator=g, device=DEV).to(torch.bfloat16)
    perm = torch.randperm(B * pages_per, generator=g, device=DEV).to(torch.int32)
    bt = perm.view(B, pages_per).contiguous()
    q = torch.randn(B, 1, H, 576, generator=g, device=DEV).to(torch.bfloat16)
    ws = torch.empty(api.get_workspace_size(B, H), dtype=torch.uint8, device=DEV)
    out = poisoned_out((B, 1, H, 512), DEV)
    lse = poisoned_lse((B, 1, H), DEV)
    api.trtllm_batch_decode_with_kv_cache_mla(
        q, kv, ws, 128, 512, 64, bt, kv_lens, 2 * page, out=out, bmm1_scale=SM_SCALE, lse=lse)
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    from jit_mla.reference import mla_reference

    idx = torch.cat([torch.arange(0, 64), torch.arange(65535 - 32, 65535 + 32), torch.arange(B - 64, B)]).to(DEV)
    ref, ref_lse = mla_reference(q[idx], kv, bt[idx], kv_lens[idx], bmm1_scale=SM_SCALE)
    ref_lowp, _ = mla_reference(q[idx], kv, bt[idx], kv_lens[idx], bmm1_scale=SM_SCALE, low_precision=True)
    stats = assert_close_fa3(out[idx].float(), ref, ref_lowp, name="B=70000")
    error_log.record("B=70000", stats, float((lse[idx] - ref_lse).abs().max()))


def test_workspace_too_small_names_the_size():
    api = _api()
    case = make_case(4, 1, 16, 64, 100, device=DEV, seed=9)
    need = api.get_workspace_size(4, 16)
    ws = torch.empty(need - 1024, dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match=rf"needs {need} bytes"):
        api.trtllm_batch_decode_with_kv_cache_mla(
            case.query, case.kv_cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 100)
    # The process goes on: the next good call is correct.
    out, lse = _run(case)
    _check(case, out, lse, label="after error")
