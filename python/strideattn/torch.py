"""strideattn.torch: PyTorch autograd for strideattn.

- `attention(q, k, v, ...)`: differentiable attention over any strided views (e.g. the
  `split` of a fused QKV projection, passed straight in), an autograd function over
  torch.library ops that works under torch.compile and CUDA graph capture
  (strideattn/_torch_ops.py).
- `DotProductAttention`: a module that takes TransformerEngine's DotProductAttention
  arguments (strideattn/_torch_module.py).
- `PagedKVCache`: a paged KV cache for inference (every layer's caches, the pages, block
  table and lengths of a batch), which DotProductAttention takes as inference_params
  (strideattn/_torch_kvcache.py).
- `cp_attention`, `cp_shard`, `cp_unshard`: context parallelism, one sequence split over
  the ranks of a torch.distributed group (strideattn/_torch_cp.py).

Importing this module needs torch; `import strideattn` alone does not import it."""

from ._torch_module import DotProductAttention
from ._torch_kvcache import PagedKVCache
from ._torch_cp import cp_attention, cp_shard, cp_unshard
from ._torch_ops import attention

__all__ = [
    "attention",
    "DotProductAttention",
    "PagedKVCache",
    "cp_attention",
    "cp_shard",
    "cp_unshard",
]
