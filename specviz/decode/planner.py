"""Each round planned for tokens per second: how much to guess, priced by the machine's cost curves, with each guess's
chance taken from what this run's rounds actually yielded (specviz/decode/calibration.py).

The planner keeps what the recent drafted rounds made: tokens committed and seconds, priced by the curves (the target's
forward of the tree, the draft's forwards by the tokens each fed), faded round by round, context lookup's copies left
out of both (they join plain steps too). Their ratio R is the rate speculation makes here lately (what the draft reads
to catch up after plain steps is left out: a cost of coming back, not of a round). Before a round: where R is below
plain decoding's (one token per one-token forward), once the run has drafted FIRST_ROUNDS rounds, and where what the
last rounds were worth beyond plain steps (each at its guesses' calibrated chances, RoundPlanner.worth) is below
nothing by more than its spread allows (drafting_pays), the round is a
plain step (context lookup may still join, it costs no draft forward: a copy's first token, the rest once this run's
copies were right, RoundPlan.value; every copy found is judged by the tokens committed, joined or not, so a copy starts
unlikely and joins once this run shows it would have been right), and after PROBE_EVERY plain steps in a row a round
probes with PROBE_GUESSES guesses whatever their price, so that speculation comes back when the text turns predictable
(a probe accepted whole is followed by another; after one that failed the wait doubles, up to PROBE_MOST, until a round
drafts again). A probe is costly after plain steps: the draft must first read every token it missed, about a tenth of a
plain step each on an AVX2 machine, so a probe that fails costs a tenth of the plain run before it. So a probe waits,
too, until the target's own recent confidence says the draft would likely pass (`Agreement`, calibration.py): the
target's probability of each token committed in plain steps is free, and drafted rounds teach what a given probability
means for the draft's first guess. Otherwise the round drafts, and R prices each guess while the tree grows: a guess
joins while its calibrated chance is at least R x (c(n + 2) - c(n + 1)), what it adds to verifying n guesses; a node is
expanded (a draft forward) while its likely child would also pay for that forward. Growing by R rather than by plain
decoding's rate is what maximises tokens per second: a round's ratio rises only while a guess adds more tokens per
second than the round already makes (Dinkelbach's rule); the rate it yields then becomes the next rounds' R.

Everything here depends on the curves and on the rounds already verified, never on a clock or on the round being
drafted, so a round's shape is fixed before its tokens are drawn (sampling stays exact) and a run repeats itself.
Each plan's reason in words is made from its record, outside the round, by specviz/decode/reasons.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .calibration import Agreement, Calibration, unverified_copies
from .trace import PlanRecord
from .tree import Tree
from .costs import TreePlan, interpolate

PROBE_EVERY = 3         # plain steps in a row before a probe...
PROBE_MOST = 12         # ...doubled after each failed probe, up to this: on text the draft cannot follow, probes' draft
                        # forwards would lose what the plain steps saved
PROBE_GUESSES = 2       # a probe's chain
FADE = 0.7              # the weight the past keeps at each drafted round in the running rate
SHARE_FADE = 0.9        # ...and in the running share of draft levels that needed a forward
LEVEL_FADE = 0.7        # ...and at each draft forward of a level, in what a level costs as this run feeds it
PRIOR_TOKENS = 1.6      # before any round: what a drafted round is taken to make (one guess accepted 60% of the time)
HORIZON = 32            # tokens a probe's gain is counted over at most (no more than are left): code the target is
                        # sure of outlasts it; at 16 a draft 30 tokens behind never came back
SHOWN_DEPTHS = 4        # depths whose acceptance a plan record quotes
FIRST_ROUNDS = 3        # drafted rounds before a run's rate may turn it to plain steps: one round is a geometric draw,
                        # and after one failed first round code that drafting ran at 1.4x went plain for good (AVX2)
EXCESS_FADE = 0.9       # the weight the past keeps at each drafted round in the excess over plain steps (drafting_pays)
DOUBT = 1.0             # standard errors of that excess below nothing before plain steps: at 2, a steady loss of a
                        # sixth of a token a round drafted a whole run (AVX2 prose, priced: lowest 0.89x, 0.93x at 1)...
EARLY_DOUBT = 2.0       # ...once SURE_ROUNDS rounds have drafted; before, a spread is itself a guess, and three
SURE_ROUNDS = 8         # failed first rounds took a draft whose trees were shrinking to plain steps for good
LOOKAHEAD = 8           # guesses below a node an expansion is priced for at most


@dataclass(frozen=True)
class Costs:
    """Seconds: target[n] a target forward of n tokens, draft[n] a draft forward of n tokens (n >= 1), `level` one
    draft level as this strategy feeds it (the planner learns it from the run's forwards: how many of a lower stage's
    guesses a level feeds is the feed gate's choice, drafters/base.py); `reader`: where the draft reads long committed
    feeds through other products (specviz/cpu/prompt_reader.py), the feed length it starts at and its seconds per
    token beyond a one-token forward."""
    target: tuple[float, ...]
    draft: tuple[float, ...]
    level: float
    reader: tuple[int, float] | None = None

    @classmethod
    def of(cls, plan: TreePlan, level_feed: int, most: int = 64,
           reader: tuple[int, int, float] | None = None) -> "Costs":
        """reader: the draft's prompt reader as prepare timed it (the feed length it starts at, the tokens of the timed
        read, its seconds); None where the draft has none."""
        def curve(points):
            return tuple(interpolate(points, max(n, 1)) for n in range(most + 2))
        draft = curve(plan.draft)
        if reader is not None:
            # a forward's fixed part (the draft's one-token forward) and the timed read's rate a token past it: drawn
            # from the draft's own forward where the reader starts instead, an 18-token read was priced at 150 ms where
            # it took 80-100 (AVX2), and through the origin 71
            start, tokens, seconds = reader
            reader = (start, max(seconds - draft[1], 0.0) / max(tokens, 1))
        return cls(curve(plan.target), draft, interpolate(plan.draft, level_feed), reader)

    def verify(self, fed: int) -> float:
        return self.target[min(fed, len(self.target) - 1)]

    def drafting(self, fed: int) -> float:
        return self.draft[min(fed, len(self.draft) - 1)]

    def catch_up(self, fed: int) -> float:
        """The draft reading `fed` committed tokens it missed: through its prompt reader where the feed is that long."""
        if self.reader is None or fed < self.reader[0]:
            return self.drafting(fed)
        return min(self.drafting(fed), self.drafting(1) + fed * self.reader[1])

    def extra(self, drafted: int) -> float:
        """What one more guess adds to verifying the root and `drafted` guesses."""
        return self.verify(drafted + 2) - self.verify(drafted + 1)


@dataclass(frozen=True)
class LookupChoice:
    """What context lookup offered a round and what joined: the copied tokens found, how many joined, and the chance
    and price of the first that did not (else of the last that did)."""
    tokens: tuple[int, ...]
    joined: int
    chance: float
    price: float
    found = property(lambda self: len(self.tokens))


@dataclass
class RoundPlan:
    """One round's decisions, fixed before it is drafted. kind: "speculate", "plain" or "probe"."""
    kind: str
    rate: float                 # tokens per second a guess must beat: the recent drafted rounds', at least plain's
    recent_tokens: float        # what the recent drafted rounds made a round...
    recent_s: float             # ...in so many seconds
    costs: Costs
    calibration: Calibration
    max_depth: int = 64
    max_branch: int = 16
    share: float = 1.0          # the share of draft levels that needed a forward of their own, in this run
    probe_wait: int = PROBE_EVERY   # plain steps in a row before a probe, at this round
    probe_held: bool = False    # a probe was due, but the predicted chance of its guesses did not pay for it

    @property
    def drafts(self) -> bool:
        return self.kind != "plain"

    def value(self, kind: str, depth: int, score: float) -> float:
        # A plain step follows rounds that lost, on text the draft does not know: there the prior (the default, or
        # one learnt on code) let three copied tokens join about once a prose run and fail, 1.5% of it (AVX2,
        # priced); a first token finds out at a third of that price, the rest follow once this run's copies were right
        if kind == "lookup" and self.kind == "plain" and depth > 1 and not self.calibration.any_right(kind):
            return 0.0
        return self.calibration.chance(kind, depth, score)

    def need(self, drafted: int) -> float:
        """The least chance the next guess needs, with `drafted` guesses in the tree."""
        return 0.0 if self.kind == "probe" else self.rate * self.costs.extra(drafted)

    def expands(self, depth: int, score: float, drafted: int, free: bool, last: float) -> bool:
        """Whether a draft forward under a node at `depth` with path `score` pays (`free`: its scores are already
        there, fed with a lower stage's guess; `last`: the draft's probability for the node itself). It opens a chain:
        the guesses below it, each taken to be as likely as the last (a sure draft tends to stay sure), must pay for
        verifying them and for the forwards under them (the first unless free, the later ones as often as this run
        needed one), for some length of that chain."""
        if depth >= self.max_depth:
            return False
        if self.kind == "probe" or depth == 0:
            return True
        forward = self.rate * self.costs.level
        gain, best = (0.0 if free else -forward), float("-inf")
        factor = last
        for step in range(1, LOOKAHEAD + 1):
            score *= factor
            gain += self.value("model", depth + step, score) - self.need(drafted + step - 1)
            best = max(best, gain)
            gain -= forward * self.share
        return best >= 0.0


class RoundPlanner:
    def __init__(self, costs: Costs, calibration: Calibration, learn_as: str | None = None):
        """learn_as: the key the calibration a run ends with may be stored under for the next run (the caller stores
        it, after the run: file work is no part of a generation); None: not to be stored."""
        self.costs = costs
        self.calibration = calibration
        self.share = 1.0
        # one drafted round's worth of prior: a guess accepted 60% of the time, for a two-token target forward and a
        # draft level
        self.tokens, self.seconds = PRIOR_TOKENS, costs.verify(2) + costs.level
        self.plain_run = 0          # plain steps since the last round that drafted
        self.drafted_rounds = 0     # rounds that paid for a draft forward (FIRST_ROUNDS)
        # drafted rounds' faded count, and sums of their excess and its square, from the prior's round: with three
        # rounds alone a spread is a guess, and runs whose first three rounds lost alike took plain steps for good
        prior = PRIOR_TOKENS - self.seconds * self.plain_rate
        self.excess = (1.0, prior, prior ** 2)
        self.probe_wait = PROBE_EVERY   # plain steps in a row before the next probe
        self.probe_again = False
        self.read_prompt = False    # the draft's first forward reads the prompt: a cost of starting, not of a round
        self.learn_as = learn_as
        self.agreement = Agreement()
        self.behind = 0             # tokens committed since the draft last read: a probe's draft must read them first

    @property
    def plain_rate(self) -> float:
        return 1.0 / self.costs.verify(1)

    def plan(self, left: int = HORIZON) -> RoundPlan:
        """The next round's plan; left: the tokens the generation may still write."""
        recent = self.tokens / self.seconds
        kind = "speculate" if self.drafting_pays(recent) or self.drafted_rounds < FIRST_ROUNDS else "plain"
        held = False
        if kind == "plain" and (self.probe_again or self.plain_run >= self.probe_wait):
            held = not self.probe_again and not probe_pays(self.agreement, self.costs, self.behind, left)
            kind = "plain" if held else "probe"
        plan = RoundPlan(kind, max(recent, self.plain_rate), self.tokens, self.seconds, self.costs, self.calibration,
                         share=self.share, probe_wait=self.probe_wait, probe_held=held)
        if kind == "probe":
            plan.max_depth, plan.max_branch = PROBE_GUESSES, 1
        return plan

    def drafting_pays(self, recent: float) -> bool:
        """Whether drafted rounds may still beat plain steps here: the recent rounds' rate does, or the tokens the
        rounds of about the last ten were worth beyond what plain steps would have made in their seconds (their excess,
        each round's worth taken at its guesses' calibrated chances: `worth`) are, on average, at least nothing to
        within DOUBT standard errors of that average. A rate faded over three rounds fell below plain decoding's after
        one failed guess, and such runs stayed plain where drafting on made them 1.0-1.3x (24 prose prompts, AVX2
        prices). Judged by the chances, a round's excess spreads only as far as the calibration moves: a small steady
        loss turns to plain steps once the calibration has learnt it; probes bring back a run that lost early."""
        weight, total, squares = self.excess
        if recent >= self.plain_rate:
            return True
        mean = total / weight
        spread = max(squares / weight - mean * mean, 0.0) ** 0.5
        doubt = DOUBT if self.drafted_rounds >= SURE_ROUNDS else EARLY_DOUBT
        return mean + doubt * spread / weight ** 0.5 >= 0.0

    def observe(self, plan: RoundPlan, tree: Tree, path: list[int], kinds: list[str], draft_feeds: list[int],
                committed_probs: list[float] = (), committed: list[int] = (),
                lookup: LookupChoice | None = None) -> None:
        """After verification: the round's plan and tree, the accepted path, each stage's kind (by stage index), the
        tokens each forward of the top draft model fed this round, the target's probability of each token committed,
        the tokens committed, and what context lookup offered the round."""
        accepted = set(path)
        first_guesses = [child for child in tree.children[0] if tree.drawn[child]]
        if committed_probs and first_guesses:
            self.agreement.learn(committed_probs[0], len(path) > 1 and path[1] in first_guesses)
        self.agreement.follow(list(committed_probs))
        self.probe_again = plan.kind == "probe" and len(path) - 1 >= PROBE_GUESSES
        if plan.kind == "probe" and not self.probe_again:
            self.probe_wait = min(2 * self.probe_wait, PROBE_MOST)
        elif plan.kind == "speculate":
            self.probe_wait = PROBE_EVERY
        drafted = plan.drafts and bool(draft_feeds)       # it paid for a draft forward
        missed = self.behind
        self.plain_run = 0 if drafted else self.plain_run + 1
        self.behind = 0 if drafted else self.behind + len(path)
        levels = draft_feeds[1:]        # the first read what the draft missed (the prompt, at first), the root last
        if draft_feeds and not self.read_prompt:
            draft_feeds, self.read_prompt = draft_feeds[1:], True
        elif draft_feeds and missed:
            # the tokens of the plain steps the draft read first are the price of coming back, which the probe gate
            # weighs (probe_pays); counted in the rate, each plain run held the rate further below plain decoding's
            draft_feeds = [max(1, draft_feeds[0] - missed), *draft_feeds[1:]]
        if drafted:
            self.drafted_rounds += 1
            for fed in levels:
                self.costs = replace(self.costs, level=LEVEL_FADE * self.costs.level
                                     + (1 - LEVEL_FADE) * self.costs.drafting(fed))
            # context lookup joins plain steps as well: what its copies cost to verify, and what they yielded, is no
            # part of the rate drafting makes (counted in, one failed copy took staged off speculation for 10 rounds)
            guessed = sum(1 for n in range(len(tree)) if kinds[tree.stages[n]] != "lookup")
            made = next((i for i, n in enumerate(path) if kinds[tree.stages[n]] == "lookup"), len(path))
            seconds = self.costs.verify(guessed) + sum(self.costs.drafting(n) for n in draft_feeds)
            self.tokens = FADE * self.tokens + (1 - FADE) * made
            self.seconds = FADE * self.seconds + (1 - FADE) * seconds
            expanded = sum(1 for n in range(len(tree)) if any(tree.drawn[c] for c in tree.children[n]))
            self.share = SHARE_FADE * self.share + (1 - SHARE_FADE) * min(1.0, len(draft_feeds) / max(expanded, 1))
        # copies left out are judged too, for free: they stay out until this run shows they would have been right
        guesses = unverified_copies(lookup.tokens, lookup.joined, committed) if lookup else []
        scores = {0: 1.0}
        for node in range(1, len(tree)):
            scores[node] = scores[tree.parents[node]] * tree.draft_probs[node]
            if tree.drawn[node]:
                guesses.append((kinds[tree.stages[node]], tree.depths[node], scores[node], node in accepted))
            if tree.point_mass[node]:
                guesses.append(("lookup", tree.depths[node], 1.0, node in accepted))
        self.calibration.observe(guesses, *drafted_depths(tree, path))
        if drafted:     # judged once the calibration has learnt from the round (a failed guess lowers its chance)
            excess, (weight, total, squares) = self.worth(tree, kinds, scores) - seconds * self.plain_rate, self.excess
            self.excess = (EXCESS_FADE * weight + 1, EXCESS_FADE * total + excess, EXCESS_FADE * squares + excess ** 2)

    def worth(self, tree: Tree, kinds: list[str], scores: dict[int, float]) -> float:
        """A drafted round's tokens at its guesses' calibrated chances: the target's own and each drafted guess's chance
        (lookup's copies left out, as from the rate). Judged by their draws, losing prose rounds took ~20 to tell."""
        return 1.0 + sum(self.calibration.chance(kinds[tree.stages[n]], tree.depths[n], scores[n])
                         for n in range(1, len(tree)) if tree.drawn[n] and kinds[tree.stages[n]] != "lookup")

    def record(self, plan: RoundPlan, kinds_in_use: list[str], lookup: LookupChoice | None = None) -> PlanRecord:
        """The plan's record for the trace; lookup: what context lookup offered the round and what joined."""
        shown = {kind: self.calibration.table(kind) for kind in dict.fromkeys(kinds_in_use)}
        record = PlanRecord(kind=plan.kind, recent_tokens=round(plan.recent_tokens, 3),
                            recent_ms=round(plan.recent_s * 1e3, 2), plain_ms=round(self.costs.verify(1) * 1e3, 2),
                            rates=[round(r, 3) for r in self.calibration.depth_rates(SHOWN_DEPTHS)],
                            calibration=shown, probe_wait=plan.probe_wait)
        if lookup is not None:
            record.lookup_found, record.lookup_joined = lookup.found, lookup.joined
            record.lookup_chance, record.lookup_price = round(lookup.chance, 3), round(lookup.price, 3)
        if plan.probe_held:
            record.probe_held, record.behind = True, self.behind
            record.predicted = round(self.agreement.predicted or 0.0, 3)
        return record


def probe_pays(agreement: Agreement, costs: Costs, behind: int, left: int = HORIZON) -> bool:
    """Whether a probe pays at the recent positions' predicted chance (True before any evidence): speculating at that
    chance for as long as probes would keep being accepted whole would save more than the probe costs (the draft
    reading the `behind` tokens it missed, and verifying the guesses). The spell's length is counted at the chance the
    target's confidence alone gives: how long the text stays predictable is the text's, while the evidence that lowers
    the predicted chance was gathered on earlier text; counted at the predicted chance, a draft that failed on prose was
    never probed again on the code that followed, as each plain step made the catch-up dearer. No more tokens are
    counted than the `left` the generation may still write: a probe near its end reads every token missed for a gain
    it has no room for."""
    predicted = agreement.predicted
    if predicted is None:
        return True
    plain = costs.verify(1)
    gain = max(0.0, 1.0 - 1.0 / (chain_rate(costs, predicted) * plain))
    saved = min(spell(agreement.sure), left) * plain * gain
    cost = costs.catch_up(behind) + (PROBE_GUESSES - 1) * costs.level + costs.verify(PROBE_GUESSES + 1) - plain
    return saved >= cost


def spell(chance: float) -> float:
    """The tokens a probe at this chance leads to, up to HORIZON: a probe accepted whole is followed by another (and,
    once drafted rounds beat plain steps, by speculation); one that fails is followed by plain steps. So what a probe
    opens is a run of probes, each accepted whole with chance**PROBE_GUESSES, each yielding its accepted guesses and
    its bonus token. Counting a flat HORIZON instead opened probes at a chance of 0.6 on prose, where a spell lasted
    two or three tokens: a speculative run with seven probes took 10% longer than plain decoding (AVX2, priced)."""
    whole = chance ** PROBE_GUESSES
    per_probe = 1.0 + sum(chance ** (i + 1) for i in range(PROBE_GUESSES))
    return min(float(HORIZON), per_probe / max(1.0 - whole, 1e-9))


def chain_rate(costs: Costs, chance: float, longest: int = 4) -> float:
    """Tokens per second of the best chain of 1 to `longest` guesses, each passing with `chance`."""
    return max(sum(chance ** i for i in range(g + 1)) / (costs.verify(g + 1) + g * costs.level)
               for g in range(1, longest + 1))


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
