"""Staged's tree sized by what verifying and drafting cost on the machine it runs on.

A drafted guess pays when what it saves, if accepted, exceeds what it costs either way. Accepted, it saves one
plain decoding step: about one one-token forward of the target, c(1). It costs its share of the verification
(feeding n + 1 tokens instead of n: c(n + 1) - c(n), from the target's measured cost curve) and one forward of the
draft model (to propose the level after it). Its chance of acceptance is estimated by its path score (the product of
the draft's probabilities down to it), so the guess that would be node k + 1 of a round joins when

    score >= (c(k + 2) - c(k + 1) + d) / c(1)

d being one draft forward as staged feeds it (a node and the lower stage's guess after it; where the guess is right
the next level needs no forward, so this errs on the side of smaller trees), and no guess joins past the size where
even a certain one costs more than it saves. Where verification is cheap (a flat curve: a GPU, AMX tiles) the minimum
is low and trees grow large; where each verified token costs a third of a forward (4-bit products on 2 AVX2 cores)
only likely guesses join. On our 2-core CPU the rule gives 0.36-0.46 with AMX and 0.51-0.66 on the AVX2 build, where
sweeps on tuning prompts had settled on a fixed 0.5; the held-out bench measured both within noise of the fixed
rule.

The curves are measured once per machine, target, draft and precision by `python -m specviz.prepare`, on the machine
at rest, and stored (specviz/profile/tree_plans.py): every later process grows the same trees, and a process that only
generates never times anything (under load it would store nonsense); where no plan is stored yet it grows staged's
fixed rule (specviz/stack/strategies.py). The app's regime panel draws the curve a plan used and its minimum scores.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .drafters.model import LEVEL_FEED
from .tree import TreeSpec

MAX_NODES = 15                 # drafted nodes a planned tree allows at most: the cost curves end at one more
SIZES = (1, 2, 3, 4, 6, 8, 12, MAX_NODES + 1)     # tokens fed per target forward, as measured: up to a planned tree
CONTEXT = 128                          # committed tokens before the timed forwards
REPS = 3
DRAFT_FEED = LEVEL_FEED               # a staged level's draft forward: the node and the lower stage's guess after it


def interpolate(curve: dict[int, float], fed: float) -> float:
    """A cost curve's seconds for `fed` tokens: linear between the measured sizes, and past the last two."""
    sizes = sorted(curve)
    low = max([n for n in sizes if n <= fed], default=sizes[0])
    high = min([n for n in sizes if n > low], default=None)
    if high is None:
        low, high = sizes[-2], sizes[-1]
    return curve[low] + (curve[high] - curve[low]) / (high - low) * (fed - low)


@dataclass(frozen=True)
class TreePlan:
    target: dict[int, float]        # seconds per target forward by tokens fed
    draft: dict[int, float]         # seconds per forward of the top draft model by tokens fed
    source: str = ""                # where the curves came from, in a few words

    def cost(self, fed: float) -> float:
        """The target's seconds for `fed` tokens."""
        return interpolate(self.target, fed)

    def needs(self) -> list[float]:
        """Per node drafted so far, the path score at which the next guess pays for itself, by the curves alone."""
        one = self.target[1]
        return [(self.cost(drafted + 2) - self.cost(drafted + 1) + self.draft[DRAFT_FEED]) / one
                for drafted in range(MAX_NODES)]

    def min_scores(self) -> tuple[float, ...]:
        """Per node drafted so far, the least path score the next guess needs (never decreasing); they stop where
        even a certain guess would not pay, or at MAX_NODES."""
        scores = []
        for need in self.needs():
            need = max(need, scores[-1] if scores else 0.0)
            if need > 1.0:
                break
            scores.append(round(need, 4))
        return tuple(scores)

    def tree(self, spec: TreeSpec) -> TreeSpec:
        """The spec with this plan's minimum scores, within its budget and depth."""
        scores = self.min_scores()[: spec.budget]
        return replace(spec, min_scores=scores, budget=len(scores), max_depth=max(1, min(spec.max_depth, len(scores))))

    def to_dict(self) -> dict:
        return {"target": {str(n): s for n, s in self.target.items()},
                "draft": {str(n): s for n, s in self.draft.items()},
                "source": self.source, "min_scores": list(self.min_scores())}

    @classmethod
    def from_dict(cls, data: dict, source: str = "") -> "TreePlan":
        return cls({int(n): float(s) for n, s in data["target"].items()},
                   {int(n): float(s) for n, s in data["draft"].items()}, source or data.get("source", ""))


def key(target_name: str, target_dtype: str, draft_name: str, draft_dtype: str) -> str:
    return f"tree plan: {target_name} ({target_dtype}) verifying {draft_name} ({draft_dtype})"


def describe(plan: TreePlan) -> str:
    """What the plan made of the curves: the minimum score per guess and the costs behind it."""
    scores = plan.min_scores()
    costs = f"one token {plan.target[1] * 1e3:.0f} ms, a draft level {plan.draft[DRAFT_FEED] * 1e3:.0f} ms"
    if not scores:
        return (f"no guess pays here: one more verified token and a draft level cost more than a token ({costs}), "
                "so its draft proposes none")
    shown = ", ".join(f"{s:.2f}" for s in scores[:8]) + (" ..." if len(scores) > 8 else "")
    return (f"a guess joins a round when the draft's chance for its whole path is at least (one more verified token + "
            f"one draft forward of a level) / one token = {shown} for guess 1, 2, ... ({len(scores)} at most; {costs})")
