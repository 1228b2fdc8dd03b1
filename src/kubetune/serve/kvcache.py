"""The running batch as tensors: its rows' left-padded attention mask, next positions and KV cache.

The engine (:mod:`kubetune.serve.engine`) keeps one :class:`_Batch`; rows leave it with :meth:`_Batch.select`
(finished, cancelled or preempted) and newcomers join with :meth:`_Batch.join` after their prefill. This
module also hides how a transformers cache stores its layers (``layers`` since 4.56, ``key_cache`` and
``value_cache`` before).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import _Row


@dataclass
class _Batch:
    """Running rows, their left-padded attention mask, next positions, and their KV cache."""

    rows: list[_Row]
    cache: Any  # a transformers DynamicCache: per layer, keys and values of shape (batch, heads, length, dim)
    mask: Any  # (batch, length): 1 for real tokens
    next_pos: Any  # (batch,): position id of each row's next token

    def select(self, keep: list[int]) -> "_Batch":
        """Only the rows at ``keep``; columns that are padding in every remaining row are dropped."""
        import torch

        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        rows = [self.rows[i] for i in keep]
        if not rows:
            return _Batch(rows=[], cache=None, mask=mask, next_pos=self.next_pos[:0])
        first = int(mask.any(dim=0).int().argmax())  # first column some row still uses
        cache = [(k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in _layers(self.cache)]
        return _Batch(rows=rows, cache=_cache_from(cache), mask=mask[:, first:], next_pos=self.next_pos.index_select(0, idx))

    def join(self, other: "_Batch") -> "_Batch":
        """This batch and ``other`` as one: the shorter cache is left-padded to the longer one."""
        import torch

        a, b = self.mask.shape[1], other.mask.shape[1]
        width = max(a, b)

        def pad(t, n: int):
            if n == 0:
                return t
            shape = list(t.shape)
            shape[-2 if t.dim() == 4 else -1] = n
            return torch.cat([t.new_zeros(shape), t], dim=-2 if t.dim() == 4 else -1)

        cache = [
            (torch.cat([pad(k1, width - a), pad(k2, width - b)]), torch.cat([pad(v1, width - a), pad(v2, width - b)]))
            for (k1, v1), (k2, v2) in zip(_layers(self.cache), _layers(other.cache))
        ]
        mask = torch.cat([pad(self.mask, width - a), pad(other.mask, width - b)])
        return _Batch(rows=self.rows + other.rows, cache=_cache_from(cache), mask=mask, next_pos=torch.cat([self.next_pos, other.next_pos]))


def _layers(cache: Any) -> list[tuple[Any, Any]]:
    """A transformers cache as (keys, values) per layer."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in zip(cache.key_cache, cache.value_cache)]  # transformers < 4.56


def _cache_from(layers: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(layers)
