"""What one target forward costs by the number of tokens it verifies (`bench --cost-curve`).

Speculation pays when verifying k tokens costs little more than reading one. On a GPU a forward is
bound by reading the weights and the curve is nearly flat; on a small CPU the matrix products
become compute-bound after a few tokens and the curve climbs, which caps the useful tree size.
"""
from __future__ import annotations

from time import perf_counter

import torch

from ..backends.choose import open_cache

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
    return [{n: min(times) for n, times in samples.items()}
            for samples in CostSampler(models, sizes, context, output_vocabs).rounds(reps)]


class CostSampler:
    """Times forwards of each model by tokens fed, round after round: each round times every size of every model in
    turn, so a drift of the machine's speed hits the sizes and models of one round alike."""

    def __init__(self, models: list[torch.nn.Module], sizes=SIZES, context: int = 256,
                 output_vocabs: list[torch.Tensor | None] | None = None):
        self.sizes, self.context = tuple(sizes), context
        self.kvs = [open_cache(model, "cost", vocab)
                    for model, vocab in zip(models, output_vocabs or [None] * len(models))]
        self.vocabs = [model.get_input_embeddings().weight.shape[0] for model in models]
        with torch.inference_mode():
            for kv, vocab in zip(self.kvs, self.vocabs):
                kv.feed_committed([i % vocab for i in range(context)], keep=1)

    def rounds(self, count: int) -> list[dict[int, list[float]]]:
        """`count` more rounds: per model, per size, the seconds of each round's forward. Each timed forward follows an
        untimed one-token forward of the same model, as most forwards of a run follow a plain step or a draft level. A
        forward right after a larger one runs slower (on a 2-core Xeon held to AVX2, the 1.5B's one token after 16
        took 64 ms against 59 after one, with no page fault). Timed in turn, each round's one-token forward came right
        after the last round's largest, and two tokens cost 0.93-1.05 times one, where a run's own forwards took
        1.16."""
        samples = [{n: [] for n in self.sizes} for _ in self.kvs]
        for _ in range(count):
            for model, seconds in enumerate(samples):
                for n in self.sizes:
                    seconds[n].append(self.seconds(n, model))
        return samples

    def seconds(self, n: int, model: int = 0) -> float:
        """One forward of n tokens of the `model`-th model, timed after an untimed one-token forward (rounds())."""
        kv, vocab = self.kvs[model], self.vocabs[model]
        with torch.inference_mode():
            self._forward(kv, vocab, 1)
            started = perf_counter()
            self._forward(kv, vocab, n)
            return perf_counter() - started

    def _forward(self, kv, vocab: int, n: int) -> None:
        """A root and n - 1 children after the context, then dropped."""
        visible = torch.eye(n, dtype=torch.bool)
        visible[:, 0] = True
        kv.forward([(self.context + i) % vocab for i in range(n)], [self.context] + [self.context + 1] * (n - 1),
                   visible)
        kv.commit([])


def format_curve(curve: dict[int, float]) -> str:
    one = curve[min(curve)]
    lines = ["tokens fed  ms per forward  x one token  ms per token",
             "----------  --------------  -----------  ------------"]
    lines += [f"{n:<10}  {s * 1e3:<14.1f}  {s / one:<11.2f}  {s * 1e3 / n:.1f}" for n, s in sorted(curve.items())]
    return "\n".join(lines)
