"""The interface every drafter fills.

A round of speculation builds a token tree under the root (the last committed token). The tree
builder asks a drafter for next-token scores at some of the tree's nodes (`expand`), and after
verification tells it which path the target accepted (`commit`). A drafter used as a *lower stage*
of another only has to `guess` a short greedy continuation of a token sequence.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from ...backends.interface import ForwardLog, ModelCache
from ..timing import PhaseTimer
from ..tree import Tree


class Guess(NamedTuple):
    """A lower stage's guessed continuation, and for each of its tokens what vouches for it: the evidence its chance of
    being the draft's own next token is learnt under (feed_gate.py)."""
    tokens: list[int]
    evidence: tuple[str, ...] = ()


class Drafter(ABC):
    kind = "drafter"          # "model", "ngram" or "lookup": how the app colours its nodes
    name = "drafter"
    guess_run = 1             # as a lower stage: how many tokens a model above asks it to guess after each node it
                              # feeds (a model pays a forward per token guessed; a table or the context costs nothing)

    def __init__(self) -> None:
        self.stage = 1
        self.timer = PhaseTimer()

    def attach(self, stage: int, timer: PhaseTimer) -> None:
        """Place this drafter at `stage` of a cascade (1 = right under the target)."""
        self.stage, self.timer = stage, timer

    def stages(self) -> list["Drafter"]:
        """This drafter and the ones below it, top first."""
        return [self]

    def fit_static(self, static_len: int) -> None:
        """The target runs over a static KV cache of this many entries (a compiled target): a drafter
        with a compiled model keeps a static cache of the same length, so its shapes stay fixed too."""

    def start(self, tokens: list[int], prefilled=None) -> None:
        """A new sequence begins with these committed tokens; prefilled: an engine.Prefill of them,
        whose caches a drafter may copy instead of reading the tokens."""

    @abstractmethod
    def expand(self, tree: Tree, nodes: list[int], context: list[int]) -> list[torch.Tensor | None]:
        """Next-token log-scores (logits or log-probs, [vocab]) after each node; None = no proposal.

        `context` is the committed sequence, ending with the tree's root token.
        """

    def support(self) -> torch.Tensor | None:
        """The tokens expand's rows can score above -inf (ascending), where that is known to be a part of the
        vocabulary (a draft model's output vocabulary); None: any token."""
        return None

    def has_scores(self, tree: Tree, node: int) -> bool:
        """Whether expanding `node` needs no forward of its own: its scores came with an earlier feed."""
        return False

    def proposer_stage(self, tree: Tree, parent: int, token: int) -> int:
        """The stage to credit for proposing `token` under `parent` (for display)."""
        return self.stage

    def commit(self, tree: Tree, path: list[int], context: list[int]) -> None:
        """The target accepted `path`; `context` is the committed sequence before this round."""

    @abstractmethod
    def guess(self, sequence: list[int], n: int) -> Guess:
        """Up to n tokens this drafter would greedily continue `sequence` with."""

    def kv_models(self) -> list[ModelCache]:
        """The caches of the models inside this drafter, top stage first (none for n-gram tables and lookup)."""
        return []

    def forward_logs(self) -> dict[str, ForwardLog]:
        """Forward passes of the models inside this drafter since the last clear, by model name."""
        return {kv.name: kv.log for kv in self.kv_models()}

    def model_costs(self) -> dict[str, tuple[int, int, int]]:
        """costs() of the caches of the models inside this drafter: (weight bytes read per forward, KV bytes
        per cached token, weight bytes per token fed)."""
        return {kv.name: kv.costs() for kv in self.kv_models()}
