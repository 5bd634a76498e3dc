"""A readable float32 PyTorch reference of the MLA contract (docs/mla-api.md).

This is the ground truth the kernels are tested against. It is written to be read, not to be fast:
one request at a time, only the pages that request uses, plain softmax in float32. It runs on
whatever device the inputs live on (CPU or CUDA).

The math, for token ``t`` (0-based) of request ``b`` with ``L = seq_lens[b]`` and ``n = q_len_b``:

    visible keys:  j = 0 .. L - n + t   (bottom-right aligned causal mask; none when L - n + t < 0)
    s_j  = bmm1_scale * (q[t, h, :] . k_j)           k_j = kv row j, all 576 columns
    p_j  = exp(s_j) / (sum_j exp(s_j) [+ exp(sinks[h])])
    o    = bmm2_scale * sum_j p_j * v_j              v_j = first kv_lora_rank columns of row j
    lse  = log2(sum_j exp(s_j) [+ exp(sinks[h])])    (base 2, in units of s)

A row with no visible key gets ``o = 0`` and ``lse = -inf``, with or without a sink.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Union

import torch

__all__ = ["mla_reference"]

Scale = Union[float, int, torch.Tensor]

# Upper bound on the elements of one score block [tokens, H, keys] (float32: 4 bytes each).
# Long queries (chunked prefill) are processed in token chunks so memory stays bounded: 2**25
# floats = 128 MiB per block. Tests lower it to force the chunked path.
_SCORE_BLOCK_ELEMS = 1 << 25

_LOG2E = 1.0 / math.log(2.0)


def mla_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    cum_seq_lens_q: Optional[torch.Tensor] = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: Optional[torch.Tensor] = None,
    low_precision: bool = False,
    p_dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA attention over a paged latent KV cache, computed in float32.

    Args:
        query: uniform ``[B, q_len, H, D_qk]`` or ragged ``[total_q, H, D_qk]`` (with
            ``cum_seq_lens_q``); ``D_qk = kv_lora_rank + qk_rope_head_dim`` (576).
        kv_cache: ``[num_pages, page_size, D_qk]`` or ``[num_pages, 1, page_size, D_qk]``; bf16,
            fp16, fp32 or fp8 (upcast exactly with ``.float()``). May be a strided view of a larger
            pool (page stride = ``stride(0)``).
        block_tables: int ``[B, max_pages]``; entry ``p`` of row ``b`` is the page holding tokens
            ``p*page_size .. p*page_size + page_size - 1`` of request ``b``. Only the first
            ``ceil(seq_lens[b] / page_size)`` entries of a row are read.
        seq_lens: int ``[B]``, KV length of each request including this step's query tokens.
        kv_lora_rank: V width (512); V is the first ``kv_lora_rank`` columns of a cache row.
        qk_rope_head_dim: rope width (64).
        cum_seq_lens_q: int ``[B+1]`` prefix sums of the query lengths (ragged layout only).
        bmm1_scale: multiplies ``q . k``; a number or a one-element tensor (any device).
        bmm2_scale: multiplies the output; a number or a one-element tensor (any device).
        sinks: float32 ``[H]`` attention sinks in logit units (not scaled by ``bmm1_scale``).
        low_precision: compute as a bf16 kernel would in PyTorch: q, k, v taken as given, S and
            the row sums in fp32, P rounded to bf16 before ``P @ V`` (fp32 accumulation), the
            normalization applied in fp32 after, the output rounded to bf16. This is the baseline
            of FlashAttention-3's tolerance rule (kernel error <= 2x this one's error).
        p_dtype: the type P is rounded to when ``low_precision``: bf16, or float8_e4m3fn as the
            e4m3-query kernels store it (2^8 P, FlashAttention-3's offset, so that e4m3's range
            holds P from 1 down to 2^-17).

    Returns:
        ``(out, lse)``: ``out`` float32 of shape ``query.shape[:-1] + (kv_lora_rank,)`` (values
        bf16-representable when ``low_precision``), ``lse`` float32 of shape
        ``query.shape[:-1]``, base 2.
    """
    # ---- arguments -----------------------------------------------------------------------------
    d_qk = kv_lora_rank + qk_rope_head_dim
    if not torch.is_tensor(query) or not query.is_floating_point():
        raise TypeError(f"query must be a floating-point tensor, got {_describe(query)}")
    device = query.device
    if query.shape[-1] != d_qk:
        raise ValueError(
            f"query last dim must be kv_lora_rank + qk_rope_head_dim = {d_qk}, "
            f"got shape {list(query.shape)}"
        )

    # kv: [num_pages, page_size, D_qk], still a view of the caller's storage (no copy).
    if kv_cache.dim() == 4:
        if kv_cache.shape[1] != 1:
            raise ValueError(
                "kv_cache of rank 4 must be [num_pages, 1, page_size, D_qk], "
                f"got shape {list(kv_cache.shape)}"
            )
        kv = kv_cache[:, 0]
    elif kv_cache.dim() == 3:
        kv = kv_cache
    else:
        raise ValueError(
            "kv_cache must be [num_pages, page_size, D_qk] or [num_pages, 1, page_size, D_qk], "
            f"got shape {list(kv_cache.shape)}"
        )
    if kv.shape[-1] != d_qk:
        raise ValueError(f"kv_cache last dim must be {d_qk}, got shape {list(kv_cache.shape)}")
    if kv.device != device:
        raise ValueError(f"kv_cache must be on {device} like query, got {kv.device}")
    num_pages, page_size = kv.shape[0], kv.shape[1]

    # Host copies of the small index tensors: the reference loops over requests on the host.
    if seq_lens.dim() != 1 or seq_lens.is_floating_point():
        raise ValueError(f"seq_lens must be an integer tensor [B], got {_describe(seq_lens)}")
    lens = [int(x) for x in seq_lens.tolist()]
    batch = len(lens)
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.is_floating_point():
        raise ValueError(
            f"block_tables must be an integer tensor [B, max_pages] with B = {batch}, "
            f"got {_describe(block_tables)}"
        )
    if any(L < 0 for L in lens):
        raise ValueError(f"seq_lens must be >= 0, got {lens}")

    # Query rows of request b are q_rows[cum[b]:cum[b+1]]: [total_q, H, D_qk].
    if cum_seq_lens_q is None:
        if query.dim() != 4:
            raise ValueError(
                "query without cum_seq_lens_q must be uniform [B, q_len, H, D_qk], "
                f"got shape {list(query.shape)}"
            )
        if query.shape[0] != batch:
            raise ValueError(f"query batch {query.shape[0]} != len(seq_lens) {batch}")
        q_len = query.shape[1]
        cum = [b * q_len for b in range(batch + 1)]
        q_rows = query.reshape(batch * q_len, query.shape[2], d_qk)
    else:
        if query.dim() != 3:
            raise ValueError(
                "query with cum_seq_lens_q must be ragged [total_q, H, D_qk], "
                f"got shape {list(query.shape)}"
            )
        if cum_seq_lens_q.dim() != 1 or cum_seq_lens_q.numel() != batch + 1:
            raise ValueError(
                f"cum_seq_lens_q must be [B+1] = [{batch + 1}], got {_describe(cum_seq_lens_q)}"
            )
        cum = [int(x) for x in cum_seq_lens_q.tolist()]
        if cum[0] != 0 or cum[-1] != query.shape[0] or any(a > b for a, b in zip(cum, cum[1:])):
            raise ValueError(
                "cum_seq_lens_q must be non-decreasing from 0 to total_q = "
                f"{query.shape[0]}, got {cum}"
            )
        q_rows = query
    num_heads = q_rows.shape[1]

    scale1 = _scale_value(bmm1_scale, "bmm1_scale")
    scale2 = _scale_value(bmm2_scale, "bmm2_scale")

    sink = None  # [H] float32 on the query's device
    if sinks is not None:
        if sinks.shape != (num_heads,):
            raise ValueError(f"sinks must be [H] = [{num_heads}], got {_describe(sinks)}")
        sink = sinks.to(device=device, dtype=torch.float32)

    # ---- compute -------------------------------------------------------------------------------
    # Start from the "no visible key" answer (0 / -inf): requests with L = 0 keep it.
    out = torch.zeros(q_rows.shape[0], num_heads, kv_lora_rank, dtype=torch.float32, device=device)
    lse = torch.full((q_rows.shape[0], num_heads), -math.inf, dtype=torch.float32, device=device)

    with _ieee_fp32_matmul(device):
        for b in range(batch):
            n, L = cum[b + 1] - cum[b], lens[b]
            if n == 0 or L == 0:
                continue  # no tokens, or no keys at all: rows stay 0 / -inf
            used_pages = -(-L // page_size)
            if used_pages > block_tables.shape[1]:
                raise ValueError(
                    f"seq_lens[{b}] = {L} needs {used_pages} pages of {page_size}, but "
                    f"block_tables has only {block_tables.shape[1]} columns"
                )
            pages = block_tables[b, :used_pages].to(device=device, dtype=torch.long)
            bad = (pages < 0) | (pages >= num_pages)
            if bool(bad.any()):
                raise ValueError(
                    f"block_tables[{b}, :{used_pages}] must index pages in [0, {num_pages}), "
                    f"got {pages.tolist()}"
                )
            # k_all: [L, D_qk] (float32 values of the stored dtype); page tails beyond L dropped
            # before any arithmetic, so poison there never reaches the result.
            k_all = kv[pages].reshape(used_pages * page_size, d_qk)[:L].float()
            q_b = q_rows[cum[b] : cum[b + 1]].float()  # [n, H, D_qk]

            o_b, lse_b = _attend_request(
                q_b, k_all, L, kv_lora_rank, scale1, scale2, sink, p_dtype if low_precision else None
            )
            out[cum[b] : cum[b + 1]] = o_b
            lse[cum[b] : cum[b + 1]] = lse_b

    out_shape = query.shape[:-1] + (kv_lora_rank,)
    return out.reshape(out_shape), lse.reshape(query.shape[:-1])


def _attend_request(
    q: torch.Tensor,
    k_all: torch.Tensor,
    L: int,
    kv_lora_rank: int,
    scale1: float,
    scale2: float,
    sink: Optional[torch.Tensor],
    p_dtype: Optional[torch.dtype],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request. q: [n, H, D_qk] fp32; k_all: [L, D_qk] fp32. Returns o [n, H, Dv], lse [n, H].
    p_dtype: None (float32 throughout), or the type P is rounded to (low precision)."""
    n, num_heads, _ = q.shape
    device = q.device
    o = torch.zeros(n, num_heads, kv_lora_rank, dtype=torch.float32, device=device)
    lse = torch.full((n, num_heads), -math.inf, dtype=torch.float32, device=device)

    # Token t sees keys 0 .. L-n+t, so token chunk [t0, t1) needs keys 0 .. L-n+t1-1 at most:
    # later keys are never loaded, which keeps a decode step O(L * H) and a prefill chunk bounded.
    chunk = max(1, _SCORE_BLOCK_ELEMS // max(1, num_heads * L))
    for t0 in range(0, n, chunk):
        t1 = min(n, t0 + chunk)
        num_keys = min(L, L - n + t1)  # keys visible to the chunk's last token
        if num_keys <= 0:
            continue  # every token of the chunk sees nothing: 0 / -inf
        k = k_all[:num_keys]  # [Lc, D_qk]
        v = k[:, :kv_lora_rank]  # [Lc, Dv]

        # s: [c, H, Lc] fp32
        s = torch.einsum("thd,jd->thj", q[t0:t1], k) * scale1
        last_visible = (L - n) + torch.arange(t0, t1, device=device)  # [c]
        key_pos = torch.arange(num_keys, device=device)  # [Lc]
        hidden = key_pos[None, :] > last_visible[:, None]  # [c, Lc]
        s = s.masked_fill(hidden[:, None, :], -math.inf)

        # Row max over keys and sink. Rows with no visible key have m = -inf (no sink) and are
        # overwritten below; use 0 there so exp() sees no (-inf) - (-inf) = NaN.
        m = s.amax(dim=-1)  # [c, H]
        if sink is not None:
            m = torch.maximum(m, sink[None, :])
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))

        p = torch.exp(s - m[..., None])  # [c, H, Lc], unnormalized, fp32
        row_sum = p.sum(dim=-1)  # [c, H]
        if sink is not None:
            row_sum = row_sum + torch.exp(sink[None, :] - m)

        if p_dtype is not None:
            # A low-precision kernel feeds P to the tensor cores rounded (bf16, or e4m3 as 2^8 P)
            # and accumulates in fp32; the row sum keeps P unrounded.
            shift = 256.0 if p_dtype == torch.float8_e4m3fn else 1.0
            p = (p * shift).to(p_dtype).float() / shift
        o_c = torch.einsum("thj,jd->thd", p, v) * (scale2 / row_sum)[..., None]
        if p_dtype is not None:
            o_c = o_c.to(torch.bfloat16).float()
        lse_c = (m + torch.log(row_sum)) * _LOG2E

        # Rows with no visible key: 0 / -inf even with a sink (the contract's rule).
        empty = (last_visible < 0)[:, None]  # [c, 1]
        o[t0:t1] = torch.where(empty[..., None], torch.zeros_like(o_c), o_c)
        lse[t0:t1] = torch.where(empty, torch.full_like(lse_c, -math.inf), lse_c)
    return o, lse


def _scale_value(scale: Scale, name: str) -> float:
    """A Python float from a number or a one-element tensor (a host sync: fine for a reference)."""
    if isinstance(scale, bool):
        raise TypeError(f"{name} must be a float or a one-element float tensor, got bool")
    if isinstance(scale, (int, float)):
        return float(scale)
    if torch.is_tensor(scale):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError(
                f"{name} must be a one-element floating-point tensor, got {_describe(scale)}"
            )
        return float(scale.detach().reshape(()).item())
    raise TypeError(f"{name} must be a float or a one-element float tensor, got {type(scale)}")


@contextlib.contextmanager
def _ieee_fp32_matmul(device: torch.device):
    """On CUDA, force full-precision fp32 matmuls (no TF32) for the duration of the call."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        saved = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:  # older torch
        saved = matmul.allow_tf32
        matmul.allow_tf32 = False
        try:
            yield
        finally:
            matmul.allow_tf32 = saved


def _describe(x) -> str:
    if torch.is_tensor(x):
        return f"{str(x.dtype).replace('torch.', '')} {list(x.shape)} on {x.device}"
    return repr(type(x))
