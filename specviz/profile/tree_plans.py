"""This machine's tree plans: the cost curves measured by prepare, stored once per machine, target, draft and precision
(specviz/profile/store.py), and read back as a TreePlan (specviz/decode/costs.py). Only prepare measures
(auto_choice.decided), on a machine meant to be at rest; a process that generates reads what is stored.

These VMs' speed swings by tens of percent from one second to the next, and alike for every size and model timed in
the same second. A plan depends only on the curves' ratios to each other (a guess's price is the tokens a second a
round makes times the seconds it adds), so each round of timings is scaled by its own total, which takes the swing out,
and each size's curve is the median over the rounds of those shares, times the median round's total. Rounds are added
until every size's median is known to within PRECISION (its standard error, from the rounds' own spread), or up to
MOST_ROUNDS. Curves that never got that precise, or that were timed while other work kept the cores busy, are stored
all the same, marked unsettled: the planner runs from what was measured rather than from a fixed rule, prepare's last
line names them, and the next prepare measures them again.
"""
from __future__ import annotations

from statistics import median

import torch

from . import store as auto_choice
from .cost_curve import CostSampler
from ..decode.costs import CONTEXT, SIZES, TreePlan

WARMUP_ROUNDS = 1       # the first forwards of each size allocate their buffers: never kept
FIRST_ROUNDS = 5        # rounds before the spread is first looked at
MORE_ROUNDS = 4         # ...then added at a time
MOST_ROUNDS = 25        # ...up to this many (about 40 s for the qwen-coder pair on a slow 2-core AVX2 machine)
PRECISION = 0.04        # the standard error a stored median may keep at any size, relative to it
MAD_TO_SE = 1.4826 * 1.2533     # a median absolute deviation to a median's standard error (times 1/sqrt(rounds))


def summarise(samples: list[dict[int, list[float]]]) -> tuple[list[dict[int, float]], float]:
    """Per model, the curve; and the largest relative standard error of any size's median. samples: per model, per
    size, one timing a round (every list as long)."""
    rounds = len(next(iter(samples[0].values())))
    totals = [sum(times[r] for curve in samples for times in curve.values()) for r in range(rounds)]
    scale = median(totals)
    curves, worst = [], 0.0
    for curve in samples:
        out = {}
        for n, times in curve.items():
            shares = [t / total for t, total in zip(times, totals)]
            middle = median(shares)
            deviation = median(abs(s - middle) for s in shares)
            worst = max(worst, MAD_TO_SE * deviation / middle / rounds ** 0.5)
            out[n] = middle * scale
        curves.append(out)
    return curves, worst


def measure(target: torch.nn.Module, draft: torch.nn.Module, draft_vocab: torch.Tensor | None = None) -> dict:
    """Both curves, the draft over the vocabulary it predicts in staged, with how precise they got ("spread": the
    largest relative standard error of a size's median); where that is over PRECISION, marked unsettled, with why."""
    sampler = CostSampler([target, draft], SIZES, CONTEXT, [None, draft_vocab])
    sampler.rounds(WARMUP_ROUNDS)
    samples = sampler.rounds(FIRST_ROUNDS)
    while True:
        curves, spread = summarise(samples)
        rounds = len(samples[0][SIZES[0]])
        if spread <= PRECISION or rounds >= MOST_ROUNDS:
            break
        for kept, more in zip(samples, sampler.rounds(MORE_ROUNDS)):
            for n in kept:
                kept[n] += more[n]
    data = {"target": {str(n): s for n, s in curves[0].items()}, "draft": {str(n): s for n, s in curves[1].items()},
            "rounds": rounds, "spread": round(spread, 4)}
    if spread > PRECISION:
        data.update(settled=False, why=f"the cost curves' medians stayed {spread:.0%} uncertain over {rounds} rounds "
                                       "of timings (a busy machine?)")
    return data


def stored_plan(name: str, target: torch.nn.Module, draft: torch.nn.Module,
                draft_vocab: torch.Tensor | None = None) -> TreePlan | None:
    """This machine's plan for the pair under `name` (see key), as its profile holds it, settled or not; where there is
    none (or an unsettled one), measured and stored while prepare runs (specviz/profile/store.py). None where nothing is
    stored: a process that generates never times anything (on a busy machine it would store nonsense)."""
    data = auto_choice.decided(name, lambda: measure(target, draft, draft_vocab),
                               unsettled_value=lambda data, why: {**data, "settled": False, "why": why})
    if data is not None and not auto_choice.settled(data) and auto_choice.measuring():
        auto_choice.imprecise(name, data["why"])
    return None if data is None else TreePlan.from_dict(data, auto_choice.source(name))
