"""Public API: FlashInfer's ``trtllm_batch_decode_with_kv_cache_mla``, running on Hopper.

Same name, positional parameters and keywords as FlashInfer's, so an engine switches its import;
made complete: ragged queries (``cum_seq_lens_q`` + ``max_q_len``), float or device-tensor scales,
LSE, sinks, zero-length requests, any batch size. The contract: ``docs`` of the repository and
FlashInfer's docstring; every difference is named below.

The wrapper stays thin (it runs on every decode step of every layer): it allocates what the caller
did not pass and hands everything to the launcher, which validates arguments and launches the
kernels. Only a ragged call without ``max_q_len`` synchronizes with the device (to validate the
prefix sums on the host); pass ``max_q_len`` to avoid that.
"""

from __future__ import annotations

import math
import operator
from typing import Any, List, Optional, Tuple, Union

import torch

from . import checks as _checks
from . import env as _env
from . import op as _op  # registers torch.ops.jit_mla.mla_decode (engine hook)
from .launcher import build_launcher, get_launcher

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
HEAD_DIM_QK = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: a cache row is [ckv (512) | kpe (64)]

Scale = Union[float, torch.Tensor]

# backend names accepted: ours, and FlashInfer's trtllm-gen whose contract this implements.
_BACKENDS = ("auto", "jit_mla", "trtllm-gen")
_sm_counts: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    n = _sm_counts.get(index)
    if n is None:
        n = _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def _sm_count_of(query: torch.Tensor) -> int:
    """SM count of query's CUDA device (1 on the CPU: the launcher refuses CPU tensors anyway).
    get_device() is the cheapest way to the index (no torch.device object): hot path."""
    index = query.get_device()
    n = _sm_counts.get(index)
    if n is None:
        n = _sm_count(query.device) if index >= 0 else 1
    return n


def get_workspace_size(
    batch_size: int,
    num_heads: int,
    q_len: int = 1,
    *,
    total_q: Optional[int] = None,
    sm_count: Optional[int] = None,
    device: Union[torch.device, str, int, None] = None,
) -> int:
    """Bytes of ``workspace_buffer`` a call needs.

    ``total_q`` (ragged calls) defaults to ``batch_size * q_len``; ``sm_count`` to the SM count of
    ``device`` (default: the current CUDA device). The size covers the on-device split plan and
    the split-KV partials (a 64 x 512 fp32 slot per split: the partial is stored in bf16, the fp8
    kernels' long chains are promoted in fp32); it does not depend on sequence lengths.
    """
    if total_q is None:
        total_q = batch_size * q_len
    if sm_count is None:
        if device is None:
            device = torch.cuda.current_device()
        sm_count = _sm_count(torch.device("cuda", device) if isinstance(device, int) else torch.device(device))
    # The launcher alone (no kernels, no GPU needed) knows the layout: one source of truth.
    return int(build_launcher().workspace_size(batch_size, total_q, num_heads, sm_count))


def fold_mla_scales(
    q_scale: Scale = 1.0,
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    o_scale: Scale = 1.0,
    sm_scale: Optional[Scale] = None,
    qk_nope_head_dim: int = 128,
    qk_rope_head_dim: int = QK_ROPE_HEAD_DIM,
) -> Tuple[Scale, Scale]:
    """Fold per-tensor scales into ``(bmm1_scale, bmm2_scale)`` (FlashInfer's convention).

    ``bmm1_scale = q_scale * k_scale * sm_scale`` and ``bmm2_scale = v_scale * o_scale``, with
    ``sm_scale = 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` by default (1/sqrt(192) for
    DeepSeek: the head dim before absorption, not 576). All floats give floats. Any tensor among
    them gives one-element float32 tensors on that tensor's device, computed there (no host
    sync), ready to be passed as device-tensor scales (a captured CUDA graph reads new values).
    """
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
    factors1 = (q_scale, k_scale, sm_scale)
    factors2 = (v_scale, o_scale)
    return _product(factors1, "bmm1"), _product(factors2, "bmm2")


def _product(factors, name: str) -> Scale:
    tensors = [f for f in factors if isinstance(f, torch.Tensor)]
    if not tensors:
        out = 1.0
        for f in factors:
            out *= float(f)
        return out
    device = tensors[0].device
    out = torch.ones(1, dtype=torch.float32, device=device)
    for f in factors:
        if isinstance(f, torch.Tensor):
            if f.numel() != 1:
                raise ValueError(f"{name} factor tensors must have one element, got shape {tuple(f.shape)}")
            if f.device != device:
                raise ValueError(f"{name} factor tensors must share a device, got {f.device} and {device}")
            out = out * f.reshape(1).to(torch.float32)
        else:
            out = out * float(f)
    return out


def trtllm_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: Optional[torch.Tensor] = None,
    bmm1_scale: Scale = 1.0,
    bmm2_scale: Scale = 1.0,
    sinks: Optional[Union[torch.Tensor, List[torch.Tensor]]] = None,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    enable_pdl: Optional[bool] = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    kv_scale_format: str = "auto",
    cum_seq_lens_q: Optional[torch.Tensor] = None,
    max_q_len: Optional[int] = None,
    multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None,
    sparse_mla_top_k_lens: Optional[torch.Tensor] = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: Optional[torch.Tensor] = None,
    use_fp16_softmax: Optional[bool] = None,
    return_lse_base: Optional[str] = None,
    *,
    check_inputs: Optional[bool] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """MLA attention over a paged latent KV cache (decode, speculative verify, chunked prefill).

    Args:
        query: bf16 (or float8_e4m3fn with a float8_e4m3fn ``kv_cache``, its scale folded into
            ``bmm1_scale``), ``[B, q_len, H, 576]`` (uniform) or ``[total_q, H, 576]`` with
            ``cum_seq_lens_q`` (ragged; request ``b`` owns rows ``cum[b] .. cum[b+1]-1``, zero-length
            requests allowed). Each row is ``[q_nope absorbed (512) | q_rope (64)]``. Contiguous.
        kv_cache: bf16 ``[num_pages, page_size, 576]`` or ``[num_pages, 1, page_size, 576]``; may
            be a strided view into a larger pool (page stride = ``stride(0)``). Row = ``[ckv | kpe]``;
            K is the row, V its first 512 columns. Any page size (16, 32, 64, 128 tested). Or
            float8_e4m3fn (with a bf16 or an e4m3 query), read as fp8 by the kernel (both matmuls
            on fp8 tensor cores: a bf16 query split exactly into two e4m3 parts, P into two e4m3
            parts to bf16's precision; an e4m3 query as it is, P one e4m3 value as 2^8 P): every
            query layout and page size; fold its k/v scales into ``bmm1_scale``/``bmm2_scale``.
        workspace_buffer: CUDA scratch, at least ``get_workspace_size(...)`` bytes; a smaller one
            is a ``ValueError`` naming the size needed (never memory corruption).
        qk_nope_head_dim: the pre-absorption nope dim (128 for DeepSeek); only used by
            ``fold_mla_scales``; kept for FlashInfer's signature.
        kv_lora_rank: must be 512. qk_rope_head_dim: must be 64.
        block_tables: int32 ``[B, max_pages]``: entry ``p`` of row ``b`` holds tokens
            ``p*page_size .. p*page_size+page_size-1`` of request ``b``. At most
            ``2**31 - 2**16`` tokens wide (``max_pages * page_size``; ``ValueError`` beyond).
        seq_lens: int32 ``[B]``: KV length of each request *including* this step's query tokens.
        max_seq_len: host hint; results never depend on it (unlike FlashInfer's split count).
            It picks between two equivalent kernels (few KV blocks per CTA, one CTA per SM: the
            seesaw without its steady pair body); an int, or None for no hint.
        sparse_mla_top_k: must be 0 (sparse MLA: ``NotImplementedError``).
        out: optional bf16 ``query.shape[:-1] + (512,)``; allocated when not given.
        bmm1_scale: float or one-element float32 CUDA tensor: ``q_scale * k_scale * sm_scale``
            (``fold_mla_scales``). A tensor is read by the kernel on the device (no extra launch;
            CUDA-graph replays see new values).
        bmm2_scale: float or one-element float32 CUDA tensor: ``v_scale * o_scale``.
        sinks: float32 ``[H]`` (or a one-element list of it): per-head logit added to the softmax
            denominator only (logit units, not scaled by ``bmm1_scale``).
        skip_softmax_threshold_scale_factor: must be None (``NotImplementedError``).
        enable_pdl: programmatic dependent launch between our kernels; None = on.
        backend: ``"auto"``, ``"jit_mla"`` or ``"trtllm-gen"`` (whose contract this implements).
        is_var_seq: accepted for FlashInfer's signature; lengths are always per request here.
        uses_shared_paged_kv_idx: must be True (``NotImplementedError`` otherwise).
        lse: optional float32 ``query.shape[:-1]``, filled with base-2 log-sum-exp
            ``log2(sum_j exp(s_j))`` (sink included), also with ``cum_seq_lens_q``.
        return_lse: return ``(out, lse)``, allocating ``lse`` when not given.
        cute_dsl_impl, kv_scale_format: FlashInfer's cute-dsl implementation and sparse fp8 scale
            format selectors; only ``"auto"`` (``NotImplementedError`` otherwise).
        cum_seq_lens_q: int32 ``[B+1]`` prefix sums of query lengths (ragged layout).
        max_q_len: host int, an upper bound of the longest request. When given with
            ``cum_seq_lens_q`` there is no device-to-host sync; when omitted, the prefix sums are
            copied to the host and validated (one sync).
        multi_ctas_kv_counter_buffer, sparse_mla_top_k_lens, enable_dcp, cp_world, cp_rank,
            causal_seqlens_kv_global, use_fp16_softmax: FlashInfer's (trtllm-gen multi-CTA,
            sparse, decode-context-parallel, fp16-softmax) options; only their defaults
            (``NotImplementedError`` otherwise).
        return_lse_base: ``None`` or ``"base2"`` (log2, trtllm-gen's default) or ``"basee"``
            (natural log: the base-2 LSE times ln 2, one extra elementwise kernel).
        check_inputs: jit_mla's own keyword (after FlashInfer's). True checks the values in the
            device tensors before the launch (page ids inside the pool, ``seq_lens`` >= 0 and
            >= the request's query length and within ``block_tables``' width, ``cum_seq_lens_q``
            starting at 0, non-decreasing, ending at ``total_q``, no request above
            ``max_q_len``) and raises ``jit_mla.InputCheckError`` (a ``ValueError``) naming the
            argument, index and value. It costs a few small kernels and one host sync per call,
            so it is off by default; None follows ``JIT_MLA_CHECK_INPUTS``. Refused (True) or
            skipped (the variable) inside CUDA-graph capture and ``torch.compile``. Without it
            a bad value still never makes the kernels touch memory outside their tensors (the
            kernels clamp lengths and ranges; page ids outside the pool read as zeros), but that
            request's output is wrong.

    Semantics: token ``t`` of request ``b`` (``n`` query tokens, ``L = seq_lens[b]``) attends KV
    positions ``0 .. L - n + t`` (bottom-right causal). A row with no visible key gets
    ``out = 0`` and ``lse = -inf``. Results are bitwise reproducible run to run.

    Returns:
        ``out`` (bf16 ``query.shape[:-1] + (512,)``), or ``(out, lse)`` with ``return_lse``.
    """
    if kv_lora_rank != KV_LORA_RANK or qk_rope_head_dim != QK_ROPE_HEAD_DIM:
        raise ValueError(
            f"kv_lora_rank and qk_rope_head_dim must be {KV_LORA_RANK} and {QK_ROPE_HEAD_DIM} "
            f"(DeepSeek/Kimi MLA), got {kv_lora_rank} and {qk_rope_head_dim}"
        )
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if sparse_mla_top_k:
        raise NotImplementedError(f"sparse_mla_top_k > 0 (sparse MLA) is not supported yet, got {sparse_mla_top_k}")
    if skip_softmax_threshold_scale_factor is not None:
        raise NotImplementedError("skip_softmax_threshold_scale_factor is not supported yet")
    if not uses_shared_paged_kv_idx:
        raise NotImplementedError("uses_shared_paged_kv_idx=False (separate K and V page indices) is not supported")
    if (  # one cheap test on the hot path; the detailed check only when something is set
        cute_dsl_impl != "auto" or kv_scale_format != "auto" or multi_ctas_kv_counter_buffer is not None
        or sparse_mla_top_k_lens is not None or enable_dcp or cp_world != 1 or cp_rank != 0
        or causal_seqlens_kv_global is not None or use_fp16_softmax
    ):  # fmt: skip
        _refuse_flashinfer_extras(
            cute_dsl_impl, kv_scale_format, multi_ctas_kv_counter_buffer, sparse_mla_top_k_lens,
            enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global, use_fp16_softmax)
    if return_lse_base not in _LSE_BASES:
        raise ValueError(f"return_lse_base must be 'basee', 'base2' or None, got {return_lse_base!r}")
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise ValueError(f"sinks as a list must hold one float32 [H] tensor, got {len(sinks)} items")
        sinks = sinks[0]

    _Tensor = torch.Tensor
    if not (isinstance(query, _Tensor) and isinstance(kv_cache, _Tensor) and isinstance(block_tables, _Tensor)
            and isinstance(seq_lens, _Tensor)):  # fmt: skip
        for name, t in (("query", query), ("kv_cache", kv_cache), ("block_tables", block_tables), ("seq_lens", seq_lens)):
            if not isinstance(t, _Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    batch_size = block_tables.shape[0] if block_tables.dim() >= 1 else 0
    if cum_seq_lens_q is not None:
        if query.dim() != 3:
            raise ValueError(
                f"cum_seq_lens_q needs the ragged query layout [total_q, H, 576], got query of shape {tuple(query.shape)}"
            )
        if max_q_len is None:
            max_q_len = _validate_cum_seq_lens_q(cum_seq_lens_q, batch_size, query.shape[0])

    if (check_inputs is not None or _env._check_inputs) and _checks.wanted(check_inputs, query.device):
        _checks.check_device_inputs(query, kv_cache, block_tables, seq_lens, cum_seq_lens_q, max_q_len, batch_size)

    if out is None:
        out = torch.empty(query.shape[:-1] + (KV_LORA_RANK,), dtype=torch.bfloat16, device=query.device)
    if return_lse and lse is None:
        lse = torch.empty(query.shape[:-1], dtype=torch.float32, device=query.device)

    # ---- engine hook (jit_mla/op.py): under torch.compile / torch.export the launch is the
    # registered op torch.ops.jit_mla.mla_decode (traceable, CUDA-graph safe); eager calls go
    # straight to the launcher, skipping the dispatcher's few microseconds. Both run _launch.
    if torch.compiler.is_compiling():
        (f1, t1), (f2, t2) = _op.split_scale(bmm1_scale), _op.split_scale(bmm2_scale)
        torch.ops.jit_mla.mla_decode(
            out, lse, query, kv_cache, workspace_buffer, block_tables, seq_lens, batch_size,
            max_q_len, max_seq_len, f1, f2, t1, t2, sinks, cum_seq_lens_q, enable_pdl)
    else:
        _launch(
            out, lse, query, kv_cache, workspace_buffer, block_tables, seq_lens, batch_size,
            max_q_len, max_seq_len, bmm1_scale, bmm2_scale, sinks, cum_seq_lens_q, enable_pdl)
    if return_lse_base == "basee" and lse is not None:
        lse.mul_(_LN2)  # the kernels write log2; -inf rows stay -inf
    return (out, lse) if return_lse else out


_LN2 = math.log(2.0)
_LSE_BASES = (None, "base2", "basee")


def _refuse_flashinfer_extras(
    cute_dsl_impl, kv_scale_format, multi_ctas_kv_counter_buffer, sparse_mla_top_k_lens,
    enable_dcp, cp_world, cp_rank, causal_seqlens_kv_global, use_fp16_softmax,
) -> None:  # fmt: skip
    """FlashInfer keywords of features jit_mla lacks: accepted at their defaults, refused (never
    ignored) otherwise, naming the keyword. The tests are the caller's guard's, one by one."""
    for name, value, is_set in (
        ("cute_dsl_impl", cute_dsl_impl, cute_dsl_impl != "auto"),
        ("kv_scale_format", kv_scale_format, kv_scale_format != "auto"),
        ("multi_ctas_kv_counter_buffer", multi_ctas_kv_counter_buffer, multi_ctas_kv_counter_buffer is not None),
        ("sparse_mla_top_k_lens", sparse_mla_top_k_lens, sparse_mla_top_k_lens is not None),
        ("enable_dcp", enable_dcp, bool(enable_dcp)),
        ("cp_world", cp_world, cp_world != 1),
        ("cp_rank", cp_rank, cp_rank != 0),
        ("causal_seqlens_kv_global", causal_seqlens_kv_global, causal_seqlens_kv_global is not None),
        ("use_fp16_softmax", use_fp16_softmax, bool(use_fp16_softmax)),
    ):
        if is_set:
            raise NotImplementedError(
                f"{name} is a FlashInfer option jit_mla does not support (only its default); got "
                f"{name}={value!r}"
            )


def _launch(
    out: torch.Tensor,
    lse: Optional[torch.Tensor],
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    batch_size: int,
    max_q_len: Optional[int],
    max_seq_len: int,
    bmm1_scale: Scale,
    bmm2_scale: Scale,
    sinks: Optional[torch.Tensor],
    cum_seq_lens_q: Optional[torch.Tensor],
    enable_pdl: Optional[bool],
) -> None:
    """The one launcher call, on checked and allocated arguments: the eager path of
    ``trtllm_batch_decode_with_kv_cache_mla`` and the CUDA kernel of ``torch.ops.jit_mla.mla_decode``
    (jit_mla/op.py) both end here, with the same arguments."""
    # The launcher's compact entry (16 arguments; trtllm_paged_attention_decode is FlashInfer's
    # 28-argument form of the same call, for callers of the launcher itself). max_seq_len last:
    # the launcher's hint for the kernel choice (few KV blocks per CTA), never for results.
    get_launcher().mla_decode(
        out,
        lse,
        query,
        kv_cache,
        workspace_buffer,
        block_tables,
        seq_lens,
        cum_seq_lens_q,
        sinks,
        bmm1_scale,
        bmm2_scale,
        max_q_len,
        batch_size,
        _sm_count_of(query),
        True if enable_pdl is None else bool(enable_pdl),
        max_seq_len if type(max_seq_len) is int and -_HINT_MAX <= max_seq_len <= _HINT_MAX
        else _kv_len_hint(max_seq_len),
    )  # fmt: skip


_HINT_MAX = 1 << 62  # the launcher takes an int64


def _kv_len_hint(max_seq_len: Any) -> int:
    """max_seq_len as the launcher's hint when it is not a plain int in int64's range: an integer
    (NumPy and torch integers too) clamped into it, None for none (0); anything else is refused,
    naming the argument."""
    if max_seq_len is None:
        return 0
    try:
        value = operator.index(max_seq_len)
    except TypeError:
        raise TypeError(f"max_seq_len must be an int (a host hint), got {type(max_seq_len).__name__}") from None
    return max(-_HINT_MAX, min(value, _HINT_MAX))


def _validate_cum_seq_lens_q(cum: torch.Tensor, batch_size: int, total_q: int) -> int:
    """Host validation of the prefix sums (one device-to-host copy); returns the longest request."""
    if cum.dtype != torch.int32:
        raise TypeError(f"cum_seq_lens_q must be int32, got {str(cum.dtype).replace('torch.', '')} {list(cum.shape)}")
    if cum.dim() != 1 or cum.shape[0] != batch_size + 1:
        raise ValueError(
            f"cum_seq_lens_q must be int32 of shape [B+1] = [{batch_size + 1}], "
            f"got {str(cum.dtype).replace('torch.', '')} {list(cum.shape)}"
        )
    host = cum.cpu()
    if int(host[0]) != 0:
        raise ValueError(f"cum_seq_lens_q[0] must be 0, got {int(host[0])}")
    lens = host[1:] - host[:-1]
    if batch_size and int(lens.min()) < 0:
        b = int(torch.argmin(lens))
        raise ValueError(
            f"cum_seq_lens_q must be non-decreasing, got cum[{b}] = {int(host[b])} > cum[{b + 1}] = {int(host[b + 1])}"
        )
    if int(host[-1]) != total_q:
        raise ValueError(
            f"cum_seq_lens_q[B] must equal total_q = query.shape[0] = {total_q}, got {int(host[-1])}"
        )
    return int(lens.max()) if batch_size else 0


# The same function serves chunked prefill: ragged queries of thousands of tokens per request.
trtllm_prefill_with_kv_cache_mla = trtllm_batch_decode_with_kv_cache_mla
