"""Sibling 4-bit layers that read the same input (an attention's q, k and v projections, an MLP's gate and
up projections) computed in one kernel call.

On a small CPU a one-token forward of a quantized model spends much of its time outside the products:
each layer call costs Python and a kernel launch, and the small k and v products read their weights
slower than a large one does. Stacking the siblings' rows into one layer halves the calls; each output
row is still computed from its own weights and the input alone (specviz/cpu/c/rows_kernel.c), so every output
is the same bits as before. The transformers modules keep calling q_proj, k_proj and v_proj: the first
call computes all of them for that input, the others take their slices of it.
"""
from __future__ import annotations

import torch

from .int4 import Int4Linear

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Stacked(torch.nn.Module):
    """The siblings' rows in one Int4Linear (its tiles of 4 rows simply concatenated), and the last
    input with its result, so that the siblings' calls on one input make one product."""

    def __init__(self, layers: list[Int4Linear]):
        super().__init__()
        tiles = tuple(torch.cat([getattr(layer, name) for layer in layers]) for name in ("packed", "scales", "zeros"))
        bias = None if all(layer.bias is None for layer in layers) else \
            torch.cat([layer.bias if layer.bias is not None else torch.zeros(layer.out_features) for layer in layers])
        self.layer = Int4Linear.of_tiles(tiles, layers[0].in_features, tiles[0].shape[0], bias, layers[0].group)
        self.siblings = len(layers)
        # (input, output, slices taken): one tuple, so a reader never pairs one call's input with another's
        # output; dropped once every sibling took its slice (a prompt's MLP products are megabytes)
        self._last = None

    def product(self, x: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is None or last[0] is not x:
            last = (x, self.layer(x), [0])
            self._last = last
        last[2][0] += 1
        if last[2][0] >= self.siblings and self._last is last:
            self._last = None
        return last[1]


class Slice(torch.nn.Module):
    """One sibling: its columns of the stacked product."""

    def __init__(self, stacked: Stacked, start: int, end: int, in_features: int):
        super().__init__()
        object.__setattr__(self, "stacked", stacked)       # not a submodule: the parent holds it once
        self.start, self.end = start, end
        self.in_features, self.out_features = in_features, end - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stacked.product(x)[..., self.start:self.end]


def stack_siblings(model: torch.nn.Module) -> int:
    """Stack every set of SIBLINGS that are Int4Linear layers on specviz's kernel, in place; returns how many."""
    stacked = 0
    for parent in list(model.modules()):
        for names in SIBLINGS:
            layers = [getattr(parent, n, None) for n in names]
            if not all(isinstance(layer, Int4Linear) and layer.own and layer.kept == layer.out_features
                       for layer in layers):
                continue
            if len({(layer.in_features, layer.group) for layer in layers}) != 1:
                continue
            shared = Stacked(layers)
            parent.add_module("_".join(n.split("_")[0] for n in names) + "_stacked", shared)
            start = 0
            for name, layer in zip(names, layers):
                setattr(parent, name, Slice(shared, start, start + layer.out_features, layer.in_features))
                start += layer.out_features
            stacked += 1
    return stacked
