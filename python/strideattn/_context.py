"""The caller's framework as the entry points see it: a tensor's element strides, whether it
lives on a GPU, the context of a call (framework, device, stream, allocation of outputs in the
caller's framework and dimension order) and the checks every tensor argument passes."""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

from . import _checks
from ._util import UnsupportedError, describe, framework


def _np():
    import numpy

    return numpy


def _element_strides(x: Any, fw: str) -> Optional[Sequence[int]]:
    """Strides in elements, or None where the framework has no strides (JAX: row-major)."""
    if fw == "torch":
        return tuple(x.stride())
    if fw in ("numpy", "cupy"):
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise ValueError(
                f"tensor strides {tuple(x.strides)} (bytes) are not multiples of the element "
                f"size {item}; DLPack needs element strides"
            )
        return tuple(s // item for s in x.strides)
    return None


def _is_cuda(x: Any, fw: str) -> bool:
    if fw == "torch":
        return x.device.type == "cuda"
    if fw == "cupy":
        return True
    if fw == "jax":
        return any(d.platform == "gpu" for d in x.devices())
    if hasattr(x, "__dlpack_device__"):
        return x.__dlpack_device__()[0] in (2, 13)
    return False


class _Context:
    """Where a call runs and how its outputs are made: the framework of `like` (the first
    input), its device, the stream to use, and allocation in that framework."""

    def __init__(self, like: Any):
        self.fw = framework(like)
        self.like = like
        self.cuda = _is_cuda(like, self.fw)
        self.stream = 0
        self.sync_after = False
        self._device_ctx = contextlib.nullcontext()
        if self.fw == "torch" and self.cuda:
            import torch

            self._device_ctx = torch.cuda.device(like.device)
            self.stream = torch.cuda.current_stream(like.device).cuda_stream
        elif self.fw == "cupy":
            import cupy

            self._device_ctx = like.device
            with like.device:
                self.stream = cupy.cuda.get_current_stream().ptr
        elif self.fw == "jax" and self.cuda:
            # JAX has no current stream to share: wait for the inputs, run on the legacy
            # default stream, and wait for the result before JAX sees it.
            self.sync_after = True
            dev = next(iter(like.devices()))
            try:
                import torch

                self._device_ctx = torch.cuda.device(
                    getattr(dev, "local_hardware_id", None) or dev.id
                )
            except ImportError:
                pass
        elif self.fw == "other" and self.cuda:
            self.sync_after = True

    def device_scope(self):
        return self._device_ctx

    def prepare(self, x: Any) -> Any:
        """What is handed to the extension for tensor x (no copies)."""
        fw = framework(x)
        if fw == "torch":
            return x.detach()
        if fw == "jax":
            x.block_until_ready()
        return x

    def empty(self, shape: Sequence[int], dtype: Any, order: Sequence[int], zero: bool) -> Any:
        """A new tensor of logical `shape`, laid out with dims `order` outermost first."""
        shape = tuple(int(s) for s in shape)
        phys = tuple(shape[i] for i in order)
        inverse = [0] * len(order)
        for pos, dim in enumerate(order):
            inverse[dim] = pos
        fw = self.fw
        if fw == "numpy" or (fw == "other" and not self.cuda):
            np = _np()
            dt = np.float32 if dtype == "float32" else dtype
            make = np.zeros if zero else np.empty
            return make(phys, dtype=dt).transpose(inverse)
        if fw == "torch":
            import torch

            dt = torch.float32 if dtype == "float32" else dtype
            make = torch.zeros if zero else torch.empty
            return make(phys, dtype=dt, device=self.like.device).permute(inverse)
        if fw == "cupy":
            import cupy

            dt = cupy.float32 if dtype == "float32" else dtype
            with self.like.device:
                make = cupy.zeros if zero else cupy.empty
                return make(phys, dtype=dt).transpose(inverse)
        if fw == "jax":
            return self._jax_staging(shape, dtype)
        raise ValueError(
            f"cannot allocate outputs for a {type(self.like).__module__}.{type(self.like).__name__} "
            "on a GPU; pass out= (and dq=, dk=, dv=) tensors"
        )

    def _jax_staging(self, shape, dtype):
        # JAX arrays are immutable: compute into a PyTorch (or CuPy) buffer on the same GPU,
        # then hand it to JAX through DLPack in finish().
        import jax.numpy as jnp

        name = "float32" if dtype == "float32" else jnp.dtype(dtype).name
        if not self.cuda:  # JAX on the CPU: a numpy buffer (ml_dtypes gives numpy bfloat16)
            return ("staged", _np().zeros(shape, dtype=jnp.dtype(name)))
        dev = next(iter(self.like.devices()))
        dev_id = getattr(dev, "local_hardware_id", None)
        if dev_id is None:
            dev_id = dev.id
        try:
            import torch

            return (
                "staged",
                torch.zeros(shape, dtype=getattr(torch, name), device=f"cuda:{dev_id}"),
            )
        except ImportError:
            import cupy

            if name == "bfloat16":
                raise UnsupportedError(
                    "bfloat16 JAX outputs need PyTorch installed (CuPy has "
                    "no bfloat16); use float16/float32 or install torch"
                ) from None
            with cupy.cuda.Device(dev_id):
                return ("staged", cupy.zeros(shape, dtype=name))

    def as_ext(self, x: Any) -> Any:
        """The object the extension reads for an output allocated by empty()."""
        return x[1] if isinstance(x, tuple) else x

    def finish(self, x: Any) -> Any:
        if self.sync_after:
            _device_synchronize()
        if isinstance(x, tuple):
            import jax.dlpack

            if type(x[1]).__module__ == "numpy":
                import jax.numpy as jnp

                return jnp.asarray(x[1])
            return jax.dlpack.from_dlpack(x[1])
        return x


def _device_synchronize() -> None:
    try:
        import torch

        torch.cuda.synchronize()
        return
    except ImportError:
        pass
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _dtype_of(x: Any) -> Any:
    return x.dtype


def _check_tensor(x: Any, name: str, writable: bool = False) -> None:
    if x is None:
        raise ValueError(f"{name} is required")
    fw = framework(x)
    if not (hasattr(x, "__dlpack__") or fw == "numpy"):
        raise ValueError(
            f"{name} must be a DLPack-capable tensor (numpy, torch, cupy, jax), got {describe(x)}"
        )
    if fw == "numpy":
        _checks.numpy_array(x, name, writable)
    if fw in ("numpy", "cupy"):
        _element_strides(x, fw)
    if writable:
        if fw == "numpy" and not x.flags.writeable:
            raise ValueError(f"{name} is a read-only numpy array; outputs must be writable")
        if fw == "jax":
            raise ValueError(
                f"{name}: JAX arrays are immutable and cannot be outputs; "
                "leave it out to get a new array"
            )


def _shape(x: Any) -> tuple:
    return tuple(int(s) for s in x.shape)
