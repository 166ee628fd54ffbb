"""The interface every drafter fills.

A round of speculation builds a token tree under the root (the last committed token). The tree
builder asks a drafter for next-token scores at some of the tree's nodes (`expand`), and after
verification tells it which path the target accepted (`commit`). A drafter used as a *lower stage*
of another only has to `guess` a short greedy continuation of a token sequence.

Which of a lower stage's guessed tokens a draft model feeds beside the nodes it expands is the feed gate's choice
(`FeedGate`). A guessed token fed in the draft's forward costs what that token adds to the forward, by this machine's
draft cost curve; where it is the draft's own next token, the level below needs no forward of its own. On 2 AVX2 cores
one more token added 35% to a 0.5B draft's forward (6.1 ms for one token, 8.3 for two), on AVX512-VNNI 3% (6.9, 7.1):
fed whatever its chance, a trigram guess that was right a tenth of the time made staged slower than the draft alone. So
a token joins while its chance of being right (times the forward it saves) beats what it adds, its chance learnt from
this run's own forwards per kind of evidence (a guess's `evidence`), starting from PRIORS. The gate changes what a
level costs, never the tree: a guess only lends scores the draft would compute anyway.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ...backends.interface import ModelCache
from ..trace import PhaseTimer
from ..tree import Tree


class Guess(NamedTuple):
    """A lower stage's guessed continuation, and for each of its tokens what vouches for it: the evidence its chance of
    being the draft's own next token is learnt under (FeedGate)."""
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

# The chance that a lower stage's guess is the 0.5B draft's next token, teacher-forced on the 1.5B's greedy text of
# tuning prompts (HumanEval/20-25 and six prose prompts, 766 positions), by evidence: a run copied from the text, else
# the trigram's most likely token by its probability. A copied run's later tokens follow a first that was right.
PRIORS = {"copy": 0.69, "copy, later": 0.75, "model": 0.6,
          "ngram >= 0.9": 0.69, "ngram >= 0.7": 0.5, "ngram >= 0.5": 0.35, "ngram >= 0.3": 0.22, "ngram < 0.3": 0.08}
NGRAM_BINS = (0.9, 0.7, 0.5, 0.3)
PRIOR_WEIGHT = 4.0      # forwards' worth of evidence the prior counts for
KEEP = 0.95             # the weight earlier evidence keeps at each new one: the text changes


def ngram_evidence(probability: float) -> str:
    """The evidence for an n-gram table's most likely token, by its probability."""
    return next((f"ngram >= {b}" for b in NGRAM_BINS if probability >= b), f"ngram < {NGRAM_BINS[-1]}")


def copy_evidence(length: int) -> tuple[str, ...]:
    return ("copy",) + ("copy, later",) * (length - 1) if length else ()


class FeedGate:
    def __init__(self, draft_cost: Sequence[float]):
        """draft_cost[n]: seconds of a draft forward of n tokens (n >= 1), this machine's curve."""
        self.draft_cost = draft_cost
        self.hits: dict[str, float] = {}
        self.tried: dict[str, float] = {}

    def cost(self, fed: int) -> float:
        return self.draft_cost[min(fed, len(self.draft_cost) - 1)]

    def chance(self, evidence: str) -> float:
        prior = PRIORS.get(evidence, 0.0)
        return (self.hits.get(evidence, 0.0) + prior * PRIOR_WEIGHT) / (self.tried.get(evidence, 0.0) + PRIOR_WEIGHT)

    def learn(self, evidence: str, hit: bool) -> None:
        self.hits[evidence] = self.hits.get(evidence, 0.0) * KEEP + hit
        self.tried[evidence] = self.tried.get(evidence, 0.0) * KEEP + 1.0

    def choose(self, guesses: list[Guess], nodes: int) -> list[int]:
        """How many leading tokens of each node's guess to feed with the `nodes` nodes of a forward: the likeliest
        first, while a token's chance of saving a forward (the product of its run's chances so far, so a run's tokens
        come in order) is worth what it adds to the forward."""
        saved = self.cost(1)
        offers = []
        for i, guess in enumerate(guesses):
            chance = 1.0
            for j, evidence in enumerate(guess.evidence[:len(guess.tokens)]):
                chance *= self.chance(evidence)
                offers.append((-chance, i, j))
        taken, fed = [0] * len(guesses), nodes
        for neg_chance, i, j in sorted(offers):
            if -neg_chance * saved < self.cost(fed + 1) - self.cost(fed):
                break
            taken[i], fed = j + 1, fed + 1
        return taken
