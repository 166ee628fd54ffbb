"""This machine's tree plans: the cost curves measured by prepare, stored once per machine, target, draft and precision
(specviz/profile/store.py), and read back as a TreePlan (specviz/decode/costs.py). Only prepare measures
(Profile.decided), on a machine meant to be at rest; a process that generates reads what is stored.

These VMs' speed swings by tens of percent from one second to the next, and alike for every size and model timed in
the same second. A plan depends only on the curves' ratios to each other (a guess's price is the tokens a second a
round makes times the seconds it adds), so each round of timings is scaled by its own total, which takes the swing out,
and each size's curve is the median over the rounds of those shares, times the median round's total.

What must be precise is what the planner takes from the curves: the score at which each guess pays (TreePlan.needs), not
every size's time. Each round's timings make a plan of their own, and the spread of those plans' scores gives the
standard error of the stored plan's. Rounds are added until every score the plan uses, and the one that ends it, is
known to within SCORE_PRECISION, or up to MOST_ROUNDS; a spread that would need far more rounds than that (a busy
machine) stops at once, since a standard error falls only as one over the square root of the rounds. Even at rest these
VMs' relative costs drift: four back-to-back measurements on a quiet Xeon held to AVX2 gave first scores of 0.39 to 0.45
(each forward timed after a one-token forward, cost_curve.py; timed in turn 0.15 to 0.31). So a plan is never taken from
fewer than FIRST_ROUNDS, spread over several seconds, and asking more precision of it would measure the moment rather
than the machine; the planner learns a draft level's price as it runs (planner.py).

Curves that never got that precise, or that were timed while other work kept the cores busy, are stored all the same,
marked unsettled: the planner runs from what was measured rather than from a fixed rule, prepare's last line names
them, and the next prepare measures them again.
"""
from __future__ import annotations

import math
from statistics import median

import torch

from .store import Profile, settled
from .cost_curve import CostSampler
from ..decode.costs import CONTEXT, MAX_NODES, SIZES, TreePlan

WARMUP_ROUNDS = 1       # the first forwards of each size allocate their buffers: never kept
FIRST_ROUNDS = 13       # rounds before the spread is first looked at (5-9 s on 2 Zen 5 cores)
MORE_ROUNDS = 4         # ...then added at a time
MOST_ROUNDS = 81        # ...up to this many (about 110 s for the qwen-coder pair on a slow 2-core AVX2 machine): a
                        # quiet Ice Lake held to AVX2 had its scores uncertain by 0.057 after 41 (about 53 needed)
HOPELESS = 2            # ...unless the spread so far needs more than this many times MOST_ROUNDS to settle
# The standard error a stored plan's scores may keep: staged's speed is flat near its best scores (the held-out bench
# measured a fixed 0.5 within noise of plans of 0.51-0.66, specviz/decode/costs.py), and over a run the scores drift by
# more than this (above).
SCORE_PRECISION = 0.05
MAD_TO_SE = 1.4826 * 1.2533     # a median absolute deviation to a median's standard error (times 1/sqrt(rounds))


def rounds_in(samples: list[dict[int, list[float]]]) -> int:
    """How many rounds of timings the samples hold (every list is as long)."""
    return len(next(iter(samples[0].values())))


def summarise(samples: list[dict[int, list[float]]]) -> list[dict[int, float]]:
    """Per model, the curve. samples: per model, per size, one timing a round (every list as long)."""
    totals = [sum(times[r] for curve in samples for times in curve.values()) for r in range(rounds_in(samples))]
    scale = median(totals)
    return [{n: median(t / total for t, total in zip(times, totals)) * scale for n, times in curve.items()}
            for curve in samples]


def score_error(samples: list[dict[int, list[float]]]) -> float:
    """The largest standard error of a score the plan from these samples uses (its minimum scores, and the need that
    ends them), from the spread of the plans each round's timings make on their own."""
    rounds = rounds_in(samples)
    alone = [TreePlan(*({n: times[r] for n, times in curve.items()} for curve in samples)).needs()
             for r in range(rounds)]
    used = min(len(TreePlan(*summarise(samples)).min_scores()) + 1, MAX_NODES)
    worst = 0.0
    for guess in range(used):
        needs = [plan[guess] for plan in alone]
        middle = median(needs)
        worst = max(worst, MAD_TO_SE * median(abs(need - middle) for need in needs) / rounds ** 0.5)
    return worst


def rounds_needed(error: float, rounds: int) -> int:
    """The rounds after which scores uncertain by `error` over `rounds` would be within SCORE_PRECISION: a median's
    standard error falls as one over the square root of the rounds."""
    return math.ceil(rounds * (error / SCORE_PRECISION) ** 2)


def measure(target: torch.nn.Module, draft: torch.nn.Module, draft_vocab: torch.Tensor | None = None) -> dict:
    """Both curves, the draft over the vocabulary it predicts in staged, with how precise the plan from them got
    ("score_error", see score_error); where that is over SCORE_PRECISION, marked unsettled, with why."""
    sampler = CostSampler([target, draft], SIZES, CONTEXT, [None, draft_vocab])
    sampler.rounds(WARMUP_ROUNDS)
    samples = sampler.rounds(FIRST_ROUNDS)
    while True:
        error, rounds = score_error(samples), rounds_in(samples)
        if error <= SCORE_PRECISION or rounds >= MOST_ROUNDS or rounds_needed(error, rounds) > HOPELESS * MOST_ROUNDS:
            break
        for kept, more in zip(samples, sampler.rounds(MORE_ROUNDS)):
            for n in kept:
                kept[n] += more[n]
    target_curve, draft_curve = summarise(samples)
    data = {"target": {str(n): s for n, s in target_curve.items()},
            "draft": {str(n): s for n, s in draft_curve.items()}, "rounds": rounds, "score_error": round(error, 4)}
    if error > SCORE_PRECISION:
        data.update(settled=False, why=f"the plan's scores stayed uncertain by {error:.2f} (a standard error) over "
                                       f"{rounds} rounds of timings, where about {rounds_needed(error, rounds)} "
                                       "would settle them (a busy machine?)")
    return data


def stored_plan(profile: Profile, name: str, target: torch.nn.Module, draft: torch.nn.Module,
                draft_vocab: torch.Tensor | None = None) -> TreePlan | None:
    """This machine's plan for the pair under `name` (see key), as its profile holds it, settled or not; where there is
    none (or an unsettled one), measured and stored while prepare runs (specviz/profile/store.py). None where nothing is
    stored: a process that generates never times anything (on a busy machine it would store nonsense)."""
    data = profile.decided(name, lambda: measure(target, draft, draft_vocab),
                           unsettled_value=lambda data, why: {**data, "settled": False, "why": why})
    if data is not None and not settled(data) and profile.measuring():
        profile.imprecise(name, data["why"])
    return None if data is None else TreePlan.from_dict(data, profile.source(name))
