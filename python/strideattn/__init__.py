"""strideattn: fused scaled dot-product attention that reads every tensor through its real
strides. Works on any DLPack-capable tensor (numpy on the CPU; PyTorch, CuPy, JAX on the
GPU); `strideattn.torch` adds a PyTorch autograd custom op and a TransformerEngine-style
DotProductAttention module (imported on first use, so torch is not required here)."""

from ._core import (
    MASKS,
    BackendError,
    UnsupportedError,
    attention,
    attention_backward,
    compiled_backends,
    explain,
    version,
)
from ._log import flush_log, get_log_level, set_log_level

__version__ = version()

__all__ = [
    "MASKS",
    "BackendError",
    "UnsupportedError",
    "attention",
    "attention_backward",
    "compiled_backends",
    "explain",
    "flush_log",
    "get_log_level",
    "set_log_level",
    "version",
    "torch",
]


def __getattr__(name):
    # `strideattn.torch` is loaded lazily so that importing strideattn never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'strideattn' has no attribute {name!r}")
