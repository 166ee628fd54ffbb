"""What the draft's confidence is worth in this run: the chance that a drafted guess is accepted, learnt from the
rounds already verified.

A draft model says how sure it is (the product of its probabilities down a path, the path score), but a draft can be
over- or under-confident, and how often its guesses pass depends on the text. After every round the engine knows which
guesses the target accepted, so the calibration keeps, per proposing stage (`model`: the draft model's own choice,
`ngram`: a choice the lower stage guessed too, `lookup`: a run copied from the text), per depth bucket and per bin of
the path score, how many such guesses were drafted and how many were on the accepted path. Its estimate of a guess's
chance is those counts smoothed toward a prior (Beta smoothing with PRIOR_WEIGHT pseudo-guesses at the prior's mean),
a deeper bucket's prior shifted by what the bucket above it learnt (a depth no round reached yet starts from what the
shallower ones show). A kind's past evidence fades by KEEP in each round that adds to it, so the estimate follows the
text when it turns more or less predictable. The prior is the oldest evidence of all, so a cell's prior fades by KEEP
too in each round that adds to that cell, down to PRIOR_FLOOR: were it to keep its weight while the run's evidence
fades, it would set a floor under the estimate (a prior learnt on code, where copied text is often right, kept context
lookup at 15% on prose that never copied right, enough for a one-token guess to join every plain step on an AVX2
machine where it costs 12% of that step).

It also keeps, per depth, how often a round that reached a depth went one accepted guess further (`depth_rates`): the
rates the round planner (specviz/decode/planner.py) prices a chain with before a round, and the app quotes.

`Agreement` is the same kind of estimate for the round planner's probe gate: how often the draft's first guess passes,
given the target's probability of the token that came there (free in every step, plain ones too).

The prior: by default the draft taken at its word (a bin's mean score) and context lookup at LOOKUP_PRIOR; where a
model pair's calibration was stored on this machine (specviz/profile/store.py), its means, learnt over earlier runs.
"""
from __future__ import annotations

from bisect import bisect_right

KINDS = ("model", "ngram", "lookup")
SCORE_EDGES = (0.2, 0.4, 0.6, 0.75, 0.9, 0.97)     # bins of the path score: [0, 0.2), [0.2, 0.4), ..., [0.97, 1]
BIN_MEANS = (0.1, 0.3, 0.5, 0.675, 0.825, 0.935, 0.985)
DEPTH_STARTS = (1, 2, 3, 5)                         # depth buckets: 1, 2, 3-4, 5 and deeper
LOOKUP_PRIOR = (0.2, 0.15, 0.1, 0.1)                # a copied run's chance per depth bucket, before any round: low,
                                                    # as every copy found is judged, joined or not (unverified_copies)
DEPTH_PRIOR = 0.6                                   # a round's chance to go one guess deeper, before any round
MAX_DEPTH = 16
PRIOR_WEIGHT = 2.0      # pseudo-guesses of the prior in each cell: a few rounds' evidence outweighs it...
PRIOR_FLOOR = 0.25      # ...and what it fades to as the cell's own evidence comes in
KEEP = 0.9              # the weight a round's evidence keeps at each later round that drafted (about 10 rounds)
STORED_CAP = 200.0      # guesses a stored cell's mean may stand for (later runs still move it)
TOKEN_KEEP = 0.98       # the weight a drafted round's evidence on agreement keeps at each later token (about 50)
CONFIDENCE_FADE = 0.7   # the weight the past keeps at each committed token in the predicted chance of a first guess


def score_bin(score: float) -> int:
    return bisect_right(SCORE_EDGES, score)


def depth_bucket(depth: int) -> int:
    return bisect_right(DEPTH_STARTS, depth) - 1


def unverified_copies(copied: tuple[int, ...], joined: int, committed: list[int]) -> list[tuple[str, int, float, bool]]:
    """The tokens context lookup copied but a round did not verify (those past the `joined` first), as guesses judged by
    the tokens it committed: the verdict each would have had (sampled, a point mass passes with the chance the committed
    token had), as far as the round committed."""
    return [("lookup", depth, 1.0, list(copied[:depth]) == list(committed[:depth]))
            for depth in range(joined + 1, min(len(copied), len(committed)) + 1)]


def default_prior() -> dict[str, list[list[float]]]:
    """Per kind, per depth bucket, per score bin: the chance of acceptance assumed before any evidence."""
    drafted = [list(BIN_MEANS) for _ in DEPTH_STARTS]
    return {"model": drafted, "ngram": [list(row) for row in drafted],
            "lookup": [[chance] * len(BIN_MEANS) for chance in LOOKUP_PRIOR]}


def _cells(value: float = 0.0) -> dict[str, list[list[float]]]:
    return {kind: [[value] * len(BIN_MEANS) for _ in DEPTH_STARTS] for kind in KINDS}


class Calibration:
    def __init__(self, prior: dict | None = None):
        """prior: a stored calibration (to_dict's "stored" part: per kind, depth bucket and bin, [mean, guesses]);
        None: default_prior()."""
        self.prior = default_prior()
        self.stored = {kind: [[[mean, 0.0] for mean in row] for row in rows] for kind, rows in self.prior.items()}
        for kind, rows in (prior or {}).items():
            for d, row in enumerate(rows[: len(DEPTH_STARTS)] if kind in KINDS else []):
                for b, (mean, guesses) in enumerate(row[: len(BIN_MEANS)]):
                    weight = min(max(float(guesses), 0.0), STORED_CAP)
                    mean = min(max(float(mean), 0.0), 1.0)
                    self.stored[kind][d][b] = [mean, weight]
                    # the default weighs PRIOR_WEIGHT, the stored mean what it stands for
                    default = self.prior[kind][d][b]
                    self.prior[kind][d][b] = (default * PRIOR_WEIGHT + mean * weight) / (PRIOR_WEIGHT + weight)
        self.hits, self.tried = _cells(), _cells()              # faded evidence of this run
        self.prior_weight = _cells(PRIOR_WEIGHT)                # each cell's prior, fading as the cell learns
        self.run_hits, self.run_tried = _cells(), _cells()      # all of this run's evidence, for the store
        self.depth_hits, self.depth_tried = [0.0] * MAX_DEPTH, [0.0] * MAX_DEPTH
        self.rounds = 0
        self._table = {kind: [list(row) for row in rows] for kind, rows in self.prior.items()}

    def chance(self, kind: str, depth: int, score: float) -> float:
        """The estimated chance that a guess of this kind, depth and path score is on the accepted path."""
        return self._table[kind][depth_bucket(depth)][score_bin(score)]

    def any_right(self, kind: str) -> bool:
        """Whether a guess of this kind was right in this run."""
        return any(value > 0.0 for row in self.run_hits[kind] for value in row)

    def depth_rates(self, depths: int = MAX_DEPTH) -> list[float]:
        """Per depth 1, 2, ...: the chance that a round which reached the depth before it goes one guess further."""
        return [(self.depth_hits[d] + DEPTH_PRIOR * PRIOR_WEIGHT) / (self.depth_tried[d] + PRIOR_WEIGHT)
                for d in range(min(depths, MAX_DEPTH))]

    def depth_evidence(self, depth: int) -> float:
        """The faded count of rounds behind depth_rates()[depth - 1]."""
        return self.depth_tried[depth - 1] if 1 <= depth <= MAX_DEPTH else 0.0

    def observe(self, guesses: list[tuple[str, int, float, bool]], reached: int, accepted: int) -> None:
        """One verified round: each guess as (kind, depth, path score, on the accepted path); `reached`: the deepest
        depth at which an accepted node had a drafted guess under it, `accepted`: how many drafted guesses the accepted
        path holds (round_plan.drafted_depths)."""
        if not guesses:
            return
        self.rounds += 1
        for kind in {kind for kind, *_ in guesses}:     # a kind's evidence fades only in rounds that add to it
            for table in (self.hits, self.tried):
                for row in table[kind]:
                    row[:] = [value * KEEP for value in row]
        for kind, d, b in {(kind, depth_bucket(depth), score_bin(score)) for kind, depth, score, _ in guesses}:
            self.prior_weight[kind][d][b] = max(self.prior_weight[kind][d][b] * KEEP, PRIOR_FLOOR)
        for kind, depth, score, hit in guesses:
            d, b = depth_bucket(depth), score_bin(score)
            for hits, tried in ((self.hits, self.tried), (self.run_hits, self.run_tried)):
                hits[kind][d][b] += hit
                tried[kind][d][b] += 1.0
        if reached:
            self.depth_hits = [value * KEEP for value in self.depth_hits]
            self.depth_tried = [value * KEEP for value in self.depth_tried]
            for depth in range(1, min(reached, MAX_DEPTH) + 1):
                self.depth_tried[depth - 1] += 1.0
                self.depth_hits[depth - 1] += depth <= accepted
        self._refresh({kind for kind, *_ in guesses})

    def _refresh(self, kinds) -> None:
        """Each cell's estimate: its evidence smoothed toward its prior, the prior shifted by what the shallower bucket
        learnt (est - prior there), so a depth no round has reached yet starts from what the shallower ones show."""
        for kind in kinds:
            rows = self._table[kind]
            for d, row in enumerate(rows):
                for b in range(len(row)):
                    mean = self.prior[kind][d][b]
                    if d:
                        mean = min(max(mean + rows[d - 1][b] - self.prior[kind][d - 1][b], 0.005), 0.995)
                    weight = self.prior_weight[kind][d][b]
                    row[b] = (self.hits[kind][d][b] + mean * weight) / (self.tried[kind][d][b] + weight)

    def table(self, kind: str) -> list[list[float]]:
        """The current estimates of one kind, per depth bucket and score bin (rounded, for a trace record)."""
        return [[round(v, 3) for v in row] for row in self._table[kind]]

    def to_store(self) -> dict:
        """The stored prior for the next run: each cell's mean over the stored guesses and this run's, and how many
        guesses it stands for (at most STORED_CAP)."""
        out = {}
        for kind, rows in self.stored.items():
            out[kind] = []
            for d, row in enumerate(rows):
                cells = []
                for b, (mean, weight) in enumerate(row):
                    tried, hits = self.run_tried[kind][d][b], self.run_hits[kind][d][b]
                    total = weight + tried
                    cells.append([round((mean * weight + hits) / total, 4) if total else mean,
                                  round(min(total, STORED_CAP), 1)])
                out[kind].append(cells)
        return out


class Agreement:
    """How often the draft's first guess passes, given the target's probability of the token that came there, learnt
    from this run's drafted rounds (per bin of that probability, smoothed toward the bin's mean: a
    draft of the target's family agrees about as often as the target is sure); and, from every committed token's
    probability, the chance a first guess would pass at the recent positions (`predicted`, None before any token), and
    the same chance from the target's confidence alone, no evidence (`sure`). The evidence fades with every token
    committed (TOKEN_KEEP), drafted or not."""

    def __init__(self):
        self.hits, self.tried = [0.0] * len(BIN_MEANS), [0.0] * len(BIN_MEANS)
        self.predicted: float | None = None
        self.sure: float | None = None

    def chance(self, probability: float) -> float:
        b = score_bin(probability)
        return (self.hits[b] + BIN_MEANS[b] * PRIOR_WEIGHT) / (self.tried[b] + PRIOR_WEIGHT)

    def learn(self, probability: float, passed: bool) -> None:
        b = score_bin(probability)
        self.hits[b] += passed
        self.tried[b] += 1.0

    def follow(self, probabilities: list[float]) -> None:
        for probability in probabilities:
            # evidence fades with each token committed, so that what the draft showed long ago, on other text, gives
            # way to the prior and a probe can find out again
            self.hits = [value * TOKEN_KEEP for value in self.hits]
            self.tried = [value * TOKEN_KEEP for value in self.tried]
            chance, prior = self.chance(probability), BIN_MEANS[score_bin(probability)]
            if self.predicted is None:
                self.predicted, self.sure = chance, prior
            else:
                self.predicted = CONFIDENCE_FADE * self.predicted + (1 - CONFIDENCE_FADE) * chance
                self.sure = CONFIDENCE_FADE * self.sure + (1 - CONFIDENCE_FADE) * prior
