"""Aggregate statistics of a generation, computed from its step records only."""
from __future__ import annotations

from collections import defaultdict

from .trace import Phase, StepRecord


def baseline_bytes(costs: tuple, prompt_tokens: int, new_tokens: int) -> float:
    """What plain decoding reads for the same output: one one-token pass per token over a growing cache."""
    weight, kv, per_token = (*costs, 0)[:3]
    kv_entries = sum(prompt_tokens + i for i in range(new_tokens))
    return float((weight + per_token) * new_tokens + kv * kv_entries)


def time_split(phase_s: dict[str, float], wall: float) -> dict[str, float]:
    """Time by phase, the one split every chart and table uses: drafting per stage (`stage{k}_draft`), the draft
    models' prompt read where there was one, verification, and overhead = the rest of `wall` (tree building outside
    drafter forwards, bookkeeping, untimed). Works on seconds, or on shares with wall = 1."""
    split = {k: v for k, v in sorted(phase_s.items()) if Phase.stage_of(k) is not None}
    if phase_s.get(Phase.PROMPT_READ):
        split[Phase.PROMPT_READ] = phase_s[Phase.PROMPT_READ]
    split[Phase.VERIFY] = phase_s.get(Phase.VERIFY, 0.0)
    split["overhead"] = max(0.0, wall - sum(split.values()))
    return split


def summarise(steps: list[StepRecord], costs: dict[str, tuple[int, int]] | None = None,
              prompt_tokens: int | None = None) -> dict:
    if not steps:
        return {}
    target = steps[0].stages[0].name
    new_tokens = sum(len(s.committed_tokens) for s in steps)
    wall = sum(s.wall_s for s in steps)
    forwards: dict[str, int] = defaultdict(int)
    fed: dict[str, int] = defaultdict(int)
    read: dict[str, float] = defaultdict(float)
    phases: dict[str, float] = defaultdict(float)
    for s in steps:
        for name, counts in s.forwards.items():
            forwards[name] += len(counts)
            fed[name] += sum(counts)
        for name, value in s.bytes_read.items():
            read[name] += value
        for name, value in s.phase_s.items():
            phases[name] += value
    target_forwards = forwards[target]
    accepted = [len(s.accepted_path) - 1 for s in steps]
    total_read = sum(read.values())
    stats = {
        "new_tokens": new_tokens,
        "steps": len(steps),
        "wall_s": wall,
        "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
        "target_forwards": target_forwards,
        "draft_forwards": {k: v for k, v in forwards.items() if k != target},
        "tokens_fed": dict(fed),
        "tokens_per_target_forward": new_tokens / target_forwards if target_forwards else 0.0,
        "mean_accepted_per_target_forward": sum(accepted) / len(steps),
        "mean_tree_size": sum(len(s.nodes) - 1 for s in steps) / len(steps),
        "accept_by_depth": accept_by_depth(steps),
        "accept_by_position": accept_by_position(steps),
        "bytes_read": dict(read),
        "bytes_per_token": total_read / new_tokens if new_tokens else 0.0,
        "phase_s": dict(phases),
        "phase_share": {k: v / wall for k, v in phases.items()} if wall > 0 else {},
    }
    plans = [s.plan.kind for s in steps if s.plan is not None]
    if plans:       # planned rounds (specviz/decode/planner.py): how many were plain steps, probes, or speculated
        stats["rounds_by_plan"] = {kind: plans.count(kind) for kind in ("speculate", "plain", "probe")}
        joined = [s.plan.kind for s in steps if s.plan is not None and s.plan.lookup_joined]
        stats["lookup_joined_by_plan"] = {kind: joined.count(kind) for kind in ("speculate", "plain", "probe")}
    if costs and prompt_tokens is not None and target in costs and new_tokens:
        base = baseline_bytes(costs[target], prompt_tokens, new_tokens)
        stats["bytes_relative_to_baseline"] = total_read / base
    return stats


def accept_by_depth(steps: list[StepRecord]) -> list[float]:
    """Per depth d = 1, 2, ...: of the rounds whose tree reached depth d, the share that accepted a node there."""
    reached: dict[int, int] = defaultdict(int)
    hit: dict[int, int] = defaultdict(int)
    for s in steps:
        for d in range(1, max(n.depth for n in s.nodes) + 1):
            reached[d] += 1
        for d in range(1, len(s.accepted_path)):
            hit[d] += 1
    return [hit[d] / reached[d] for d in sorted(reached)]


def accept_by_position(steps: list[StepRecord]) -> dict[str, dict[str, float]]:
    """Per tree position "depth.rank": how often a node stood there, and the share accepted."""
    present: dict[str, int] = defaultdict(int)
    taken: dict[str, int] = defaultdict(int)
    for s in steps:
        for n in s.nodes[1:]:
            key = f"{n.depth}.{n.rank}"
            present[key] += 1
            taken[key] += n.accepted
    return {k: {"count": present[k], "rate": taken[k] / present[k]}
            for k in sorted(present, key=lambda k: tuple(map(int, k.split("."))))}
