"""Growing the speculative tree under the root, level by level, with one drafter.

Each level is one `expand` call (for a model drafter: one batched forward of that level's internal
nodes). Children of a node are its drafter's most likely tokens (greedy) or tokens drawn from the
drafter's distribution without replacement (sampling), so verification can stay lossless.
"""
from __future__ import annotations

import heapq

import torch

from .drafters.base import Drafter
from .drafters.lookup import context_continuation
from .sampling import Sampling, draw_without_replacement, logits_to_probs, top_tokens
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


def lookup_stage(drafter: Drafter | None) -> int:
    """The stage index context-lookup nodes are credited to: the one after the drafter's stages."""
    return 1 + (len(drafter.stages()) if drafter is not None else 0)


def build_tree(root: int, context: list[int], drafter: Drafter | None, spec: TreeSpec,
               sampling: Sampling, generator: torch.Generator,
               ends: frozenset[int] = frozenset()) -> tuple[Tree, dict[int, torch.Tensor]]:
    """Return the tree and, per expanded node, the distribution its children were drawn from.

    With `spec.lookup`, a continuation copied from the context (prompt lookup) joins the drafted
    tree as one more branch; baseline (no drafter) stays plain decoding. Nothing is drafted after a
    token of `ends` (the text's end tokens): the commit stops there, so a guess below one is budget spent in vain.
    """
    tree = Tree.with_root(root)
    dists: dict[int, torch.Tensor] = {}
    if drafter is None:
        return tree, dists
    proposals: dict[int, Proposal] = {}
    _grow(tree, proposals, context, drafter, spec, sampling, generator, ends)
    if not sampling.greedy:             # greedy verification reads no draft distribution
        dists = {node: proposal.whole() for node, proposal in proposals.items()}
    if spec.lookup > 0:
        stage = lookup_stage(drafter)
        with drafter.timer.phase(f"stage{stage}_draft"):
            follow = context_continuation(context, spec.lookup, max(spec.lookup_ngram, 3), spec.lookup_ngram)
            ended = [i for i, token in enumerate(follow) if token in ends]
            follow = follow[: ended[0] + 1] if ended else follow
            tree.add_lookup_chain(follow, stage)
    return tree, dists


def _grow(tree: Tree, dists: dict[int, Proposal], context: list[int], drafter: Drafter, spec: TreeSpec,
          sampling: Sampling, generator: torch.Generator, ends: frozenset[int] = frozenset()) -> None:
    """The drafter's tree, level by level; dists: each expanded node's Proposal."""
    paths = spec.static_paths() if spec.shape != "dynamic" else None
    support = drafter.support()
    frontier, scores = [0], {0: 1.0}
    while frontier and len(tree) - 1 < spec.budget:
        if paths is not None:
            wants = {n: children_ranks(paths, tree.rank_path(n)) for n in frontier}
        else:
            best = sorted(frontier, key=lambda n: -scores[n])[: spec.level_width]
            wants = {n: spec.max_branch for n in best if tree.depths[n] < spec.max_depth}
        expand = [n for n in frontier if wants.get(n, 0) > 0 and (n == 0 or tree.tokens[n] not in ends)]
        if not expand:
            break
        room = spec.budget - (len(tree) - 1)    # children this level can take in all
        if paths is None:
            room = min(room, spec.level_width)
        ranked = {}     # per node: its most likely tokens, which decide how many children it gets
        proposed = [(node, row) for node, row in zip(expand, drafter.expand(tree, expand, context)) if row is not None]
        for (node, _), row in zip(proposed, on_host([row for _, row in proposed])):
            dists[node] = Proposal(row, support, sampling)
            ranked[node] = dists[node].top(min(wants[node], room))
        counts = _children_counts(ranked, dists, scores, room, len(tree) - 1, spec if paths is None else None)
        frontier = []
        for node, count in counts.items():
            # Sampling draws the children only now: how many a node gets must not depend on which
            # tokens it draws, or the draws would no longer follow q and verification would be biased.
            tokens = ranked[node][:count] if sampling.greedy else dists[node].draw(count, generator)
            for token in tokens:
                prob = dists[node].prob(token)
                child = tree.add(node, token, drafter.proposer_stage(tree, node, token), prob)
                scores[child] = scores[node] * prob
                frontier.append(child)


def _children_counts(ranked, dists, scores, room, drafted, spec: TreeSpec | None) -> dict[int, int]:
    """How many children each node gets: the `room` best (node, rank) pairs by path score, each at
    least the spec's min score with the nodes drafted before it (`drafted` in the tree, then the
    pairs chosen; no minimum for a static shape, spec None).

    A path's score is its parent's score times the rank's probability, so each node's chosen ranks
    form a prefix 0..k-1.
    """
    heap = [(-scores[node] * dists[node].prob(tokens[0]), node, 0) for node, tokens in ranked.items() if tokens]
    heapq.heapify(heap)
    counts: dict[int, int] = {}
    while heap and sum(counts.values()) < room:
        neg_score, node, rank = heapq.heappop(heap)
        if spec is not None and -neg_score < spec.min_score_at(drafted + sum(counts.values())):
            break                       # not even the best candidate is likely enough: stop here
        counts[node] = rank + 1
        if rank + 1 < len(ranked[node]):
            heapq.heappush(heap, (-scores[node] * dists[node].prob(ranked[node][rank + 1]), node, rank + 1))
    return dict(sorted(counts.items()))
