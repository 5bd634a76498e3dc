"""Test data and comparison helpers shared by the CPU and GPU tests (pure torch, any device).

Data are seeded random normals, never zeros. Everything a correct kernel must not read is NaN:
unused pages, page tails past ``seq_lens``, the pages that unused block-table entries point at,
and the padding of the pool that ``kv_cache`` is a strided view of. Outputs start as NaN too
(``poisoned_out``/``poisoned_lse``), so an unwritten row fails the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
D_QK = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: K is the whole cache row
D_V = KV_LORA_RANK  # 512: V is its first 512 columns
# DeepSeek's softmax scale: the pre-absorption head dim (128 nope + 64 rope), not 576.
SM_SCALE = 1.0 / math.sqrt(128 + QK_ROPE_HEAD_DIM)

IntOrList = Union[int, Sequence[int]]


@dataclass
class MLACase:
    """One batch of MLA inputs. Index tensors live on the case's device."""

    query: torch.Tensor  # [B, q_len, H, 576] (uniform) or [total_q, H, 576] (ragged)
    kv_cache: torch.Tensor  # [num_pages, page_size, 576] or [num_pages, 1, page_size, 576]
    block_tables: torch.Tensor  # int32 [B, max_pages]
    seq_lens: torch.Tensor  # int32 [B]
    cum_seq_lens_q: Optional[torch.Tensor]  # int32 [B+1] (ragged) or None (uniform)
    max_q_len: int
    q_lens: list[int]
    kv_lens: list[int]
    num_heads: int
    page_size: int
    pool: torch.Tensor  # the storage kv_cache views (== kv_cache when pool_padding = 0)
    sinks: torch.Tensor  # float32 [H], seeded N(0, 1); pass it only when testing sinks
    bmm1_scale: float = SM_SCALE  # a sensible default for N(0, 1) data; the caller may override

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def ragged(self) -> bool:
        return self.cum_seq_lens_q is not None

    def reference(self, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """``mla_reference`` on this case; keywords (bmm1_scale, sinks, ...) are passed through."""
        from jit_mla.reference import mla_reference

        kwargs.setdefault("bmm1_scale", self.bmm1_scale)
        return mla_reference(
            self.query,
            self.kv_cache,
            self.block_tables,
            self.seq_lens,
            cum_seq_lens_q=self.cum_seq_lens_q,
            **kwargs,
        )


def make_case(
    batch: int,
    q_lens: IntOrList,
    num_heads: int,
    page_size: int,
    kv_lens: IntOrList,
    *,
    ragged: bool = False,
    cache_4d: bool = False,
    pool_padding: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    q_dtype: Optional[torch.dtype] = None,
    device: Union[str, torch.device] = "cpu",
    seed: int = 0,
) -> MLACase:
    """Random MLA inputs with everything out of bounds set to NaN.

    Args:
        batch: number of requests B.
        q_lens: query tokens per request: an int (uniform layout unless ``ragged``) or a list of
            B ints (ragged layout; zeros allowed).
        num_heads: H.
        page_size: tokens per KV page.
        kv_lens: ``seq_lens`` per request (includes this step's tokens): an int or a list of B.
        ragged: use the ragged layout even when ``q_lens`` is an int.
        cache_4d: ``kv_cache`` as ``[num_pages, 1, page_size, 576]``.
        pool_padding: when > 0, ``kv_cache`` is a strided view ``pool[P:P+num_pages, :page_size]``
            of a NaN-filled pool with ``P = pool_padding`` extra pages before and after and
            ``pool_padding`` extra rows per page; so ``stride(0) = (page_size + P) * 576`` and the
            view's ``data_ptr`` is offset, while rows stay contiguous (``stride(-2) = 576``) as the
            contract allows. A multiple of 8 keeps bf16 page starts 16-byte aligned (TMA).
        dtype: KV cache dtype (bf16, fp16, fp32, fp8 e4m3).
        q_dtype: query dtype; defaults to ``dtype``, or bf16 when ``dtype`` is an fp8 type.
        device: where the tensors go (data are drawn on the CPU first, so a seed gives the same
            values on every device and in every cache layout).
        seed: the random seed.

    Pages are assigned in a random order. Entries of ``block_tables`` past a request's last page
    point at spare pages that are all NaN (valid indices, so an over-read gives NaN, not a fault).
    Values are N(0, 1): with ``bmm1_scale = 1/sqrt(192)`` (``case.bmm1_scale``) the logits have a
    standard deviation of about 1.7, so the softmax is neither flat nor one-hot.
    """
    kv_list = _per_request(kv_lens, batch, "kv_lens")
    uniform = isinstance(q_lens, int) and not ragged
    q_list = _per_request(q_lens, batch, "q_lens")
    if any(x < 0 for x in kv_list) or any(x < 0 for x in q_list):
        raise ValueError(f"lengths must be >= 0, got q_lens={q_list}, kv_lens={kv_list}")
    if q_dtype is None:
        q_dtype = torch.bfloat16 if dtype.itemsize == 1 else dtype

    gen = torch.Generator(device="cpu").manual_seed(seed)

    # ---- pages: a random permutation, plus spare NaN pages for the unused table entries ----------
    pages_per_req = [-(-L // page_size) for L in kv_list]
    used = sum(pages_per_req)
    num_spare = 2
    num_pages = used + num_spare
    perm = torch.randperm(num_pages, generator=gen)
    spare = perm[used:]  # all-NaN pages
    # One slack column so every row has at least one unused entry (engines size tables for the
    # longest possible sequence, not this batch).
    max_pages = max(pages_per_req, default=0) + 1
    block_tables = spare[torch.randint(0, num_spare, (batch, max_pages), generator=gen)]
    start = 0
    for b, np_b in enumerate(pages_per_req):
        block_tables[b, :np_b] = perm[start : start + np_b]
        start += np_b
    block_tables = block_tables.to(torch.int32)

    # ---- cache values: [num_pages, page_size, 576] fp32, NaN wherever no valid token lives ------
    values = torch.full((num_pages, page_size, D_QK), math.nan)
    for b, L in enumerate(kv_list):
        if L == 0:
            continue
        rows = torch.randn(pages_per_req[b] * page_size, D_QK, generator=gen)
        rows[L:] = math.nan  # the tail of the last page
        values[block_tables[b, : pages_per_req[b]].long()] = rows.view(-1, page_size, D_QK)

    pad = pool_padding
    pool = torch.full((num_pages + 2 * pad, page_size + pad, D_QK), math.nan)
    pool[pad : pad + num_pages, :page_size] = values
    pool = pool.to(dtype)
    if cache_4d:
        pool = pool.unsqueeze(1)  # [pages, 1, page_size + pad, 576]
    pool = pool.to(device)
    if cache_4d:
        kv_cache = pool[pad : pad + num_pages, :, :page_size]
    else:
        kv_cache = pool[pad : pad + num_pages, :page_size]

    # ---- queries -------------------------------------------------------------------------------
    total_q = sum(q_list)
    q = torch.randn(total_q, num_heads, D_QK, generator=gen)
    if uniform:
        query = q.view(batch, q_list[0] if batch else int(q_lens), num_heads, D_QK)
        cum = None
    else:
        query = q
        cum = torch.tensor([0] + q_list, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    query = query.to(q_dtype).to(device)

    sinks = torch.randn(num_heads, generator=gen).to(device)

    return MLACase(
        query=query,
        kv_cache=kv_cache,
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(kv_list, dtype=torch.int32, device=device),
        cum_seq_lens_q=cum,
        max_q_len=max(q_list, default=0),
        q_lens=q_list,
        kv_lens=kv_list,
        num_heads=num_heads,
        page_size=page_size,
        pool=pool,
        sinks=sinks,
    )


def poisoned_out(shape, device="cpu", dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An output buffer full of NaN (bf16 by default): an unwritten element fails the check."""
    return torch.full(tuple(shape), math.nan, dtype=dtype, device=device)


def poisoned_lse(shape, device="cpu") -> torch.Tensor:
    """A float32 LSE buffer full of NaN."""
    return torch.full(tuple(shape), math.nan, dtype=torch.float32, device=device)


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| over the elements finite in both (0.0 when there are none)."""
    out, ref = _as_f32(out, ref.device), _as_f32(ref, ref.device)
    both = torch.isfinite(out) & torch.isfinite(ref)
    if not bool(both.any()):
        return 0.0
    return float((out - ref).abs()[both].max())


def assert_close_fa3(
    out: torch.Tensor,
    ref: torch.Tensor,
    ref_lowp: Optional[torch.Tensor],
    *,
    name: str = "out",
    min_tol: float = 1e-5,
    rel_floor: float = 1e-3,
    rel_tol: float = 1e-2,
) -> dict:
    """FlashAttention-3's rule: the kernel's error is at most twice that of PyTorch in low precision.

    ``out`` is the kernel's result, ``ref`` the float32 reference, ``ref_lowp`` the reference with
    ``low_precision=True`` (or None: then only the floor applies). Checks, in order:

    1. NaN, +inf and -inf sit at the same positions in ``out`` and ``ref`` (first offender named);
    2. on the finite elements, ``max|out - ref| <= 2 * max|ref_lowp - ref| + floor`` with
       ``floor = max(min_tol, rel_floor * max|ref|)``, or else the relative error
       ``||out - ref|| / ||ref|| <= rel_tol``.

    Returns the measured errors (a dict) so a test can print them.
    """
    device = ref.device
    out32, ref32 = _as_f32(out, device), _as_f32(ref, device)
    if out32.shape != ref32.shape:
        raise AssertionError(f"{name}: shape {list(out32.shape)} != reference {list(ref32.shape)}")

    for what, pred in (
        ("NaN", torch.isnan),
        ("+inf", lambda x: torch.isinf(x) & (x > 0)),
        ("-inf", lambda x: torch.isinf(x) & (x < 0)),
    ):
        mismatch = pred(out32) != pred(ref32)
        if bool(mismatch.any()):
            idx = _first_index(mismatch)
            raise AssertionError(
                f"{name}: {what} positions differ ({int(mismatch.sum())} elements); first at "
                f"{idx}: {name}={out32[idx].item()!r}, ref={ref32[idx].item()!r}"
            )

    finite = torch.isfinite(ref32)
    if not bool(finite.any()):
        return {"max_err": 0.0, "lowp_err": 0.0, "tol": 0.0, "rel_err": 0.0}
    diff = torch.where(finite, (out32 - ref32).abs(), torch.zeros_like(ref32))
    ref_f = torch.where(finite, ref32, torch.zeros_like(ref32))
    max_err = float(diff.max())
    ref_max = float(ref_f.abs().max())
    lowp_err = 0.0
    if ref_lowp is not None:
        lowp32 = _as_f32(ref_lowp, device)
        lowp_err = float(torch.where(finite, (lowp32 - ref32).abs(), torch.zeros_like(ref32)).max())
    tol = 2.0 * lowp_err + max(min_tol, rel_floor * ref_max)
    ref_norm = float(ref_f.double().norm())
    rel_err = float(diff.double().norm()) / ref_norm if ref_norm > 0 else max_err
    errors = {"max_err": max_err, "lowp_err": lowp_err, "tol": tol, "rel_err": rel_err}

    if max_err > tol and rel_err > rel_tol:
        idx = _first_index(diff == diff.max())
        lowp_val = "n/a" if ref_lowp is None else repr(_as_f32(ref_lowp, device)[idx].item())
        raise AssertionError(
            f"{name}: max |err| = {max_err:.3e} at {idx} > tol {tol:.3e} "
            f"(= 2 * lowp err {lowp_err:.3e} + floor), and rel err {rel_err:.3e} > {rel_tol:.0e}; "
            f"{name}={out32[idx].item()!r}, ref={ref32[idx].item()!r}, ref_lowp={lowp_val}"
        )
    return errors


def _per_request(x: IntOrList, batch: int, name: str) -> list[int]:
    if isinstance(x, int):
        return [x] * batch
    x = [int(v) for v in x]
    if len(x) != batch:
        raise ValueError(f"{name} must have batch = {batch} entries, got {len(x)}")
    return x


def _as_f32(x: torch.Tensor, device) -> torch.Tensor:
    return x.detach().to(device=device, dtype=torch.float32)


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


# Hopper's fp8 wgmma accumulates with reduced precision (about 14 significant bits, DeepSeek-V3's
# report), so a score's error grows with sum_i |q_i k_i|, not with the score. The LSE moves by at
# most its largest score error (its derivative in each score is a softmax weight), so with an fp8
# cache its bound is 2^-11 (a 4x margin on 2^-13) of that sum in log2 units, or 0.02, the bf16
# bound, whichever is larger. Measured: 0.023 at 2^-11.8 of the sum (fuzz, bmm1_scale x 1.7), 0.031
# at 2^-12.2 (logits x 3).
LSE_TOL = 2e-2
FP8_ACCUM_REL = 2.0**-11


def lse_tolerance(case: MLACase, bmm1_scale: Optional[float] = None) -> float:
    """The LSE bound of a case: LSE_TOL, or for an fp8 cache FP8_ACCUM_REL of the largest
    sum_i |q_i k_i| * bmm1_scale * log2(e) over its rows and visible keys, if larger."""
    if case.kv_cache.dtype.itemsize != 1:
        return LSE_TOL
    scale = abs(float(case.bmm1_scale if bmm1_scale is None else bmm1_scale)) * math.log2(math.e)
    kv = case.kv_cache.reshape(-1, case.page_size, D_QK)  # [pages, page_size, 576]
    q = case.query.reshape(-1, case.num_heads, D_QK)  # [total_q, H, 576], requests in order
    worst, row = 0.0, 0
    for b, (n, L) in enumerate(zip(case.q_lens, case.kv_lens)):
        if n > 0 and L > 0:
            pages = case.block_tables[b, : -(-L // case.page_size)].long()
            k = kv[pages].reshape(-1, D_QK)[:L].float().abs()
            worst = max(worst, float(torch.einsum("thd,jd->thj", q[row : row + n].float().abs(), k).max()))
        row += n
    return max(LSE_TOL, FP8_ACCUM_REL * worst * scale)

