"""``torch.ops.jit_mla.mla_decode``: the MLA call as a registered torch op (torch.compile, export).

How the op and the public function relate
-----------------------------------------
An engine needs only ``jit_mla.trtllm_batch_decode_with_kv_cache_mla`` (FlashInfer's signature):

- eager (``torch.compiler.is_compiling()`` is False): it checks the Python-level arguments,
  allocates what the caller did not pass and calls the TVM-FFI launcher directly
  (``api._launch``). No torch dispatcher on this path: it would cost several microseconds per
  call, most of the < 10 us host budget (the hook itself adds about 0.2 us of Python).
- under ``torch.compile`` / ``torch.export``: the same checks and allocations are traced, and the
  launch becomes one graph node, this op. Its fake (meta) kernel checks the output buffers' shapes
  and dtypes, so Dynamo, AOTAutograd and Inductor propagate shapes without running anything; at
  run time its kernel calls the same ``api._launch`` with the same arguments (one function, no
  duplicated logic). ``fullgraph=True`` holds: no graph break.

The op is public too, for engines that wrap attention in their own custom op or want the op in
eager mode: ``torch.ops.jit_mla.mla_decode(out, lse, query, kv_cache, workspace_buffer,
block_tables, seq_lens, batch_size, max_q_len, max_seq_len, bmm1_scale, bmm2_scale,
bmm1_scale_tensor, bmm2_scale_tensor, sinks, cum_seq_lens_q, enable_pdl)`` returns nothing; it
writes ``out`` (and ``lse`` when given). It declares ``out``, ``lse`` and ``workspace_buffer``
mutated (the workspace is scratch the kernels write: declaring it keeps the schema honest, so
functionalization and ``opcheck`` never assume it unchanged).

What recompiles and what does not
---------------------------------
- ``seq_lens``, ``block_tables``, ``cum_seq_lens_q`` and tensor scales are device tensors: new
  values never recompile (and a captured CUDA graph reads them on replay).
- Shapes: the first new batch size or query length recompiles once with dynamic shapes
  (Dynamo's automatic dynamic), then no more. Mark them dynamic up front to avoid even that.
- Host ints (``max_seq_len``, ``max_q_len`` of a ragged call): the same, one recompile to a
  symbolic int on the first new value. ``max_seq_len`` is only a hint: pass a constant.
- A float scale is a compile-time constant: Dynamo guards on its value (a new value recompiles;
  ``torch._dynamo.config.specialize_float = False`` does not change that, because the value
  reaches the op as a float; AOTAutograd/Inductor specialize it even where Dynamo would not, and
  turning it into a device tensor inside the graph would cost a kernel per call). Constant scales
  (``1/sqrt(192)``, per-layer constants) are what engines pass; a scale that changes at run time
  must be a one-element float32 CUDA tensor.
- A ragged call without ``max_q_len`` validates ``cum_seq_lens_q`` on the host (a device-to-host
  copy): a graph break, an error with ``fullgraph=True``. Pass ``max_q_len`` when compiling.

CUDA graphs: the launcher launches on torch's current stream (the capture stream during
capture) and reads lengths, page tables and tensor scales on the device, so capturing a compiled
(or eager) step and replaying it with new ``seq_lens`` / scale values gives the new results. With
``torch.compile(mode="reduce-overhead")``, ``out`` and ``workspace_buffer`` passed in from outside
are mutated graph inputs: mark them static (``torch._dynamo.mark_static_address``) or keep them
as module buffers, or Inductor's CUDA graphs skip the graph.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from . import api as _api  # api imports this module too; _launch is looked up at call time

OP_NAME = "jit_mla::mla_decode"

# Mirrors of api.KV_LORA_RANK / api.HEAD_DIM_QK (this module cannot import api at load time: api
# imports it); tests/test_op_cpu.py checks they agree.
_D_V = 512  # output row: the latent (ckv) width
_D_QK = 576  # query/cache row: ckv 512 + kpe 64


@torch.library.custom_op(OP_NAME, mutates_args=("out", "lse", "workspace_buffer"))
def mla_decode(
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
    bmm1_scale: float,
    bmm2_scale: float,
    bmm1_scale_tensor: Optional[torch.Tensor],
    bmm2_scale_tensor: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    cum_seq_lens_q: Optional[torch.Tensor],
    enable_pdl: Optional[bool],
) -> None:
    """Write MLA attention into ``out`` (bf16 ``query.shape[:-1] + (512,)``) and ``lse``.

    The arguments are those of ``trtllm_batch_decode_with_kv_cache_mla`` after its checks, with
    each scale split in two because a schema has no float-or-tensor type: a tensor scale
    (``bmm*_scale_tensor``, one-element float32 CUDA) wins over the float.
    """
    _api._launch(
        out, lse, query, kv_cache, workspace_buffer, block_tables, seq_lens, batch_size, max_q_len,
        max_seq_len,
        bmm1_scale if bmm1_scale_tensor is None else bmm1_scale_tensor,
        bmm2_scale if bmm2_scale_tensor is None else bmm2_scale_tensor,
        sinks, cum_seq_lens_q, enable_pdl,
    )  # fmt: skip


@mla_decode.register_fake
def _mla_decode_fake(
    out, lse, query, kv_cache, workspace_buffer, block_tables, seq_lens, batch_size, max_q_len,
    max_seq_len, bmm1_scale, bmm2_scale, bmm1_scale_tensor, bmm2_scale_tensor, sinks,
    cum_seq_lens_q, enable_pdl,
) -> None:  # fmt: skip
    """Shape/dtype contract of the buffers the op writes (also the Meta kernel).

    Only what tracing relies on is checked here, with the launcher's messages; the launcher checks
    everything again at run time.
    """
    if query.dim() not in (3, 4) or query.shape[-1] != _D_QK:
        raise ValueError(
            f"query must be [B, q_len, H, {_D_QK}] or [total_q, H, {_D_QK}], got {_desc(query)}"
        )
    rows = tuple(query.shape[:-1])
    _check_buffer(out, rows + (_D_V,), torch.bfloat16, "out")
    if lse is not None:
        _check_buffer(lse, rows, torch.float32, "lse")


def _check_buffer(t: torch.Tensor, shape: tuple, dtype: torch.dtype, name: str) -> None:
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {_dtype_name(dtype)} {list(shape)}, got {_desc(t)}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be {_dtype_name(dtype)} {list(shape)}, got {_desc(t)}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _desc(t: torch.Tensor) -> str:
    return f"{_dtype_name(t.dtype)} {list(t.shape)}"


def split_scale(scale: Union[float, torch.Tensor]) -> tuple[float, Optional[torch.Tensor]]:
    """A float-or-tensor scale onto the op's schema (which has no such type): (float, tensor or
    None), the tensor winning. What the public function does while ``torch.compiler.is_compiling()``."""
    return (0.0, scale) if isinstance(scale, torch.Tensor) else (float(scale), None)
