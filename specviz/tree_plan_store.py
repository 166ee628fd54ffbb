"""This machine's tree plans: the cost curves measured until they repeat themselves, stored once per machine, target,
draft and precision (specviz/auto_choice.py), and read back as a TreePlan (specviz/tree_plan.py). Only prepare measures
(auto_choice.decided), on a machine meant to be at rest; a process that generates reads what is stored.
"""
from __future__ import annotations

import torch

from . import auto_choice
from .cost_curve import cost_curves
from .tree_plan import CONTEXT, REPS, SIZES, TreePlan


class NoisyMachine(RuntimeError):
    """The curves did not repeat themselves in any try: the machine was busy."""


def agree(first: dict[int, float], second: dict[int, float], within: float = 0.25) -> bool:
    """Whether two measurements of a curve agree at every size (a quiet machine's repeat within a few percent; a busy
    one's timed a one-token forward at 267 ms where a quiet one takes 9)."""
    return all(abs(first[n] - second[n]) <= within * min(first[n], second[n]) for n in first)


def measure(target: torch.nn.Module, draft: torch.nn.Module, draft_vocab: torch.Tensor | None = None,
            tries: int = 3) -> dict:
    """Both curves, interleaved round by round (so the machine's drifting speed hits them alike), the draft over the
    vocabulary it predicts in staged; measured until two measurements in a row agree, and the faster of them kept."""
    def curves():
        with torch.inference_mode():
            return cost_curves([target, draft], sizes=SIZES, context=CONTEXT, reps=REPS,
                               output_vocabs=[None, draft_vocab])
    last = curves()
    for _ in range(tries):
        now = curves()
        if all(agree(a, b) for a, b in zip(last, now)):
            best = [{n: min(a[n], b[n]) for n in a} for a, b in zip(last, now)]
            return {"target": {str(n): s for n, s in best[0].items()}, "draft": {str(n): s for n, s in best[1].items()}}
        last = now
    raise NoisyMachine(f"the cost curves did not repeat themselves in {tries + 1} measurements (a busy machine?)")


def stored_plan(name: str, target: torch.nn.Module, draft: torch.nn.Module,
                draft_vocab: torch.Tensor | None = None) -> TreePlan | None:
    """This machine's plan for the pair under `name` (see key), as its profile holds it; where there is none, measured
    and stored while prepare runs (specviz/auto_choice.py), else None (a process that generates never times anything:
    on a busy machine it would store nonsense)."""
    try:
        data = auto_choice.decided(name, lambda: measure(target, draft, draft_vocab))
    except NoisyMachine as exc:         # what the profile held before (--remeasure) stands, else no plan
        auto_choice.unsettled(name, str(exc))
        data = auto_choice.stored(name)
    return None if data is None else TreePlan.from_dict(data, auto_choice.source(name))
