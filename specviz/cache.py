"""A causal LM with its KV cache: feed a tree of tokens, then keep only the accepted path.

The cache always starts with `committed` entries that every new token may attend to. A tree
forward appends one entry per fed token after those (its "slot"); `commit(slots)` then gathers the
chosen slots to sit contiguously after the committed prefix and drops everything else. Cropping
alone would be wrong: accepted nodes need not be a suffix of what was fed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardLog:
    """Token counts of each forward pass and the KV entries each attended over (for bytes read)."""
    tokens: list[int] = field(default_factory=list)
    kv_entries: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens.clear()
        self.kv_entries.clear()


class KVModel:
    """`output_vocab` (token ids): compute logits for these tokens only and give every other token
    -inf. For a draft trained over a subset of the vocabulary this skips most of its output layer,
    which dominates a small model's cost; its distribution stays a proper one (over the subset)."""

    def __init__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None):
        self.model = model
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.head = None
        if output_vocab is not None:
            weight = model.get_output_embeddings().weight
            self.output_vocab = output_vocab.to(self.device)
            self.head = weight[self.output_vocab].contiguous()
            self.weight_bytes -= (weight.shape[0] - len(output_vocab)) * weight.shape[1] * weight.element_size()
        config = model.config
        layers = getattr(config, "num_hidden_layers", None) or config.n_layer
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.kv_bytes_per_entry = 2 * layers * kv_heads * head_dim * self.dtype.itemsize
        self.log = ForwardLog()
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        self.committed = 0          # cache entries that are committed tokens
        self.pending = 0            # tree entries fed since the last commit

    @property
    def length(self) -> int:
        return self.committed + self.pending

    def forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor) -> torch.Tensor:
        """Feed tokens; return their logits [n, vocab].

        visible: bool [n, pending + n], which uncommitted entries (earlier tree slots and the new
        tokens themselves) each new token attends to; the committed prefix is always visible.
        """
        n = len(tokens)
        ids = torch.tensor([tokens], device=self.device)
        pos = torch.tensor([positions], device=self.device)
        body = self.model if self.head is None else self.model.base_model
        out = body(input_ids=ids, position_ids=pos, attention_mask=self._mask(visible),
                   past_key_values=self.cache, use_cache=True)
        self.log.tokens.append(n)
        self.log.kv_entries.append(self.committed + self.pending + n)
        self.pending += n
        if self.head is None:
            return out.logits[0]
        logits = torch.full((n, self.model.config.vocab_size), float("-inf"), dtype=self.dtype, device=self.device)
        logits[:, self.output_vocab] = out.last_hidden_state[0] @ self.head.T
        return logits

    def _mask(self, visible: torch.Tensor) -> torch.Tensor | None:
        """Additive float mask [1, 1, n, cache + n] (eager attention adds it, so it cannot be
        boolean), or None when it would be plain causal: then attention takes its fast path
        (no mask tensor, and no copy of the KV heads for grouped-query attention)."""
        n = visible.shape[0]
        if torch.equal(visible, torch.ones(visible.shape, dtype=torch.bool).tril(self.pending)):
            return None
        allowed = torch.ones(n, self.committed + self.pending + n, dtype=torch.bool)
        allowed[:, self.committed:] = visible
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device)

    def feed_committed(self, tokens: list[int]) -> torch.Tensor:
        """Feed tokens that are already part of the output (causal); they join the committed prefix."""
        assert self.pending == 0, "commit the tree before feeding committed tokens"
        n = len(tokens)
        logits = self.forward(tokens, list(range(self.committed, self.committed + n)),
                              torch.ones(n, n, dtype=torch.bool).tril())
        self.committed += n
        self.pending = 0
        return logits

    def commit(self, slots: list[int]) -> None:
        """Keep the committed prefix plus the given tree slots (0-based after the prefix), in order."""
        if slots == list(range(len(slots))):   # the common chain case: a slice, no copy
            keep = slice(0, self.committed + len(slots))
            select = lambda t: t[:, :, keep]
        else:
            index = torch.tensor(list(range(self.committed)) + [self.committed + s for s in slots],
                                 device=self.device)
            select = lambda t: t.index_select(-2, index)
        for layer in self.cache.layers:
            layer.keys, layer.values = select(layer.keys), select(layer.values)
        self.committed += len(slots)
        self.pending = 0
