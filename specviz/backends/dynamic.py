"""Any transformers causal LM over a dynamic cache that grows with each feed.

A tree feed passes its ancestor mask to transformers' attention; a commit cuts the cache's tensors to the kept
entries. A float32 model on a CPU multiplies a few rows by the engine's products (specviz/cpu/matmul.py).
"""
from __future__ import annotations

import functools
import inspect

import torch

from ..cpu.matmul import engine_products, installed
from .kv import KVModel, cache_layers


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, n, entries] float mask: 0 where allowed, the dtype's minimum elsewhere (eager attention adds it, so it
    cannot be boolean)."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class DynamicKV(KVModel):
    def __init__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None):
        self.fast = installed(model)
        super().__init__(model, name, output_vocab, scores_here=self.fast)

    def reset(self) -> None:
        from transformers import DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        super().reset()

    def _feed(self, tokens: list[int], positions: list[int], visible: torch.Tensor, keep: int) -> torch.Tensor:
        n = len(tokens)
        ids = torch.tensor([tokens], device=self.device)
        pos = torch.tensor([positions], device=self.device)
        rows = {"logits_to_keep": keep} if self.head is None and self._keeps_logits else {}
        with engine_products(self.fast):
            out = self._body(input_ids=ids, position_ids=pos, attention_mask=self._mask(visible),
                             past_key_values=self.cache, use_cache=True, **rows)
        self._logged(n)
        return self._logits(out, n, keep)

    @functools.cached_property
    def _keeps_logits(self) -> bool:
        """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do)."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _mask(self, visible: torch.Tensor) -> torch.Tensor | None:
        """Additive float mask [1, 1, n, cache + n], or None when it would be plain causal: then attention takes its
        fast path (no mask tensor, and no copy of the KV heads for grouped-query attention)."""
        n = visible.shape[0]
        if torch.equal(visible, torch.ones(visible.shape, dtype=torch.bool).tril(self.pending)):
            return None
        allowed = torch.ones(n, self.committed + self.pending + n, dtype=torch.bool)
        allowed[:, self.committed:] = visible
        return additive_mask(allowed, self.dtype, self.device)

    def _keep(self, slots: list[int]) -> None:
        """Cut the tensors to the kept entries (a view when the slots are a chain from the start)."""
        if slots == list(range(len(slots))):
            keep = slice(0, self.committed + len(slots))

            def select(t: torch.Tensor) -> torch.Tensor:
                return t[:, :, keep]
        else:
            index = torch.tensor(list(range(self.committed)) + [self.committed + s for s in slots], device=self.device)

            def select(t: torch.Tensor) -> torch.Tensor:
                return t.index_select(-2, index)
        for layer in cache_layers(self.cache):
            layer.keys, layer.values = select(layer.keys), select(layer.values)
