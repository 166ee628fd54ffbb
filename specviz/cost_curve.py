"""What one target forward costs by the number of tokens it verifies (`bench --cost-curve`).

Speculation pays when verifying k tokens costs little more than reading one. On a GPU a forward is
bound by reading the weights and the curve is nearly flat; on a small CPU the matrix products
become compute-bound after a few tokens and the curve climbs, which caps the useful tree size.
"""
from __future__ import annotations

from time import perf_counter

import torch

from .cache import open_cache

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def cost_curve(model: torch.nn.Module, sizes=SIZES, context: int = 256, reps: int = 10) -> dict[int, float]:
    """Seconds per forward of n tree tokens (a root and n-1 children) after `context` committed
    tokens: the fastest of `reps` rounds, the sizes interleaved within each round so that machine
    noise hits them alike."""
    return cost_curves([model], sizes, context, reps)[0]


def cost_curves(models: list[torch.nn.Module], sizes=SIZES, context: int = 256, reps: int = 10,
                output_vocabs: list[torch.Tensor | None] | None = None) -> list[dict[int, float]]:
    """cost_curve for several models, interleaved within each round too: on a VM whose memory speed
    drifts by tens of percent over seconds, models timed one after the other are compared at
    different speeds. output_vocabs: per model, the tokens it predicts (a draft's restricted vocabulary)."""
    kvs = [open_cache(model, "cost", vocab) for model, vocab in zip(models, output_vocabs or [None] * len(models))]
    vocabs = [model.get_input_embeddings().weight.shape[0] for model in models]
    best = [dict.fromkeys(sizes, float("inf")) for _ in models]
    with torch.inference_mode():
        for kv, vocab in zip(kvs, vocabs):
            kv.feed_committed([i % vocab for i in range(context)], keep=1)
        for _ in range(reps):
            for kv, vocab, seconds in zip(kvs, vocabs, best):
                for n in sizes:
                    visible = torch.eye(n, dtype=torch.bool)
                    visible[:, 0] = True
                    started = perf_counter()
                    kv.forward([(context + i) % vocab for i in range(n)], [context] + [context + 1] * (n - 1), visible)
                    seconds[n] = min(seconds[n], perf_counter() - started)
                    kv.commit([])
    return best


def format_curve(curve: dict[int, float]) -> str:
    one = curve[min(curve)]
    lines = ["tokens fed  ms per forward  x one token  ms per token",
             "----------  --------------  -----------  ------------"]
    lines += [f"{n:<10}  {s * 1e3:<14.1f}  {s / one:<11.2f}  {s * 1e3 / n:.1f}" for n, s in sorted(curve.items())]
    return "\n".join(lines)
