"""Seeing that speculation is lossless: sample the next token many times, with plain decoding and with
a speculative strategy, and test both against each other and against the target's own distribution.

A sample is the first token that a fresh generation (seed + i) commits in its first round, so every
sample goes through drafting and verification. Pearson's chi-square test then asks whether the two
sets of counts could come from one distribution (homogeneity), and whether each follows the
target's distribution (goodness of fit). Cells expected to hold fewer than 5 samples are pooled into
"other", the usual rule for the chi-square approximation.

Greedy decoding is deterministic: there the check is that each race lane's tokens equal plain
decoding's, token by token (`greedy_diff`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ..decode.sampling import Sampling, logits_to_probs

MIN_EXPECTED = 5.0
OTHER = -1          # the pooled cell


@dataclass
class ChiSquare:
    statistic: float
    df: int
    p_value: float

    def describe(self) -> str:
        return f"χ² = {self.statistic:.1f}, {self.df} degrees of freedom, p = {self.p_value:.3g}"


def first_tokens(new_decoder: Callable[[int], object], n: int, seed: int = 0) -> Iterator[int]:
    """The first committed token of n generations; new_decoder(seed) builds a fresh decoder."""
    for i in range(n):
        yield new_decoder(seed + i).step().committed_tokens[0]


@torch.inference_mode()
def next_token_distribution(model: torch.nn.Module, prompt_ids: list[int], sampling: Sampling) -> torch.Tensor:
    """The target's distribution of the first new token under these sampling settings."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([prompt_ids], device=device)).logits[0, -1:]
    return logits_to_probs(logits.cpu(), sampling)[0]


def p_value(statistic: float, df: int) -> float:
    """Upper tail of the chi-square distribution: Q(df/2, statistic/2)."""
    if df <= 0:
        return 1.0
    if statistic == float("inf"):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def _pool(expected: dict[int, float]) -> dict[int, int]:
    """Cell of each category: itself where it expects >= MIN_EXPECTED samples, else OTHER; an OTHER
    that is itself too small joins the smallest kept cell."""
    kept = sorted((c for c, e in expected.items() if e >= MIN_EXPECTED), key=lambda c: -expected[c])
    cells = {c: (c if c in kept else OTHER) for c in expected}
    other = sum(e for c, e in expected.items() if cells[c] == OTHER)
    if kept and 0 < other < MIN_EXPECTED:
        cells = {c: (kept[-1] if cell == OTHER else cell) for c, cell in cells.items()}
    return cells


def homogeneity(a: Counter, b: Counter) -> ChiSquare:
    """Could counts `a` and `b` come from the same distribution?"""
    na, nb = sum(a.values()), sum(b.values())
    total = na + nb
    if not na or not nb:
        return ChiSquare(0.0, 0, 1.0)
    pooled = a + b
    cells = _pool({c: pooled[c] * min(na, nb) / total for c in pooled})
    ca, cb, cp = Counter(), Counter(), Counter()
    for c in pooled:
        ca[cells[c]] += a[c]
        cb[cells[c]] += b[c]
        cp[cells[c]] += pooled[c]
    statistic = 0.0
    for cell, count in cp.items():
        for observed, n in ((ca[cell], na), (cb[cell], nb)):
            expected = count * n / total
            statistic += (observed - expected) ** 2 / expected
    return ChiSquare(statistic, len(cp) - 1, p_value(statistic, len(cp) - 1))


def goodness_of_fit(counts: Counter, probs: torch.Tensor) -> ChiSquare:
    """Do `counts` follow `probs`? A sampled token the distribution gives no chance fails outright."""
    n = sum(counts.values())
    if not n:
        return ChiSquare(0.0, 0, 1.0)
    support = torch.nonzero(probs > 0).flatten().tolist()
    expected = {t: n * float(probs[t]) for t in support}
    if any(t not in expected for t in counts):
        return ChiSquare(float("inf"), max(1, len(expected) - 1), 0.0)
    cells = _pool(expected)
    observed, wanted = Counter(), Counter()
    for t, e in expected.items():
        observed[cells[t]] += counts.get(t, 0)
        wanted[cells[t]] += e
    statistic = sum((observed[c] - wanted[c]) ** 2 / wanted[c] for c in wanted if wanted[c] > 0)
    df = len(wanted) - 1
    return ChiSquare(statistic, df, p_value(statistic, df))


def greedy_diff(lanes: dict[str, list[int]], reference: str = "baseline") -> dict[str, str]:
    """Per lane: how its tokens compare with the reference lane's, in words."""
    base = lanes[reference]
    out = {}
    for name, tokens in lanes.items():
        if name == reference:
            continue
        same = sum(x == y for x, y in zip(tokens, base))
        first = next((i for i, (x, y) in enumerate(zip(tokens, base)) if x != y), None)
        if first is None and len(tokens) == len(base):
            out[name] = f"all {len(base)} tokens identical"
        elif first is None:
            out[name] = (f"identical for {min(len(tokens), len(base))} tokens, then one lane stopped "
                         f"({len(tokens)} vs {len(base)})")
        else:
            out[name] = f"{same} of {len(base)} tokens equal; first difference at token {first + 1}"
    return out
