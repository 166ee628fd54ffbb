"""Which of a lower stage's guessed tokens a draft model feeds beside the nodes it expands.

A guessed token fed in the draft's forward costs what that token adds to the forward, by this machine's draft cost
curve; where it is the draft's own next token, the level below needs no forward of its own. On 2 AVX2 cores one more
token added 35% to a 0.5B draft's forward (6.1 ms for one token, 8.3 for two), on AVX512-VNNI 3% (6.9, 7.1): fed
whatever its chance, a trigram guess that was right a tenth of the time made staged slower than the draft alone. So
a token joins while its chance of being right (times the forward it saves) beats what it adds, its chance learnt from
this run's own forwards per kind of evidence, starting from PRIORS. The gate changes what a level costs, never the
tree: a guess only lends scores the draft would compute anyway.
"""
from __future__ import annotations

from collections.abc import Sequence

from .base import Guess

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
