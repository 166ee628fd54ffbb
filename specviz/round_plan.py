"""Each round planned for tokens per second: how much to guess, priced by the machine's cost curves, with each guess's
chance taken from what this run's rounds actually yielded (specviz/calibration.py).

Before a round the planner prices chains of k guesses (k = 0 is a plain step): k guesses make 1 + a1 + a1 a2 + ...
tokens, a_d being the calibrated chance that a round which reached depth d goes one guess further, and cost one
target forward of k + 1 tokens and k draft levels (staged's lower stage spares some of them: the share this run
needed). The best rate R decides the round: a plain step where no chain beats one token per one-token forward, else
a tree grown by R. While growing it, a guess joins when its calibrated chance pays for what it adds to verification
at that rate (chance >= R x (c(n + 2) - c(n + 1))), and a node is expanded (a draft forward) when its best child
would pay for that forward too. Growing by the best rate rather than by plain decoding's maximises tokens per second
(the ratio rises while a guess adds more tokens per second than the round already makes). After PROBE_EVERY plain
steps in a row a round probes with PROBE_GUESSES guesses whatever their price, so speculation comes back when the text
turns predictable; a probe accepted whole is followed by another.

Everything here depends on the curves and on the rounds already verified, never on a clock or on the round being
drafted, so a round's shape is fixed before its tokens are drawn (sampling stays exact) and a run repeats itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .calibration import Calibration
from .trace import PlanRecord
from .tree import Tree
from .tree_plan import TreePlan, interpolate

PROBE_EVERY = 4         # plain steps in a row before a probe
PROBE_GUESSES = 2       # a probe's chain
LONGEST_CHAIN = 12      # guesses a plan prices at most
TOP_PRIOR = 0.8         # a draft's probability for its own first choice, before any round
FADE = 0.9              # how much of the past the running means below keep each round


@dataclass(frozen=True)
class Costs:
    """Seconds: target[n] a target forward of n tokens (n >= 1), `level` one draft level as this strategy feeds it."""
    target: tuple[float, ...]
    level: float

    @classmethod
    def of(cls, plan: TreePlan, level_feed: int, most: int = 64) -> "Costs":
        target = tuple(interpolate(plan.target, max(n, 1)) for n in range(most + 2))
        return cls(target, interpolate(plan.draft, level_feed))

    def verify(self, fed: int) -> float:
        return self.target[min(fed, len(self.target) - 1)]

    def extra(self, drafted: int) -> float:
        """What one more guess adds to verifying the root and `drafted` guesses."""
        return self.verify(drafted + 2) - self.verify(drafted + 1)


@dataclass
class RoundPlan:
    """One round's decisions, fixed before it is drafted. kind: "speculate", "plain" or "probe"."""
    kind: str
    rate: float                 # tokens per second a guess must beat (the best chain's, or plain decoding's)
    guesses: int                # the best chain's length
    expected_tokens: float
    expected_s: float
    costs: Costs
    calibration: Calibration
    max_depth: int = LONGEST_CHAIN
    max_branch: int = 16
    top: float = TOP_PRIOR      # the draft's usual probability for its first choice, in this run
    chances: dict[int, float] = field(default_factory=dict)    # per node drafted: the chance the plan gave it
    levels: int = 0             # draft levels the round expanded (the tree builder counts them)

    @property
    def drafts(self) -> bool:
        return self.kind != "plain"

    def value(self, kind: str, depth: int, score: float) -> float:
        return self.calibration.chance(kind, depth, score)

    def need(self, drafted: int) -> float:
        """The least chance the next guess needs, with `drafted` guesses in the tree."""
        return 0.0 if self.kind == "probe" else self.rate * self.costs.extra(drafted)

    def expands(self, depth: int, score: float, drafted: int, free: bool) -> bool:
        """Whether a draft forward under a node at `depth` with path `score` pays (`free`: its scores are already
        there, fed with a lower stage's guess): its likely first child must pay for verifying and for that forward."""
        if depth >= self.max_depth:
            return False
        if self.kind == "probe" or depth == 0:
            return True
        cost = 0.0 if free else self.rate * self.costs.level
        return self.value("model", depth + 1, score * self.top) >= self.need(drafted) + cost


class RoundPlanner:
    def __init__(self, costs: Costs, calibration: Calibration, forward_share: float = 1.0, on_finish=None):
        """forward_share: the share of draft levels that need a forward of their own at first (staged's lower stage
        feeds some with its guesses); on_finish(calibration): called once when the generation ends."""
        self.costs = costs
        self.calibration = calibration
        self.share = forward_share
        self.top = TOP_PRIOR
        self.plain_run = 0          # plain steps since the last round that drafted
        self.probe_again = False
        self.on_finish = on_finish
        self.last: RoundPlan | None = None

    def chain(self, k: int, rates: list[float]) -> tuple[float, float]:
        """A chain of k guesses: expected tokens (the bonus included) and seconds."""
        tokens, reach = 1.0, 1.0
        for rate in rates[:k]:
            reach *= rate
            tokens += reach
        return tokens, self.costs.verify(k + 1) + k * self.share * self.costs.level

    def plan(self) -> RoundPlan:
        rates = self.calibration.depth_rates(LONGEST_CHAIN)
        priced = [self.chain(k, rates) for k in range(LONGEST_CHAIN + 1)]
        best = max(range(len(priced)), key=lambda k: priced[k][0] / priced[k][1])
        tokens, seconds = priced[best]
        kind = "speculate" if best > 0 else "plain"
        if best == 0 and (self.plain_run >= PROBE_EVERY or self.probe_again):
            kind = "probe"
        plan = RoundPlan(kind, tokens / seconds, best, tokens, seconds, self.costs, self.calibration, top=self.top)
        if kind == "probe":
            plan.max_depth, plan.max_branch = PROBE_GUESSES, 1
            plan.expected_tokens, plan.expected_s = self.chain(PROBE_GUESSES, rates)
        self.last = plan
        return plan

    def observe(self, tree: Tree, path: list[int], kinds: list[str], levels: int, forwards: int) -> None:
        """After verification: the guesses of the round and which were accepted; kinds: per stage index, its kind;
        levels: draft levels expanded, forwards: draft forwards they took."""
        plan, accepted = self.last, set(path)
        self.probe_again = plan is not None and plan.kind == "probe" and len(path) - 1 >= PROBE_GUESSES
        if len(tree) == 1 or plan is None or plan.kind == "plain":
            self.plain_run += 1
            if len(tree) == 1:
                return
        else:
            self.plain_run = 0
        guesses, scores = [], {0: 1.0}
        for node in range(1, len(tree)):
            scores[node] = scores[tree.parents[node]] * tree.draft_probs[node]
            if tree.drawn[node]:
                guesses.append((kinds[tree.stages[node]], tree.depths[node], scores[node], node in accepted))
            if tree.point_mass[node]:
                guesses.append(("lookup", tree.depths[node], 1.0, node in accepted))
        reached, drafted_accepted = drafted_depths(tree, path)
        self.calibration.observe(guesses, reached, drafted_accepted)
        firsts = [tree.draft_probs[tree.children[n][0]] for n in range(len(tree))
                  if tree.children[n] and tree.drawn[tree.children[n][0]]]
        if firsts:
            self.top = FADE * self.top + (1 - FADE) * sum(firsts) / len(firsts)
        if levels:
            self.share = FADE * self.share + (1 - FADE) * min(1.0, forwards / levels)

    def finish(self) -> None:
        if self.on_finish is not None:
            self.on_finish(self.calibration)
            self.on_finish = None

    def record(self, plan: RoundPlan, kinds_in_use: list[str]) -> PlanRecord:
        rates = self.calibration.depth_rates(max(plan.guesses, PROBE_GUESSES) + 1)
        shown = {kind: self.calibration.table(kind) for kind in dict.fromkeys(kinds_in_use)}
        record = PlanRecord(kind=plan.kind, guesses=plan.guesses, expected_tokens=round(plan.expected_tokens, 3),
                            expected_ms=round(plan.expected_s * 1e3, 2), plain_ms=round(self.costs.verify(1) * 1e3, 2),
                            rates=[round(r, 3) for r in rates], calibration=shown, reason="")
        record.reason = reason(record)
        return record


def drafted_depths(tree: Tree, path: list[int]) -> tuple[int, int]:
    """How deep the drafted guesses reached under the accepted path (the deepest depth at which an accepted node had
    a drafted child), and how many drafted guesses it accepted: context lookup's own branch left out, so that its hits
    do not vouch for the draft."""
    reached = accepted = 0
    for i, node in enumerate(path):
        if not any(tree.drawn[child] for child in tree.children[node]):
            break
        reached = tree.depths[node] + 1
        if i + 1 == len(path) or not tree.drawn[path[i + 1]]:
            break
        accepted += 1
    return reached, accepted


def reason(plan: PlanRecord) -> str:
    """Why a round had its shape, in a sentence, from a trace's plan record."""
    rates = plan.rates[: max(plan.guesses, 1) + 1]
    said = ", ".join(f"{rate:.0%} at depth {depth}" for depth, rate in enumerate(rates, 1))
    history = f"The last rounds accepted {said} of the guesses that reached it"
    speed = plan.expected_tokens / plan.expected_ms * plan.plain_ms if plan.expected_ms else 1.0
    if plan.kind == "plain":
        return (f"{history}: no guess was expected to pay for itself against a plain step ({plan.plain_ms:.0f} ms a "
                f"token), so this round is a plain step; a small guess probes after {PROBE_EVERY} plain steps.")
    if plan.kind == "probe":
        return (f"{history}. After {PROBE_EVERY} plain steps this round probes with up to {PROBE_GUESSES} guesses "
                "whatever they cost, to see whether the text has turned predictable.")
    return (f"{history}: this round guesses about {plan.guesses} ({plan.expected_tokens:.1f} tokens expected in "
            f"{plan.expected_ms:.0f} ms, {speed:.2f}x a plain step), and each guess joins while its calibrated chance "
            "beats that rate.")
