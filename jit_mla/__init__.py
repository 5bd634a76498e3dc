"""jit-mla: Multi-head Latent Attention kernels for Hopper over a paged latent KV cache."""

from .checks import InputCheckError
from .api import (
    fold_mla_scales,
    get_workspace_size,
    trtllm_batch_decode_with_kv_cache_mla,
    trtllm_prefill_with_kv_cache_mla,
)

__version__ = "0.1.0"

__all__ = [
    "InputCheckError",
    "fold_mla_scales",
    "get_workspace_size",
    "trtllm_batch_decode_with_kv_cache_mla",
    "trtllm_prefill_with_kv_cache_mla",
    "__version__",
]
