"""Opt-in checks of the values in device tensors: page ids, lengths, prefix sums.

The launcher checks everything it can without reading device memory (dtypes, shapes, devices,
sizes). What only the data can tell (a page id outside the pool, a request with more query tokens
than KV tokens, decreasing ``cum_seq_lens_q``) is checked here, on the device with a few small
PyTorch ops, and the verdict comes back in one device-to-host copy. That copy synchronizes the
stream, so the checks are off by default: ``check_inputs=True`` or ``JIT_MLA_CHECK_INPUTS=1``
turns them on (debugging, canaries; cost in README). Without them a bad value never makes the
kernels read or write outside their tensors (lengths and ranges are clamped on the device), but
the affected request's output is wrong.

Checks run in eager calls only: inside CUDA-graph capture or ``torch.compile`` a host sync is
impossible, so an explicit ``check_inputs=True`` there is an error and the environment variable
is ignored there.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import env


class InputCheckError(ValueError):
    """A device tensor holds a value outside the contract (found by the opt-in checks)."""


def wanted(check_inputs: Optional[bool], device: Optional[torch.device] = None) -> bool:
    """Whether this call runs the checks: the argument if given, else ``JIT_MLA_CHECK_INPUTS``.

    ``device``: the query's; its current stream is the one a capture would be on. Raises
    RuntimeError for an explicit True where no host sync is possible.
    """
    if check_inputs is None:
        return env.check_inputs_enabled() and not _in_capture_or_compile(device)
    if check_inputs and _in_capture_or_compile(device):
        raise RuntimeError(
            "check_inputs=True reads device values back to the host, which CUDA-graph capture and "
            "torch.compile forbid; run one eager call with the checks before capturing"
        )
    return bool(check_inputs)


def _in_capture_or_compile(device: Optional[torch.device]) -> bool:
    if torch.compiler.is_compiling():
        return True
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _usable(t: Optional[torch.Tensor], ndim: int, device: torch.device) -> bool:
    return t is not None and t.dtype == torch.int32 and t.dim() == ndim and t.device == device


def check_device_inputs(
    query: torch.Tensor,  # [B, q_len, H, 576] or [total_q, H, 576]
    kv_cache: torch.Tensor,  # [num_pages, page_size, 576] or [num_pages, 1, page_size, 576]
    block_tables: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int32 [B]
    cum_seq_lens_q: Optional[torch.Tensor],  # int32 [B+1] or None
    max_q_len: Optional[int],
    batch_size: int,
) -> None:
    """Raise ``InputCheckError`` naming the argument, the index and the values for the first
    bad value found; return None when the data is valid.

    Arguments whose dtype, rank or device is already wrong are left to the launcher, which
    reports those; so are batch sizes that disagree between tensors.
    """
    dev = query.device
    if batch_size == 0 or not _usable(block_tables, 2, dev) or not _usable(seq_lens, 1, dev):
        return
    if block_tables.shape[0] != batch_size or seq_lens.shape[0] != batch_size:
        return
    if cum_seq_lens_q is not None and (not _usable(cum_seq_lens_q, 1, dev) or cum_seq_lens_q.shape[0] != batch_size + 1):
        return
    if kv_cache.dim() not in (3, 4):
        return
    if cum_seq_lens_q is None and query.dim() == 3 and query.shape[0] % batch_size:
        return  # the launcher's shape error says more than a length check would
    num_pages, page_size = kv_cache.shape[0], kv_cache.shape[-2]
    max_pages = block_tables.shape[1]
    total_q = query.shape[0] if query.dim() == 3 else batch_size * query.shape[1]

    seq = seq_lens.to(torch.int64)  # [B]
    if cum_seq_lens_q is not None:
        cum = cum_seq_lens_q.to(torch.int64)  # [B+1]
        n = cum[1:] - cum[:-1]  # [B] query tokens per request
    else:
        cum = None
        n = torch.full_like(seq, total_q // batch_size)

    # Each check: a bad-mask over some index space; its first bad index and the values to quote.
    # (No host scalar may become a device tensor here: each such copy would sync the stream.)
    def first(bad: torch.Tensor) -> torch.Tensor:
        flat = bad.reshape(-1)
        i = flat.to(torch.int8).argmax()  # the first True, or 0 when there is none
        return torch.where(flat[i], i, -1)

    stats = []
    if cum is not None:
        stats += [cum[0], cum[-1], first(n < 0), n.max()]
    stats += [first(seq < 0), first(n > seq)]
    pages_needed = torch.div(seq.clamp(min=0) + page_size - 1, page_size, rounding_mode="floor")  # [B]
    stats.append(first(pages_needed > max_pages))
    if max_pages > 0:
        used = torch.arange(max_pages, device=dev)[None, :] < pages_needed[:, None]  # [B, max_pages]
        stats.append(first(used & ((block_tables < 0) | (block_tables >= num_pages))))
    else:
        stats.append(torch.full((), -1, dtype=torch.int64, device=dev))
    host = torch.stack([s.to(torch.int64) for s in stats]).tolist()  # the one sync

    seq_host = lambda b: int(seq_lens[b])  # noqa: E731 - only on the error path
    if cum is not None:
        cum0, cum_last, dec, n_max = host[:4]
        host = host[4:]
        if cum0 != 0:
            raise InputCheckError(f"cum_seq_lens_q[0] must be 0, got {cum0}")
        if dec >= 0:
            raise InputCheckError(
                f"cum_seq_lens_q must be non-decreasing, got cum_seq_lens_q[{dec}] = "
                f"{int(cum_seq_lens_q[dec])} > cum_seq_lens_q[{dec + 1}] = {int(cum_seq_lens_q[dec + 1])}"
            )
        if cum_last != total_q:
            raise InputCheckError(
                f"cum_seq_lens_q[{batch_size}] must equal total_q = query.shape[0] = {total_q}, got {cum_last}"
            )
        if max_q_len is not None and n_max > max_q_len:
            b = int(torch.argmax(n))
            raise InputCheckError(
                f"max_q_len must be >= every request's query length, got max_q_len = {max_q_len} "
                f"but request {b} has {n_max} tokens (cum_seq_lens_q)"
            )
    neg, short, wide, page = host
    if neg >= 0:
        raise InputCheckError(f"seq_lens must be >= 0, got seq_lens[{neg}] = {seq_host(neg)}")
    if short >= 0:
        raise InputCheckError(
            f"seq_lens[{short}] = {seq_host(short)} must be >= the request's query length "
            f"{int(n[short])} (seq_lens counts this step's query tokens)"
        )
    if wide >= 0:
        raise InputCheckError(
            f"block_tables has {max_pages} pages per row, but seq_lens[{wide}] = {seq_host(wide)} "
            f"needs {int(pages_needed[wide])} pages of {page_size} tokens"
        )
    if page >= 0:
        b, p = divmod(page, max_pages)
        raise InputCheckError(
            f"block_tables[{b}, {p}] = {int(block_tables[b, p])} is outside the pool: page ids of "
            f"the first ceil(seq_lens[b] / page_size) entries must be in [0, {num_pages}) "
            f"(kv_cache.shape[0])"
        )
