"""What the decoding core asks of a model's backend, and nothing about how one computes.

The engine and the drafters feed a model trees of tokens and keep the accepted path through a `ModelCache`; they get
the `Backend` that makes one from their caller (the stack, a test, the bench), which chose it and built it with what
it needs. So the core imports no backend: `specviz/backends/choose.py` holds the implementations, for
transformers' models and specviz's CPU forwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

BUCKETS = (1, 2, 4, 8, 16, 32, 64)     # a static cache's feeds are padded to one of these sizes


def bucket(n: int) -> int:
    """The padded size of an n-token feed; a feed larger than every bucket is not padded."""
    return next((b for b in BUCKETS if b >= n), n)


@dataclass
class ForwardLog:
    """Token counts of each forward pass and the KV entries each attended over (for bytes read)."""
    tokens: list[int] = field(default_factory=list)
    kv_entries: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens.clear()
        self.kv_entries.clear()

    def bytes_read(self, costs: tuple) -> float:
        """Memory traffic of these forward passes: the weights once per pass (an untied input embedding a row per
        token fed), plus the KV entries attended. costs: (weight bytes, KV bytes per entry[, bytes per token])."""
        weight, kv, per_token = (*costs, 0)[:3]
        return float(sum(weight + per_token * fed + kv * entries for fed, entries in zip(self.tokens, self.kv_entries)))


class ModelCache(Protocol):
    """One generation's view of a model: its KV cache, `committed` entries of the output so far, then `pending`
    entries of the tree fed since the last commit."""
    model: torch.nn.Module
    name: str
    static_len: int | None           # a static cache's entries (fixed shapes and addresses), None: it grows
    output_vocab: torch.Tensor | None
    committed: int
    pending: int
    log: ForwardLog
    seconds: float                   # spent in forwards since it was made

    def forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor,
                keep: int | None = None) -> torch.Tensor:
        """Feed a tree's tokens (`visible`: which pending entries and new tokens each attends to); their logits."""

    def feed_committed(self, tokens: list[int], keep: int | None = None) -> torch.Tensor:
        """Feed tokens that are part of the output; they join the committed prefix."""

    def read_prompt(self, prompt_ids: list[int]) -> None:
        """Feed a prompt but its last token, which the first round feeds."""

    def commit(self, slots: list[int]) -> None:
        """Keep the committed prefix and these pending slots, in order; drop the rest."""

    def copy_committed(self, other: ModelCache) -> None:
        """Start from a copy of another cache's committed entries (the same model)."""

    def reset(self) -> None:
        """Empty the cache."""

    def costs(self) -> tuple[int, int, int]:
        """(weight bytes read per forward, KV bytes per cached entry, weight bytes per token fed)."""


class Backend(Protocol):
    """Makes a model's cache for one generation. output_vocab: the tokens it predicts (others get -inf);
    static_len: a static cache of this many entries; compiled: a compiled copy of the model, for a static cache."""

    def __call__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None,
                 static_len: int | None = None, compiled=None) -> ModelCache: ...
