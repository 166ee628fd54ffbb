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

from ...backends.interface import ModelCache
from ..trace import PhaseTimer
from ..tree import Tree


class Guess(NamedTuple):
    """A lower stage's guessed continuation, and for each of its tokens what vouches for it: the evidence its chance of
    being the draft's own next token is learnt under (feed_gate.py)."""
    tokens: list[int]
    evidence: tuple[str, ...] = ()


class Seen(NamedTuple):
    """What a drafter knows of a path under the root: the stage that proposed its last token, and whether the path's
    scores came with a forward already (a lower stage's guess, fed beside the node above it)."""
    stage: int
    scored: bool = False


class Drafter(ABC):
    kind = "drafter"          # "model", "ngram" or "lookup": how the app colours its nodes
    name = "drafter"
    guess_run = 1             # as a lower stage: how many tokens a model above asks it to guess after each node it
                              # feeds (a model pays a forward per token guessed; a table or the context costs nothing)
    lower: "Drafter | None" = None      # the stage below, which guesses for this one
    support: torch.Tensor | None = None     # the tokens expand's rows can score above -inf (ascending), where that is
                                            # a known part of the vocabulary (a draft model's output vocabulary)

    def __init__(self) -> None:
        self.stage = 1
        self.timer = PhaseTimer()

    def start(self, tokens: list[int], prefilled=None, *, stage: int = 1, timer: PhaseTimer | None = None,
              static_len: int | None = None) -> None:
        """A new sequence begins with these committed tokens, this drafter at `stage` of its cascade (1 = right under
        the target, the stages below it numbered on), its work timed by `timer`. prefilled: an engine.Prefill of the
        tokens, whose caches a drafter may copy instead of reading them; static_len: the target runs over a static
        KV cache of this many entries (a compiled target), so a drafter with a compiled model keeps one too."""
        self.stage = stage
        self.timer = timer if timer is not None else self.timer
        if self.lower is not None:
            self.lower.start(tokens, prefilled, stage=stage + 1, timer=self.timer, static_len=static_len)

    @abstractmethod
    def expand(self, tree: Tree, nodes: list[int], context: list[int]) -> list[torch.Tensor | None]:
        """Next-token log-scores (logits or log-probs, [vocab]) after each node; None = no proposal.

        `context` is the committed sequence, ending with the tree's root token.
        """

    def seen(self, path: tuple[int, ...]) -> Seen:
        """What this drafter knows of a path of tokens under the root (for display, calibration and pricing)."""
        return Seen(self.stage)

    def commit(self, tree: Tree, path: list[int], context: list[int]) -> None:
        """The target accepted `path`; `context` is the committed sequence before this round."""
        if self.lower is not None:
            self.lower.commit(tree, path, context)

    @abstractmethod
    def guess(self, sequence: list[int], n: int) -> Guess:
        """Up to n tokens this drafter would greedily continue `sequence` with."""

    def kv_models(self) -> list[ModelCache]:
        """The caches of the models inside this drafter and the stages below it, top stage first (none for n-gram
        tables and lookup)."""
        return self.lower.kv_models() if self.lower is not None else []


def cascade(drafter: Drafter) -> list[Drafter]:
    """A drafter and the stages below it, top first."""
    stages = [drafter]
    while stages[-1].lower is not None:
        stages.append(stages[-1].lower)
    return stages
