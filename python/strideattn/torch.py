"""strideattn.torch: PyTorch autograd for strideattn.

- `attention(q, k, v, ...)`: differentiable attention over any strided views (e.g. the
  `split` of a fused QKV projection, passed straight in), an autograd function over
  torch.library ops that works under torch.compile and CUDA graph capture
  (strideattn/_torch_ops.py).
- `DotProductAttention`: a module that takes TransformerEngine's DotProductAttention
  arguments (strideattn/_torch_module.py).

Importing this module needs torch; `import strideattn` alone does not import it."""

from ._torch_module import DotProductAttention
from ._torch_ops import attention

__all__ = ["attention", "DotProductAttention"]
