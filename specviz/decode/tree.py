"""The token tree of one speculation round, the shapes a tree may take (TreeSpec) and its attention
mask (ancestor_matrix). Growing a tree with a drafter is specviz/decode/tree_builder.py.

Node 0 is the root: the last committed token, which no model has read yet. Every other node is a
drafted token. Nodes are appended parent-first, so a node's ancestors always have smaller ids and
list order is a valid order to feed the nodes to a model.
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field, replace

import torch


@dataclass
class Tree:
    tokens: list[int]
    parents: list[int]                 # -1 for the root
    depths: list[int]
    ranks: list[int]                   # draw order among siblings (0 = first drawn / most likely)
    stages: list[int]                  # which stage proposed the node (0 = target, for the root)
    draft_probs: list[float]           # q(token | parent) under the distribution it was drawn from
    children: list[list[int]] = field(default_factory=list)
    drawn: list[bool] = field(default_factory=list)       # drawn from its parent's draft distribution q
    point_mass: list[bool] = field(default_factory=list)  # also proposed deterministically (q = 1 on its token,
                                                          # e.g. by context lookup): verified before the drawn

    @classmethod
    def with_root(cls, token: int) -> "Tree":
        return cls([token], [-1], [0], [0], [0], [1.0], [[]], [False], [False])

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, stage: int, draft_prob: float, drawn: bool = True) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.ranks.append(len(self.children[parent]))
        self.stages.append(stage)
        self.draft_probs.append(draft_prob)
        self.children.append([])
        self.children[parent].append(node)
        self.drawn.append(drawn)
        self.point_mass.append(False)
        return node

    def child_with_token(self, parent: int, token: int) -> int | None:
        return next((c for c in self.children[parent] if self.tokens[c] == token), None)

    def add_lookup_chain(self, tokens: list[int], stage: int) -> None:
        """Hang a context-lookup continuation under the root, sharing the nodes it has in common
        with the drafted tree; its new nodes are deterministic proposals (q = 1)."""
        node = 0
        for token in tokens:
            child = self.child_with_token(node, token)
            if child is None:
                child = self.add(node, token, stage, 1.0, drawn=False)
            self.point_mass[child] = True
            node = child

    def path(self, node: int) -> list[int]:
        """Node ids from the root down to `node`, inclusive."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[n] for n in self.path(node)]

    def rank_path(self, node: int) -> tuple[int, ...]:
        return tuple(self.ranks[n] for n in self.path(node)[1:])


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """Boolean [n, n]: entry (i, j) is True when j is i itself or one of its ancestors."""
    n = len(parents)
    seen = torch.eye(n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] |= seen[parent]
    return seen


# ---------------------------------------------------------------------------------------------
# Tree shapes. A static shape is a set of rank paths (Medusa's "tree choices"): (0,) is the most
# likely child of the root, (0, 1) the second child of that, and so on. Shapes must be closed
# under prefixes and under smaller ranks, so that siblings are always a prefix of the draw order
# (sampling verification relies on that).

RANK_PRIOR = (0.70, 0.12, 0.05, 0.03, 0.02, 0.01)   # a typical acceptance rate per child rank


def chain_shape(length: int) -> list[tuple[int, ...]]:
    return [(0,) * d for d in range(1, length + 1)]


def best_static_shape(budget: int, max_depth: int = 12, max_branch: int = 4,
                      rank_prior: tuple[float, ...] = RANK_PRIOR) -> list[tuple[int, ...]]:
    """The `budget` rank paths with the highest prior probability of being accepted.

    A path's prior is the product of its ranks' acceptance rates, so its expected contribution to
    accepted tokens is that product; picking greedily from a heap gives the optimal tree under this
    independence model (Sequoia-style), and it is closed under prefixes and smaller ranks because
    a path's prior never exceeds its parent's or its elder sibling's.
    """
    prior = rank_prior[:max_branch]
    heap = [(-prior[0], (0,))]
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < max_depth:
            heapq.heappush(heap, (neg * prior[0], path + (0,)))
        if path[-1] + 1 < len(prior):
            heapq.heappush(heap, (neg / prior[path[-1]] * prior[path[-1] + 1], path[:-1] + (path[-1] + 1,)))
    return sorted(chosen, key=lambda p: (len(p), p))


def validate_shape(shape: list[tuple[int, ...]]) -> None:
    paths = set(shape)
    for path in paths:
        if not path or min(path) < 0:
            raise ValueError(f"bad tree path {path}")
        if len(path) > 1 and path[:-1] not in paths:
            raise ValueError(f"tree path {path} has no parent {path[:-1]}")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in paths:
            raise ValueError(f"tree path {path} has no elder sibling")


def children_ranks(shape: set[tuple[int, ...]], rank_path: tuple[int, ...]) -> int:
    """How many children the node at `rank_path` gets in a static shape."""
    count = 0
    while rank_path + (count,) in shape:
        count += 1
    return count


SHAPES = ("chain", "static", "dynamic")


@dataclass(frozen=True)
class TreeSpec:
    shape: str = "dynamic"      # chain | static | dynamic
    budget: int = 16            # drafted nodes per round (the root not counted)
    max_depth: int = 8
    max_branch: int = 4         # children per node at most
    level_width: int = 4        # dynamic: nodes added per level at most
    min_score: float = 0.0      # dynamic: skip paths whose draft probability is below this
    lookup: int = 0             # also verify up to this many tokens copied from the context (0 = off)
    lookup_ngram: int = 2       # ...after a match of at least this many trailing tokens
    planned: bool = False       # dynamic: grown by this machine's plan (specviz/decode/costs.py), which the stack fills
                                # in as min_scores, within this budget and depth
    min_scores: tuple[float, ...] = ()  # dynamic: per node drafted so far, the least path score the next one needs
                                        # (overrides min_score; no node past its end)
    past_room: bool = False     # grow past the tokens left (`within`): a replay's recorded trees grow whole

    def __post_init__(self):
        object.__setattr__(self, "min_scores", tuple(self.min_scores))     # a recording's JSON gives a list

    def to_dict(self) -> dict:
        """Plain data, as a trace record holds it."""
        return {**vars(self), "min_scores": list(self.min_scores)}

    def validate(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown tree shape {self.shape!r}; choose one of {', '.join(SHAPES)}")
        if not 0 <= self.budget <= 256:
            raise ValueError(f"tree budget must be in [0, 256], got {self.budget}")
        if not 1 <= self.max_depth <= 64 or not 1 <= self.max_branch <= 16 or self.level_width < 1:
            raise ValueError("tree depth must be in [1, 64], branching in [1, 16], level width >= 1")
        if not 0 <= self.min_score <= 1:
            raise ValueError(f"min score must be in [0, 1], got {self.min_score}")
        if not 0 <= self.lookup <= 64 or not 1 <= self.lookup_ngram <= 8:
            raise ValueError("lookup tokens must be in [0, 64] and the lookup n-gram in [1, 8]")
        if not all(0 <= score <= 1 for score in self.min_scores):
            raise ValueError("every planned min score must be in [0, 1]")

    def min_score_at(self, drafted: int) -> float:
        """The least path score the next node needs with `drafted` nodes in the tree (above 1: none may join)."""
        if not self.min_scores:
            return self.min_score
        return self.min_scores[drafted] if drafted < len(self.min_scores) else 2.0

    def within(self, room: int) -> "TreeSpec":
        """This spec for a round that may commit at most `room` tokens: no guess deeper than room - 1, as the target's
        own token fills the last place, and none where room is 1. A guess past that can never be committed, yet costs
        a draft forward and a verified token: with 5 tokens left, a 64-token run on HumanEval/154 drafted 8 guesses
        (speculative) and 15 (staged)."""
        if self.past_room or room - 1 >= max(self.max_depth, self.lookup):
            return self
        if room <= 1:
            return replace(self, budget=0, lookup=0)
        return replace(self, max_depth=min(self.max_depth, room - 1), lookup=min(self.lookup, room - 1))

    def static_paths(self) -> frozenset[tuple[int, ...]]:
        """A static shape's paths, built once per shape (every round of a run asks for them)."""
        return _static_paths(self.shape, self.budget, self.max_depth, self.max_branch)


@functools.lru_cache(maxsize=64)
def _static_paths(shape: str, budget: int, max_depth: int, max_branch: int) -> frozenset[tuple[int, ...]]:
    paths = chain_shape(min(budget, max_depth)) if shape == "chain" else best_static_shape(budget, max_depth,
                                                                                          max_branch)
    validate_shape(paths)
    return frozenset(paths)
