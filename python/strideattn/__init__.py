"""strideattn: fused scaled dot-product attention that reads every tensor through its real
strides. Works on any DLPack-capable tensor (numpy on the CPU; PyTorch, CuPy, JAX on the
GPU); `strideattn.torch` adds a PyTorch autograd custom op and a TransformerEngine-style
DotProductAttention module (imported on first use, so torch is not required here).
`sdpa`, `flash_attn_func` and `flash_attn_varlen_func` (and FlashAttention's packed QKV / KV
forms) take PyTorch SDPA's and FlashAttention's arguments with their meanings; `attention_with_kvcache` is inference
attention against a contiguous or paged KV cache (flash_attn_with_kvcache's arguments, our
mask keywords; `flash_attn_with_kvcache` is the drop-in)."""

from . import _core
from ._core import (
    MASKS,
    BackendError,
    UnsupportedError,
    attention,
    attention_backward,
    clear_plan_cache,
    compiled_backends,
    explain,
    plan_cache_info,
    version,
    workspace_size,
)
from ._kvcache import attention_with_kvcache, explain_with_kvcache
from ._dropin import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    sdpa,
)
from ._util import MASK_ALIASES
from ._log import flush_log, get_log_level, set_log_level
from . import _build_info
from ._build_info import build_info

__version__ = version()

__all__ = [
    "MASKS",
    "MASK_ALIASES",
    "BackendError",
    "UnsupportedError",
    "attention",
    "attention_backward",
    "attention_with_kvcache",
    "build_info",
    "compiled_backends",
    "clear_plan_cache",
    "explain",
    "explain_with_kvcache",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "sdpa",
    "flush_log",
    "get_log_level",
    "set_log_level",
    "plan_cache_info",
    "version",
    "workspace_size",
    "torch",
]


def _torch_wants_grad(q, k, v) -> bool:
    if not any(getattr(x, "requires_grad", False) for x in (q, k, v)):
        return False
    import torch

    return torch.is_grad_enabled()


def _torch_attention(*args, **kwargs):
    # Importing strideattn.torch registers its autograd attention in place of this loader.
    import importlib

    return importlib.import_module(".torch", __name__).attention(*args, **kwargs)


# A GPU is visible but a GPU backend asked for is not in this build: a warning, once.
_build_info.warn_if_gpu_backends_missing()

# PyTorch tensors that require grad go to strideattn.torch's autograd op, loaded on first use.
_core.register_autograd("torch", _torch_wants_grad, _torch_attention)


def __getattr__(name):
    # `strideattn.torch` is loaded lazily so that importing strideattn never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'strideattn' has no attribute {name!r}")
