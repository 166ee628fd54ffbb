"""A transformers causal LM over a static cache, for torch.compile and CUDA graphs (fixed shapes, fixed addresses).

It preallocates `static_len` entries, pads each feed to a bucket size, attends over the whole buffer under a mask,
and commits by moving the chosen slots in place.
"""
from __future__ import annotations

import torch

from .interface import BUCKETS, bucket
from ..cpu.matmul import installed
from .dynamic import additive_mask
from .kv import KVModel, cache_layers


class StaticKV(KVModel):
    def __init__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None, *,
                 static_len: int, compiled=None):
        """compiled: a compiled copy of the model (or of its body, with output_vocab) for bucket-sized feeds."""
        self.static_len = static_len
        self.compiled = compiled
        self.fast = compiled is None and installed(model)       # see specviz/cpu/matmul.py
        super().__init__(model, name, output_vocab, scores_here=self.fast)

    def reset(self) -> None:
        from transformers import StaticCache
        if isinstance(getattr(self, "cache", None), StaticCache):
            self.cache.reset()      # zeroed in place: CUDA graphs keep reading the addresses they recorded
        else:
            self.cache = StaticCache(config=self.model.config, max_cache_len=self.static_len)
            self.cache.early_initialization(1, self.kv_heads, self.head_dim, self.dtype, self.device)
        super().reset()

    def _feed(self, tokens: list[int], positions: list[int], visible: torch.Tensor, keep: int) -> torch.Tensor:
        """Pad the feed to its bucket (pad tokens repeat the last one and see only the prefix and
        themselves), write it after the cache's length, then set the length past the real tokens:
        the next feed overwrites the padding, and the mask never shows it."""
        n, size = len(tokens), bucket(len(tokens))
        start = self.committed + self.pending
        if start + size > self.static_len:
            raise ValueError(f"{self.name}: {start + size} cache entries needed, the static cache holds "
                             f"{self.static_len}")
        allowed = torch.zeros(size, self.static_len, dtype=torch.bool)
        allowed[:, :self.committed] = True
        allowed[:n, self.committed:start + n] = visible
        pads = torch.arange(n, size)
        allowed[pads, start + pads] = True
        ids = torch.tensor([tokens + tokens[-1:] * (size - n)], device=self.device)
        pos = torch.tensor([positions + positions[-1:] * (size - n)], device=self.device)
        run = self.compiled if self.compiled is not None and size in BUCKETS else self._body
        if run is self.compiled:    # a new step for CUDA graphs: earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        out = run(input_ids=ids, position_ids=pos, attention_mask=additive_mask(allowed, self.dtype, self.device),
                  past_key_values=self.cache, use_cache=True)
        self._logged(n)
        self._set_length(self.committed + self.pending)
        logits = self._logits(out, n)
        # CUDA graphs write every replay's output into the same memory, and a drafter keeps the logits
        # of earlier feeds for later levels: keep a copy, not a view of the graph's output
        return (logits.clone() if run is self.compiled else logits)[-keep:]

    def compile_buckets(self) -> None:
        """Feed every bucket size once, so the compiled model compiles now rather than mid-run."""
        self.feed_committed([0])
        for size in BUCKETS:
            self.forward([0] * size, [1] * size, torch.ones(size, size, dtype=torch.bool).tril())
            self.commit([])

    def _set_length(self, length: int) -> None:
        for layer in cache_layers(self.cache):
            layer.cumulative_length.fill_(length)

    def _keep(self, slots: list[int]) -> None:
        """Move the kept entries down in place: a static cache keeps its addresses (CUDA graphs read them)."""
        end = self.committed + len(slots)
        if slots != list(range(len(slots))):
            index = torch.tensor([self.committed + s for s in slots], device=self.device)
            for layer in cache_layers(self.cache):
                layer.keys[:, :, self.committed:end] = layer.keys[:, :, index]
                layer.values[:, :, self.committed:end] = layer.values[:, :, index]
        self._set_length(end)
