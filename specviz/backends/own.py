"""A quantized Llama-family model run by specviz's own forward (specviz/cpu/decoder.py), over its own KV cache.

Every row is computed alone, so a tree feed gives each token the bits plain decoding gives it. A quantized draft may
read long committed feeds (a prompt) through other products of the same layers (specviz/cpu/prompt_reader.py), given
when it is built.
"""
from __future__ import annotations

import torch

from ..cpu.decoder import LlamaForward
from ..cpu.prompt_reader import READ_ROWS, reader_of
from .kv import KVModel


class OwnForwardKV(KVModel):
    def __init__(self, forward: LlamaForward, name: str, output_vocab: torch.Tensor | None = None,
                 prompt_products: list[dict] | None = None, read_from: int = READ_ROWS):
        """forward: the model's own forward (LlamaForward.of); prompt_products: the products feeds of `read_from`
        tokens or more go through (prompt_reader.copies)."""
        self.decoder = forward
        self.reader = None if prompt_products is None else reader_of(self.decoder, prompt_products)
        self.read_from = read_from
        super().__init__(forward.model, name, output_vocab, scores_here=True)

    def reset(self) -> None:
        self.cache = self.decoder.entries()
        super().reset()

    def _feed(self, tokens: list[int], positions: list[int], visible: torch.Tensor, keep: int) -> torch.Tensor:
        decoder = self.reader if self.reader is not None and len(tokens) >= self.read_from else self.decoder
        hidden = decoder.forward(tokens, positions, visible, self.committed, self.cache, keep)
        self._logged(len(tokens))
        return self._scores(hidden)

    def copy_committed(self, other: KVModel) -> None:
        assert other.model is self.model and other.pending == 0 and self.length == 0
        self.cache = other.cache.copy()
        self.committed = other.committed

    def _keep(self, slots: list[int]) -> None:
        self.cache.keep(self.committed, slots)
