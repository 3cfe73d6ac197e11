"""PagedKVCache: a paged KV cache for inference with PyTorch tensors, in the spirit of
TransformerEngine's InferenceParams: one object holds the caches of every layer (allocated on
a layer's first use, keyed by its layer_number), the pages of each of `batch_size` sequences,
the block table and the lengths. A step is `pre_step(n)` (n new tokens for every sequence:
pages are allocated, the lengths advance) followed by each layer's call of
DotProductAttention(..., inference_params=cache), which appends the layer's new k / v and
attends over the cache in one strideattn.attention_with_kvcache call. Forward only.

The block table and the lengths are int32 tensors on the cache's device; the page allocator
keeps a host mirror of both and copies them to the device once per step."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ._kvcache import attention_with_kvcache
from ._util import describe, int64

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Paged K/V caches for `batch_size` sequences of up to `max_seqlen` tokens each.

    Each layer's caches are [num_pages, page_size, num_kv_heads, head_dim] (head_dim_v for V)
    in `dtype` on `device`; num_pages defaults to enough for every sequence at max_seqlen.
    Attributes: block_table (int32 [batch_size, max_pages], -1 past a sequence's pages),
    cache_seqlens (int32 [batch_size]: the tokens cached before the current step, what a
    layer's call appends after), sequence_lengths (host list: the tokens after the step),
    step_len (the current step's new tokens per sequence)."""

    def __init__(
        self,
        batch_size: int,
        max_seqlen: int,
        num_kv_heads: int,
        head_dim: int,
        head_dim_v: Optional[int] = None,
        *,
        page_size: int = 16,
        num_pages: Optional[int] = None,
        dtype: torch.dtype = torch.float16,
        device: Union[str, torch.device] = "cpu",
    ):
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("max_seqlen", max_seqlen, 1),
            ("num_kv_heads", num_kv_heads, 1),
            ("head_dim", head_dim, 1),
            ("page_size", page_size, 1),
        ):
            if int64(value, name) < low:
                raise ValueError(f"{name} is {value}; supported: >= {low}")
        if not 1 <= page_size <= 256:
            raise ValueError(f"page_size is {page_size}; supported: 1 to 256 tokens per page")
        self.batch_size, self.max_seqlen = int(batch_size), int(max_seqlen)
        self.num_kv_heads, self.head_dim = int(num_kv_heads), int(head_dim)
        self.head_dim_v = int(head_dim if head_dim_v is None else head_dim_v)
        self.page_size = int(page_size)
        self.max_pages = -(-self.max_seqlen // self.page_size)
        self.num_pages = int(
            self.batch_size * self.max_pages if num_pages is None else int64(num_pages, "num_pages")
        )
        if self.num_pages < 1:
            raise ValueError(f"num_pages is {num_pages}; supported: >= 1")
        self.dtype, self.device = dtype, torch.device(device)
        self._layers: Dict[int, Tuple[Tensor, Tensor]] = {}
        self._free: List[int] = list(range(self.num_pages))
        self._pages: List[List[int]] = [[] for _ in range(self.batch_size)]
        self._lens = [0] * self.batch_size  # after the current step
        self.step_len = 0
        self.block_table = torch.full(
            (self.batch_size, self.max_pages), -1, dtype=torch.int32, device=self.device
        )
        self.cache_seqlens = torch.zeros(self.batch_size, dtype=torch.int32, device=self.device)

    # ------------------------------------------------------------------ pages and steps

    @property
    def sequence_lengths(self) -> List[int]:
        """Tokens in each sequence once the current step's are appended."""
        return list(self._lens)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def layer(self, layer_number: int = 1) -> Tuple[Tensor, Tensor]:
        """The (k_cache, v_cache) of a layer, allocated (zeros) on first use."""
        if layer_number not in self._layers:
            shape = (self.num_pages, self.page_size, self.num_kv_heads)
            self._layers[layer_number] = (
                torch.zeros(shape + (self.head_dim,), dtype=self.dtype, device=self.device),
                torch.zeros(shape + (self.head_dim_v,), dtype=self.dtype, device=self.device),
            )
        return self._layers[layer_number]

    def pre_step(self, step_len: int = 1) -> None:
        """Starts a step of `step_len` new tokens for every sequence (1: decode; the prompt
        length: prefill): the tokens so far become cache_seqlens, pages are allocated for
        the new ones, and block_table / cache_seqlens are copied to the device."""
        step_len = int64(step_len, "step_len")
        if step_len < 0:
            raise ValueError(f"step_len is {step_len}; supported: >= 0")
        before = list(self._lens)
        needs, free = [], len(self._free)  # checked for every sequence before any allocation
        for n in range(self.batch_size):
            after = before[n] + step_len
            if after > self.max_seqlen:
                raise ValueError(
                    f"sequence {n} would hold {after} tokens; supported: at most max_seqlen "
                    f"{self.max_seqlen} (release() it, or make the cache larger)"
                )
            needs.append(-(-after // self.page_size) - len(self._pages[n]))
            if needs[-1] > free:
                raise ValueError(
                    f"sequence {n} needs {needs[-1]} more pages but {free} of "
                    f"{self.num_pages} are free; supported: num_pages large enough for the "
                    "sequences' tokens"
                )
            free -= needs[-1]
        for n, need in enumerate(needs):
            for _ in range(need):
                self._pages[n].append(self._free.pop(0))
        self._lens = [b + step_len for b in before]
        self.step_len = step_len
        self._sync(before)

    def release(self, sequence: int) -> None:
        """Empties a sequence (continuous batching: a finished request's slot is reused):
        its pages return to the free list and its length becomes 0."""
        n = int64(sequence, "sequence")
        if not 0 <= n < self.batch_size:
            raise ValueError(f"sequence is {n}; supported: 0 to {self.batch_size - 1}")
        self._free.extend(self._pages[n])
        self._pages[n] = []
        self._lens[n] = 0
        self._sync([min(b, l) for b, l in zip(self._before(), self._lens)])

    def _before(self) -> List[int]:
        return [int(x) for x in self.cache_seqlens.tolist()]

    def _sync(self, before: Sequence[int]) -> None:
        table = torch.full((self.batch_size, self.max_pages), -1, dtype=torch.int32)
        for n, pages in enumerate(self._pages):
            if pages:
                table[n, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_table.copy_(table)
        self.cache_seqlens.copy_(torch.tensor(list(before), dtype=torch.int32))

    # ------------------------------------------------------------------ data

    def _slots(self, n: int, start: int, stop: int) -> Tuple[Tensor, Tensor]:
        t = torch.arange(start, stop)
        pages = torch.tensor(self._pages[n], dtype=torch.long)[t // self.page_size]
        return pages.to(self.device), (t % self.page_size).to(self.device)

    def append(self, k: Tensor, v: Tensor, layer_number: int = 1) -> None:
        """Writes a step's k, v ([batch_size, step_len, kv_heads, d], bshd) into the layer's
        caches without attending (e.g. after a prefill computed some other way)."""
        kc, vc = self.layer(layer_number)
        want_k = (self.batch_size, self.step_len, self.num_kv_heads, self.head_dim)
        want_v = want_k[:3] + (self.head_dim_v,)
        for name, x, want in (("k", k, want_k), ("v", v, want_v)):
            if tuple(x.shape) != want:
                raise ValueError(
                    f"{name} is {describe(x)}; supported: shape {want} "
                    "([batch_size, step_len, kv_heads, head_dim]) after pre_step(step_len)"
                )
        before = self._before()
        for n in range(self.batch_size):
            pages, slots = self._slots(n, before[n], before[n] + self.step_len)
            kc[pages, slots] = k[n].to(kc.dtype)
            vc[pages, slots] = v[n].to(vc.dtype)

    def read(self, sequence: int, layer_number: int = 1) -> Tuple[Tensor, Tensor]:
        """Sequence n's cached keys and values of a layer, [length, kv_heads, d] (copies),
        the current step's tokens included once a layer call (or append) wrote them."""
        n = int64(sequence, "sequence")
        if not 0 <= n < self.batch_size:
            raise ValueError(f"sequence is {n}; supported: 0 to {self.batch_size - 1}")
        kc, vc = self.layer(layer_number)
        pages, slots = self._slots(n, 0, self._lens[n])
        return kc[pages, slots], vc[pages, slots]

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer_number: int = 1,
        *,
        mask: str = "causal_bottom_right",
        window: Any = None,
        scale: Optional[float] = None,
        backend: str = "auto",
    ) -> Tensor:
        """Appends this step's k, v (bshd [batch_size, step_len, kv_heads, d]) to the layer's
        caches and attends q (bshd [batch_size, step_len, heads, d_qk]) over each sequence's
        cached tokens: strideattn.attention_with_kvcache. Returns O [b, step_len, h, d_v]."""
        if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
            raise ValueError(
                f"q, k, v have batch/seq extents {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
                f"{tuple(v.shape[:2])}; supported: one step, [batch_size, step_len] for all three"
            )
        if tuple(k.shape[:2]) != (self.batch_size, self.step_len):
            raise ValueError(
                f"k has {tuple(k.shape[:2])} [batch, new tokens]; this step is "
                f"({self.batch_size}, {self.step_len}) (pre_step(step_len) starts a step)"
            )
        kc, vc = self.layer(layer_number)
        with torch.no_grad():
            return attention_with_kvcache(
                q, kc, vc, k, v,
                cache_seqlens=self.cache_seqlens, block_table=self.block_table,
                mask=mask, window=window, scale=scale, backend=backend,
            )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(batch_size={self.batch_size}, max_seqlen={self.max_seqlen}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"head_dim_v={self.head_dim_v}, page_size={self.page_size}, "
            f"num_pages={self.num_pages}, free_pages={self.free_pages}, "
            f"layers={sorted(self._layers)})"
        )
