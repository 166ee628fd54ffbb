"""Why speculation is fast, in numbers: the tokens a target pass yields and the speed they buy.

Everything here is computed from trace records, live or replayed, so a recording explains itself.
- A chain of k drafted tokens, each accepted with chance α given its parent was, yields
  (1 − α^(k+1)) / (1 − α) tokens per target pass (Leviathan et al., 2023), the bonus token included.
- A tree yields 1 + the sum over its nodes of the chance that the whole path down to the node is
  accepted; the chance per child rank is measured from the run (the independence model that
  `tree.best_static_shape` and Sequoia use).
- A round costs its drafting, one verification pass (dearer the more tokens it verifies) and
  bookkeeping; plain decoding pays one one-token round per token.
The chain's α is measured on every position a chain drafts, so its curve predicts other lengths. A
tree's rates are measured only where a dynamic tree chose to draft (the draft was confident there),
so they describe that tree, not other shapes: static shapes picked from them were predicted at up to
2.2x but measured at 0.91-1.21x on a 2-core CPU, and no tree optimiser is offered.
Predictions are labelled as such wherever they are shown; the measured points come from the same run.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from statistics import fmean

from ..decode.metrics import time_split
from ..decode.trace import Phase, StepRecord

MAX_RANK = 6


def chain_tokens(alpha: float, k: int) -> float:
    """Expected tokens per target pass of a k-token chain whose tokens are each accepted with chance α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def rank_rates(steps: list[StepRecord]) -> list[float]:
    """Per child rank r: of the accepted nodes that had an r-th child, the share whose r-th child was
    accepted too. Rank 0's rate is the α of the chain formula."""
    had, took = [0] * MAX_RANK, [0] * MAX_RANK
    for s in steps:
        accepted = set(s.accepted_path)
        for node in s.nodes[1:]:
            if node.parent in accepted and node.rank < MAX_RANK:
                had[node.rank] += 1
                took[node.rank] += node.accepted
    # a node's children have ranks 0..k-1, so the ranks seen are a prefix: stop at the first unseen one
    seen = had.index(0) if 0 in had else MAX_RANK
    return [took[r] / had[r] for r in range(seen)]


def rank_paths(step: StepRecord) -> list[tuple[int, ...]]:
    """Each drafted node's ranks from the root down, e.g. (0, 1): the 2nd child of the 1st child."""
    paths: dict[int, tuple[int, ...]] = {0: ()}
    for node in step.nodes[1:]:           # parents come before their children
        paths[node.id] = paths[node.parent] + (node.rank,)
    return [paths[node.id] for node in step.nodes[1:]]


def tree_tokens(paths: list[tuple[int, ...]], rates: list[float]) -> float:
    """Expected tokens per target pass of a tree: 1 (the bonus) + each path's chance of acceptance."""
    return 1.0 + sum(prod(rates[r] if r < len(rates) else 0.0 for r in path) for path in paths)


@dataclass
class FittedCosts:
    """Seconds per round, fitted to a run's steps: verification grows linearly with tokens verified."""
    verify_fixed: float
    verify_per_token: float
    draft_per_forward: float        # one forward of the top draft model (0 without one)
    overhead: float                 # per round: the rest of its time (metrics.time_split)

    def verify(self, tokens: int) -> float:
        return self.verify_fixed + self.verify_per_token * tokens

    def round(self, draft_forwards: int, verified: int) -> float:
        return draft_forwards * self.draft_per_forward + self.verify(verified) + self.overhead


def fit_costs(steps: list[StepRecord], more_steps: list[StepRecord] = ()) -> FittedCosts:
    """The costs from `steps` (drafting, overhead) and the verification passes of both step lists (a
    wider range of tokens verified, e.g. plain decoding's one-token passes, makes the line better)."""
    points = [(sum(s.forwards.get(s.stages[0].name, [])), s.phase_s.get("verify", 0.0))
              for s in [*steps, *more_steps] if len(s.forwards.get(s.stages[0].name, [])) == 1]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    slope = 0.0
    if len(set(xs)) > 1:
        mx, my = fmean(xs), fmean(ys)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs))
    fixed = max(0.0, fmean(ys) - slope * fmean(xs)) if points else 0.0
    draft_s = sum(s.phase_s.get(Phase.draft(1), 0.0) for s in steps)
    top = steps[0].stages[1].name if steps and len(steps[0].stages) > 1 else None
    # the prompt read's forward is timed apart (Phase.PROMPT_READ): left out of the draft's cost per forward
    draft_forwards = sum(len(s.forwards.get(top, [])) - (Phase.PROMPT_READ in s.phase_s) for s in steps) if top else 0
    outside = sum(time_split(s.phase_s, s.wall_s)["overhead"] for s in steps)
    return FittedCosts(fixed, slope, draft_s / draft_forwards if draft_forwards else 0.0,
                 max(0.0, outside) / len(steps) if steps else 0.0)


def seconds_per_token(steps: list[StepRecord]) -> float:
    """Wall time per committed token over these steps (0 for none)."""
    tokens = sum(len(s.committed_tokens) for s in steps)
    return sum(s.wall_s for s in steps) / tokens if tokens else 0.0


@dataclass
class Explanation:
    """One strategy's run, explained: measured against predicted tokens per pass and speed."""
    strategy: str
    alpha: float                    # acceptance of the draft's first choice, given its parent was accepted
    rates: list[float]              # acceptance per child rank (see rank_rates)
    tree_size: float                # drafted nodes per round, mean
    tokens_measured: float          # tokens per target pass
    tokens_predicted: float         # ...from the rates and the shapes the run drafted
    speedup_measured: float | None  # tokens/s against plain decoding's, from the steps' clocks
    speedup_predicted: float | None  # predicted tokens per pass over the measured seconds per round


def explain(steps: list[StepRecord], baseline_s: float = 0.0) -> Explanation | None:
    """None for a run without drafting (plain decoding explains nothing). baseline_s: plain decoding's
    seconds per token in the same run (0: no speed-ups)."""
    drafted = [s for s in steps if len(s.nodes) > 1]
    if not drafted:
        return None
    rates = rank_rates(drafted)
    predicted = fmean(tree_tokens(rank_paths(s), rates) for s in drafted)
    measured = fmean(len(s.accepted_path) for s in drafted)
    mine = seconds_per_token(steps)
    round_s = fmean(s.wall_s for s in drafted)
    return Explanation(steps[0].strategy, rates[0] if rates else 0.0, rates,
                       fmean(len(s.nodes) - 1 for s in drafted), measured, predicted,
                       baseline_s / mine if baseline_s and mine else None,
                       predicted * baseline_s / round_s if baseline_s and round_s else None)


def chain_curve(alpha: float, costs: FittedCosts, baseline_s: float, lengths=range(0, 11)) -> list[dict]:
    """Per chain length k: expected tokens per pass and the predicted speed against plain decoding
    (k one-token draft forwards, then one pass verifying k + 1 tokens)."""
    return [{"k": k, "tokens": chain_tokens(alpha, k),
             "speedup": chain_tokens(alpha, k) * baseline_s / costs.round(k, k + 1) if baseline_s else None}
            for k in lengths]


def best_chain(curve: list[dict]) -> dict | None:
    """The chain length with the highest predicted speed-up on a chain_curve (a prediction)."""
    scored = [point for point in curve if point["speedup"] is not None]
    return max(scored, key=lambda point: point["speedup"]) if scored else None
