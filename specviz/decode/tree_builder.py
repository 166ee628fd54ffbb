"""Growing the speculative tree under the root, level by level, with one drafter.

Each level is one `expand` call (for a model drafter: one batched forward of that level's internal
nodes). Children of a node are its drafter's most likely tokens (greedy) or tokens drawn from the
drafter's distribution without replacement (sampling), so verification can stay lossless.
"""
from __future__ import annotations

import heapq
from typing import NamedTuple

import torch

from .drafters.base import Drafter, cascade
from .drafters.ngram import context_continuation
from .planner import LookupChoice, RoundPlan
from .sampling import Sampling, draw_without_replacement, logits_to_probs, top_tokens
from .trace import Phase
from .tree import Tree, TreeSpec, children_ranks

class Proposal:
    """A node's draft distribution: probabilities over the drafter's support (its output vocabulary: a quarter of the
    0.5B draft's, where a softmax and a max over the whole vocabulary took 0.5 ms a node, 2% of staged's time), or
    over every token. Only sampling's verification needs it over every token (`whole`)."""

    def __init__(self, row: torch.Tensor, support: torch.Tensor | None, sampling: Sampling):
        self.support = support
        self.probs = logits_to_probs(row if support is None else row[support], sampling)
        self.vocab = row.shape[-1]

    def _tokens(self, indices: list[int]) -> list[int]:
        return indices if self.support is None else self.support[indices].tolist()

    def top(self, k: int) -> list[int]:
        """The k most likely tokens with non-zero probability, most likely first."""
        return self._tokens(top_tokens(self.probs, k))

    def draw(self, k: int, generator: torch.Generator) -> list[int]:
        return self._tokens(draw_without_replacement(self.probs, k, generator))

    def prob(self, token: int) -> float:
        if self.support is None:
            return float(self.probs[token])
        at = int(torch.searchsorted(self.support, token))
        return float(self.probs[at]) if at < len(self.support) and int(self.support[at]) == token else 0.0

    def whole(self) -> torch.Tensor:
        """The probabilities over every token."""
        if self.support is None:
            return self.probs
        return torch.zeros(self.vocab, dtype=self.probs.dtype).index_copy_(0, self.support, self.probs)


def on_host(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """A level's score rows on the CPU, copied in one transfer: on a GPU each copy waits for the device,
    so a copy per node would stall the level's every node."""
    if all(row.device.type == "cpu" for row in rows):
        return rows
    return list(torch.stack(rows).cpu())


def path_of(tree: Tree, node: int) -> tuple[int, ...]:
    """The tokens from under the root down to `node`: what a drafter knows a path by."""
    return tuple(tree.path_tokens(node)[1:])


def lookup_stage(drafter: Drafter | None) -> int:
    """The stage index context-lookup nodes are credited to: the one after the drafter's stages."""
    return 1 + (len(cascade(drafter)) if drafter is not None else 0)


class Drafted(NamedTuple):
    """What a round drafted: the tree; per expanded node, the distribution its children were drawn from; with a plan,
    the calibrated chance the plan gave each node, and what context lookup offered and what joined."""
    tree: Tree
    dists: dict[int, torch.Tensor]
    chances: dict[int, float]
    lookup: LookupChoice | None = None


def build_tree(root: int, context: list[int], drafter: Drafter | None, spec: TreeSpec,
               sampling: Sampling, generator: torch.Generator,
               ends: frozenset[int] = frozenset(),
               plan: RoundPlan | None = None) -> Drafted:
    """The round's tree and what went into it (`Drafted`).

    With `spec.lookup`, a continuation copied from the context (prompt lookup) joins the drafted
    tree as one more branch; baseline (no drafter) stays plain decoding. Nothing is drafted after a
    token of `ends` (the text's end tokens): the commit stops there, so a guess below one is budget spent in vain.
    With a round's `plan` (specviz/decode/planner.py) the plan decides what joins and what is expanded, within the
    spec's budget and depth; a plain step's plan drafts nothing (context lookup may still join).
    """
    tree = Tree.with_root(root)
    dists: dict[int, torch.Tensor] = {}
    chances: dict[int, float] = {}
    lookup = None
    if drafter is None:
        return Drafted(tree, dists, chances)
    proposals: dict[int, Proposal] = {}
    if plan is None or plan.drafts:
        _grow(tree, proposals, chances, context, drafter, spec, sampling, generator, ends, plan)
    if not sampling.greedy:             # greedy verification reads no draft distribution
        dists = {node: proposal.whole() for node, proposal in proposals.items()}
    if spec.lookup > 0 and (plan is None or plan.kind != "probe"):
        stage = lookup_stage(drafter)
        with drafter.timer.phase(Phase.draft(stage)):
            follow = context_continuation(context, spec.lookup, max(spec.lookup_ngram, 3), spec.lookup_ngram)
            ended = [i for i, token in enumerate(follow) if token in ends]
            follow = follow[: ended[0] + 1] if ended else follow
            if plan is not None:
                lookup = _lookup_worth(tree, follow, plan)
                follow = follow[: lookup.joined]
            first = len(tree)
            tree.add_lookup_chain(follow, stage)
        if plan is not None:
            chances.update((n, plan.value("lookup", tree.depths[n], 1.0)) for n in range(first, len(tree)))
    return Drafted(tree, dists, chances, lookup)


def _lookup_worth(tree: Tree, follow: list[int], plan: RoundPlan) -> LookupChoice:
    """How many of the copied tokens pay for verifying them by the plan, each priced as a new node even where the
    drafted tree holds its token already: what joins must not depend on which tokens were drawn (sampling's
    exactness), only on how many."""
    drafted = len(tree) - 1
    chance = price = 0.0
    for depth in range(1, len(follow) + 1):
        chance, price = plan.value("lookup", depth, 1.0), plan.need(drafted + depth - 1)
        if chance < price:
            return LookupChoice(tuple(follow), depth - 1, chance, price)
    return LookupChoice(tuple(follow), len(follow), chance, price)


def _kind_of(drafter: Drafter):
    """A drafted token's stage kind, by stage index (lookup's stage after the drafter's)."""
    kinds = ["target"] + [d.kind for d in cascade(drafter)] + ["lookup"]
    return lambda stage: kinds[stage]


def _grow(tree: Tree, dists: dict[int, Proposal], chances: dict[int, float], context: list[int], drafter: Drafter,
          spec: TreeSpec, sampling: Sampling, generator: torch.Generator, ends: frozenset[int] = frozenset(),
          plan: RoundPlan | None = None) -> None:
    """The drafter's tree, level by level, grown by the spec's or the plan's policy (`growth_for`); fills dists (each
    expanded node's Proposal) and, with a plan, chances."""
    growth = growth_for(spec, plan, drafter, tree)
    support = drafter.support
    frontier, scores = [0], {0: 1.0}
    while frontier and len(tree) - 1 < spec.budget:
        wants = growth.wants(frontier, scores)
        expand = [n for n in frontier if wants.get(n, 0) > 0 and (n == 0 or tree.tokens[n] not in ends)]
        if not expand:
            break
        room = growth.room(spec.budget - (len(tree) - 1))      # children this level can take in all
        ranked = {}     # per node: its most likely tokens, which decide how many children it gets
        proposed = [(node, row) for node, row in zip(expand, drafter.expand(tree, expand, context)) if row is not None]
        for (node, _), row in zip(proposed, on_host([row for _, row in proposed])):
            dists[node] = Proposal(row, support, sampling)
            ranked[node] = dists[node].top(min(wants[node], room))
        counts = _children_counts(ranked, dists, scores, room, len(tree) - 1, growth.judge)
        frontier = []
        for node, count in counts.items():
            # Sampling draws the children only now: how many a node gets must not depend on which
            # tokens it draws, or the draws would no longer follow q and verification would be biased.
            tokens = ranked[node][:count] if sampling.greedy else dists[node].draw(count, generator)
            for token in tokens:
                prob = dists[node].prob(token)
                stage = drafter.seen(path_of(tree, node) + (token,)).stage
                child = tree.add(node, token, stage, prob)
                scores[child] = scores[node] * prob
                if plan is not None:
                    chances[child] = plan.value(growth.kind(stage), tree.depths[child], scores[child])
                frontier.append(child)


class Judge:
    """What a guess is worth and what it must be worth: the plan's calibrated chance against its price, or without a
    plan the draft's path score against the spec's minimum."""

    def __init__(self, spec: TreeSpec, plan: RoundPlan | None, kind, drafter: Drafter, tree: Tree):
        self.spec, self.plan, self.kind, self.drafter, self.tree = spec, plan, kind, drafter, tree

    def value(self, node: int, token: int, score: float) -> float:
        if self.plan is None:
            return score
        stage = self.drafter.seen(path_of(self.tree, node) + (token,)).stage
        return self.plan.value(self.kind(stage), self.tree.depths[node] + 1, score)

    def need(self, drafted: int) -> float:
        return self.spec.min_score_at(drafted) if self.plan is None else self.plan.need(drafted)

    def expands(self, node: int, score: float, drafted: int) -> bool:
        if self.plan is None:
            return True
        scored = self.drafter.seen(path_of(self.tree, node)).scored
        return self.plan.expands(self.tree.depths[node], score, drafted, scored, self.tree.draft_probs[node])


class StaticShape:
    """A fixed shape (the `tree` strategy's teaching shapes, a chain): each node gets the ranks its paths name, with
    no price to pay."""
    judge = None

    def __init__(self, spec: TreeSpec, tree: Tree):
        self.paths, self.tree = spec.static_paths(), tree

    def wants(self, frontier: list[int], scores: dict[int, float]) -> dict[int, int]:
        return {n: children_ranks(self.paths, self.tree.rank_path(n)) for n in frontier}

    def room(self, left: int) -> int:
        return left


class ByScore:
    """A dynamic tree: the level's `width` best nodes by path score are expanded, each by up to `branch` children,
    each worth what the judge asks (the spec's minimum score, or with a plan its calibrated chance against its
    price); a plan also caps width, branch and depth, and decides which nodes are worth a draft forward."""

    def __init__(self, spec: TreeSpec, plan: RoundPlan | None, drafter: Drafter, tree: Tree):
        self.width, self.branch, self.depth_cap = spec.level_width, spec.max_branch, spec.max_depth
        if plan is not None:
            self.width, self.branch = (1, 1) if spec.shape == "chain" else (self.width, min(self.branch,
                                                                                            plan.max_branch))
            self.depth_cap = min(self.depth_cap, plan.max_depth)
        self.kind = _kind_of(drafter)
        self.judge = Judge(spec, plan, self.kind, drafter, tree)
        self.tree = tree

    def wants(self, frontier: list[int], scores: dict[int, float]) -> dict[int, int]:
        best = sorted(frontier, key=lambda n: -scores[n])[:self.width]
        return {n: self.branch for n in best if self.tree.depths[n] < self.depth_cap
                and self.judge.expands(n, scores[n], len(self.tree) - 1)}

    def room(self, left: int) -> int:
        return min(left, self.width)


def growth_for(spec: TreeSpec, plan: RoundPlan | None, drafter: Drafter, tree: Tree) -> StaticShape | ByScore:
    """A planned round grows by its plan; otherwise a static shape by its paths, a dynamic one by score."""
    if plan is None and spec.shape != "dynamic":
        return StaticShape(spec, tree)
    return ByScore(spec, plan, drafter, tree)


def _children_counts(ranked, dists, scores, room, drafted, judge: Judge | None) -> dict[int, int]:
    """How many children each node gets: the `room` best (node, rank) pairs by their worth (the judge's value of
    their path score), each worth at least what the judge asks with the nodes drafted before it (`drafted` in the
    tree, then the pairs chosen; no minimum for a static shape, judge None).

    A path's score is its parent's score times the rank's probability, so each node's chosen ranks
    form a prefix 0..k-1.
    """
    def worth(node: int, rank: int) -> float:
        token = ranked[node][rank]
        score = scores[node] * dists[node].prob(token)
        return score if judge is None else judge.value(node, token, score)

    heap = [(-worth(node, 0), node, 0) for node, tokens in ranked.items() if tokens]
    heapq.heapify(heap)
    counts: dict[int, int] = {}
    while heap and sum(counts.values()) < room:
        neg_worth, node, rank = heapq.heappop(heap)
        if judge is not None and -neg_worth < judge.need(drafted + sum(counts.values())):
            break                       # not even the best candidate is worth its price: stop here
        counts[node] = rank + 1
        if rank + 1 < len(ranked[node]):
            heapq.heappush(heap, (-worth(node, rank + 1), node, rank + 1))
    return dict(sorted(counts.items()))
