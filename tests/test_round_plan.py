"""Rounds planned from a calibration learnt in the run (specviz/decode/calibration.py, specviz/decode/planner.py): the
calibration's arithmetic, the planner's choices, a draft that lies about its confidence, a useless draft, the plan in
the trace, and exactness with planned rounds."""
import copy
import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sampling_exact import chi2, chi2_critical, exact_two_token_distribution
from tiny import TinyTokenizer, tiny_model, tiny_stack

from specviz.backends.choose import open_cache
from specviz.decode.calibration import BIN_MEANS, KEEP, STORED_CAP, Calibration
from specviz.decode.drafters import Drafter, LookupDrafter, ModelDrafter
from specviz.decode.drafters.base import Guess
from specviz.decode.drafters.base import FeedGate
from specviz.decode.engine import Decoder
from specviz.decode.reasons import reason
from specviz.decode.planner import (FIRST_ROUNDS, LEVEL_FADE, PROBE_EVERY, PROBE_GUESSES, PROBE_MOST, Costs,
                                    RoundPlanner)
from specviz.decode.sampling import Sampling
from specviz.stack.plans import keep_learnt
from specviz.stack.strategies import default_tree
from specviz.decode.trace import RunRecord
from specviz.decode.tree import TreeSpec
from specviz.decode.costs import DRAFT_FEED, TreePlan

TOK = TinyTokenizer()
CHAIN = TreeSpec(shape="chain", budget=8, max_depth=8, planned=True)
TREE = TreeSpec(shape="dynamic", budget=12, max_depth=12, level_width=1, lookup=3, planned=True)


def cpu_plan() -> TreePlan:
    """Curves of the shape a 2-core CPU measures (the 1.5B target, its 0.5B draft): a plain token 30 ms, verifying
    2 tokens 31, 8 tokens 54, 16 tokens 103; a draft level about a third of a plain token."""
    target = {1: 0.030, 2: 0.031, 3: 0.036, 4: 0.041, 6: 0.047, 8: 0.054, 12: 0.078, 16: 0.103}
    return TreePlan(target, {1: 0.009, DRAFT_FEED: 0.010, 4: 0.012, 8: 0.016, 16: 0.03}, "a CPU's shape")


def planner(feed=1, calibration=None) -> RoundPlanner:
    return RoundPlanner(Costs.of(cpu_plan(), feed), calibration or Calibration())


def missed(calibration, rounds, score=0.95, depths=(1, 2)):
    for _ in range(rounds):
        calibration.observe([("model", d, score, False) for d in depths], reached=1, accepted=0)


def drafting_lost(p: RoundPlanner) -> None:
    """Past its first rounds, a run whose drafted rounds were each worth 0.3 tokens less than plain steps would have
    made in their seconds, every one alike: a loss no spread explains, so plain steps (planner.drafting_pays); and its
    calibration has learnt why: its guesses failed."""
    p.drafted_rounds = FIRST_ROUNDS
    p.excess = (10.0, -3.0, 0.9)
    for score in (0.9, 0.81):              # _chain_tree's guesses at depths 1 and 2
        missed(p.calibration, 10, score)


def test_the_calibration_starts_from_the_drafts_word_and_learns_what_its_guesses_yield():
    calibration = Calibration()
    assert calibration.chance("model", 1, 0.95) == BIN_MEANS[5] and calibration.chance("model", 4, 0.1) == BIN_MEANS[0]
    missed(calibration, 6)
    assert calibration.chance("model", 1, 0.95) < 0.3           # what it said was worth little
    assert calibration.chance("model", 6, 0.95) < 0.3           # deeper buckets start from what shallower ones learnt
    assert calibration.chance("model", 1, 0.1) == BIN_MEANS[0]  # other bins and kinds keep their prior
    assert calibration.chance("lookup", 1, 1.0) == Calibration().chance("lookup", 1, 1.0)
    assert calibration.depth_rates(2)[0] < 0.3


def test_old_evidence_fades_so_the_calibration_follows_the_text():
    calibration = Calibration()
    missed(calibration, 20)
    low = calibration.chance("model", 1, 0.95)
    for _ in range(12):
        calibration.observe([("model", 1, 0.95, True)], reached=1, accepted=1)
    assert low < 0.2 and calibration.chance("model", 1, 0.95) > 0.6
    assert 0 < KEEP < 1


def test_a_run_stores_its_calibration_as_the_next_runs_prior_weighted_by_the_guesses_behind_it():
    first = Calibration()
    missed(first, 10, depths=(1,))
    stored = first.to_store()
    assert stored["model"][0][5] == [0.0, 10.0]                     # mean, guesses
    json.dumps(stored)
    second = Calibration(stored)
    assert second.chance("model", 1, 0.95) < 0.25                   # starts where the first ended
    missed(second, 10, depths=(1,))
    assert second.to_store()["model"][0][5] == [0.0, 20.0]
    capped = Calibration({"model": [[[0.5, 10 * STORED_CAP]] * 7] * 4}).to_store()
    assert capped["model"][0][0][1] == STORED_CAP


def test_the_plan_guesses_where_guesses_pay_takes_plain_steps_where_none_does_and_probes_every_few():
    good = planner()
    for _ in range(5):
        good.calibration.observe([("model", d, 0.9, True) for d in (1, 2, 3)], reached=4, accepted=3)
    good.tokens, good.seconds = 4.0, 0.080          # the last drafted rounds made 4 tokens in 80 ms
    plan = good.plan()
    assert plan.kind == "speculate" and plan.rate == pytest.approx(50.0)
    assert plan.need(0) == pytest.approx(50 * 0.001) and plan.need(2) == pytest.approx(50 * 0.005)
    assert plan.expands(1, 0.95, 1, free=True, last=0.95) and not plan.expands(1, 0.05, 1, free=False, last=0.05)
    bad = planner()
    bad.tokens, bad.seconds = 1.1, 0.045            # 1.1 tokens in 45 ms: slower than a plain step's 30 ms a token...
    bad.drafted_rounds = FIRST_ROUNDS               # ...over the rounds a run drafts before its rate may say plain...
    drafting_lost(bad)                              # ...each of them alike
    waits = [PROBE_EVERY, 2 * PROBE_EVERY, PROBE_MOST, PROBE_MOST]     # each failed probe doubles the wait
    assert 2 * PROBE_EVERY < PROBE_MOST
    kinds = []
    for _ in range(sum(waits) + len(waits)):
        plan = bad.plan()
        kinds.append(plan.kind)
        tree = _chain_tree(PROBE_GUESSES if plan.kind == "probe" else 0)
        bad.observe(plan, tree, [0], ["target", "model"], [2] if plan.kind == "probe" else [])
    assert kinds == [kind for wait in waits for kind in ["plain"] * wait + ["probe"]]
    assert f"probes after {PROBE_MOST} plain steps" in reason(bad.record(bad.plan(), ["model"]))


def test_a_round_that_drafts_again_brings_the_probes_back_to_their_first_wait():
    p = planner()
    p.tokens, p.seconds, p.read_prompt = 1.1, 0.045, True      # slower than plain steps: plain, then probes
    p.drafted_rounds = FIRST_ROUNDS
    drafting_lost(p)
    for _ in range(PROBE_EVERY + 1 + 2 * PROBE_EVERY):
        plan = p.plan()
        p.observe(plan, _chain_tree(PROBE_GUESSES if plan.kind == "probe" else 0), [0], ["target", "model"],
                  [2] if plan.kind == "probe" else [])
    assert p.probe_wait == 2 * PROBE_EVERY
    p.tokens, p.seconds = 4.0, 0.080                            # the text turned predictable
    plan = p.plan()
    assert plan.kind == "speculate"
    p.observe(plan, _chain_tree(3), [0, 1, 2, 3], ["target", "model"], [1, 1, 1])
    assert p.probe_wait == PROBE_EVERY


def test_a_probe_accepted_whole_is_followed_by_another():
    p = planner()
    p.tokens, p.seconds, p.plain_run, p.read_prompt = 1.0, 0.05, PROBE_EVERY, True
    drafting_lost(p)
    p.excess = (10.0, -10.0, 10.0)     # each drafted round lately lost a whole token: one probe does not outweigh it
    plan = p.plan()
    assert plan.kind == "probe"
    p.observe(plan, _chain_tree(PROBE_GUESSES), list(range(PROBE_GUESSES + 1)), ["target", "model"], [1, 3])
    plan = p.plan()
    assert p.tokens / p.seconds < 1 / 0.030 and plan.kind == "probe"     # not yet worth it, but probed again
    p.observe(plan, _chain_tree(PROBE_GUESSES), [0], ["target", "model"], [1, 3])
    assert p.plan().kind == "plain"


def test_a_run_drafts_its_first_rounds_whatever_one_of_them_made_and_its_rate_decides_after():
    """One round's yield is a geometric draw: the first rounds draft even where one of them failed whole, and once
    FIRST_ROUNDS have drafted, a rate below plain decoding's turns the run to plain steps as soon as what the rounds
    were worth is below it too: each round is worth its guesses' calibrated chances, which start at the draft's word
    (0.9 here) and fall with each failure."""
    p = planner()
    kinds, reasons = [], []
    for _ in range(FIRST_ROUNDS + 3):
        plan = p.plan()
        kinds.append(plan.kind)
        reasons.append(reason(p.record(plan, ["model"])))
        p.observe(plan, _chain_tree(4), [0], ["target", "model"], [16, 1, 1, 1] if len(kinds) == 1 else [1, 1, 1, 1])
    assert p.tokens / p.seconds < p.plain_rate                  # every round failed at its first guess
    assert kinds[:2] == ["speculate", "speculate"]            # one failed round is not evidence enough...
    drafting = kinds.count("speculate")                       # ...a few more, once the calibration has learnt, are
    assert FIRST_ROUNDS <= drafting <= FIRST_ROUNDS + 2 and kinds == ["speculate"] * drafting + ["plain"] * (
        len(kinds) - drafting)
    assert f"a run drafts its first {FIRST_ROUNDS} rounds" in reasons[1] and "first" not in reasons[0]


def test_a_failed_round_does_not_turn_a_run_to_plain_steps_while_its_rounds_may_still_pay():
    """The recent rate, faded over a few rounds, falls below plain decoding's after a round or two whose guess failed.
    What decides is the excess of about the last ten rounds (the tokens each was worth beyond what plain steps would
    have made in its seconds) against its spread: one guess passing 3 times in 10, which the draft rates at 0.9, loses
    a little on its draws, by less than the calibration can yet tell from its prior; a guess that never passes loses
    alike every round, and plain steps follow once its calibrated chance has fallen from the draft's word (about ten
    rounds: a draft that says 0.9 is believed a while)."""
    def drafted(made: list[int]) -> tuple[RoundPlanner, list[str]]:
        p, kinds = planner(), []
        for tokens in made:             # each round: one guess, accepted or not
            plan = p.plan()
            kinds.append(plan.kind)
            p.observe(plan, _chain_tree(1), list(range(tokens)), ["target", "model"], [1])
        return p, kinds
    p, kinds = drafted([1, 2, 1, 1, 2, 1, 1, 2, 1, 1])
    assert p.tokens / p.seconds < p.plain_rate and kinds == ["speculate"] * 10
    assert p.plan().kind == "speculate" and "beyond plain steps" in reason(p.record(p.plan(), ["model"]))
    kinds = drafted([1] * 13)[1]
    drafting = kinds.count("speculate")
    assert FIRST_ROUNDS <= drafting <= 10
    assert kinds == ["speculate"] * drafting + ["plain"] * (13 - drafting)


def test_a_small_but_steady_loss_turns_a_run_to_plain_steps_within_about_a_dozen_rounds():
    """A guess passing one time in five, which the draft rates about as sure as that, where a round of one guess costs
    about 1.37 plain steps: each round loses about a sixth of a token, less than one round's spread but steady. Within
    about a dozen rounds the excess is below nothing by more than DOUBT standard errors (at two, such a run drafted to
    its end)."""
    p, kinds = planner(), []
    for tokens in [1, 1, 2, 1, 1] * 6:
        plan = p.plan()
        kinds.append(plan.kind)
        if plan.kind == "plain":
            p.observe(plan, _chain_tree(0), [0], ["target", "model"], [])
        else:
            p.observe(plan, _chain_tree(1, 0.25), list(range(tokens)), ["target", "model"], [1])
    assert "plain" in kinds[:15] and kinds.count("speculate") <= 15, "".join(kind[0] for kind in kinds)
    weight, total, _ = p.excess
    assert total / weight < 0


# an Ice Lake held to AVX2 (prepare): a plain token 60 ms, two tokens 81 ms, a draft level 14 ms, so a round of one
# guess costs 1.58 plain steps and pays where its guess passes 58% of the time
ICE_LAKE_AVX2 = TreePlan({1: 0.060, 2: 0.081, 4: 0.115, 8: 0.194}, {1: 0.014, DRAFT_FEED: 0.019, 16: 0.08})


def rounds_drafted(chance: float, seed: int, rounds: int = 40, by_draws: bool = False) -> int:
    """Of `rounds` planned rounds, how many drafted, where each guess passes with `chance` (a seeded draw) and the draft
    rates it as likely as that. by_draws: the mutant that judges each round by the tokens it happened to make."""
    draw, p = random.Random(seed), RoundPlanner(Costs.of(ICE_LAKE_AVX2, 1), Calibration())
    made, drafted = [1], 0
    if by_draws:
        p.worth = lambda tree, kinds, scores: made[0]
    for _ in range(rounds):
        plan = p.plan()
        if plan.kind == "plain":
            p.observe(plan, _chain_tree(0), [0], ["target", "model"], [])
            continue
        guesses = PROBE_GUESSES if plan.kind == "probe" else 1
        made[0] = 1
        while made[0] <= guesses and draw.random() < chance:
            made[0] += 1
        p.observe(plan, _chain_tree(guesses, chance), list(range(made[0])), ["target", "model"], [1] * guesses)
        drafted += 1
    return drafted


def test_rounds_are_judged_by_their_guesses_calibrated_chances_so_a_steady_loss_turns_to_plain_steps_sooner():
    """A round's yield is a geometric draw: on held-out prose where one guess passed about half the time, rounds judged
    by their draws drafted for about 20 rounds before plain steps (2-core Ice Lake held to AVX2, priced), as one round's
    spread hides a loss of a tenth of a token. Judged by what their guesses were worth at their calibrated chances, a
    run of 40 rounds drafts fewer of them where each loses (40%: a fifth of a token a round; 50%: a tenth), and as many
    where they pay (75%). Mutant: judged by its draws, a run drafts 18 and 25 rounds on average where they lose."""
    def mean(chance, **kw):
        return sum(rounds_drafted(chance, seed, **kw) for seed in range(20)) / 20
    assert mean(0.4) <= 15 and mean(0.5) <= 22
    assert mean(0.75) >= 39
    assert mean(0.4, by_draws=True) > 15 and mean(0.5, by_draws=True) > 22      # the mutant fails the first line


def test_what_a_probe_reads_to_catch_up_is_no_part_of_the_rate_drafting_makes():
    """After plain steps the draft must first read the tokens it missed: a cost of coming back (the probe gate prices
    it), not of what drafting makes a round, or each plain run would hold the rate further below plain decoding's."""
    def probed(read):
        p = planner()
        p.tokens, p.seconds, p.read_prompt, p.drafted_rounds = 1.1, 0.045, True, FIRST_ROUNDS
        drafting_lost(p)
        p.plain_run, p.behind = PROBE_EVERY, read - 1       # the tokens of the plain steps that the draft missed
        plan = p.plan()
        assert plan.kind == "probe"
        p.observe(plan, _chain_tree(PROBE_GUESSES), list(range(PROBE_GUESSES + 1)), ["target", "model"], [read, 1])
        return p.tokens, p.seconds
    caught_up, behind = probed(1), probed(9)
    assert behind == pytest.approx(caught_up)


def test_the_engine_tells_each_plan_how_many_tokens_the_generation_may_still_write():
    """The probe gate counts a probe's gain over no more tokens than are left (planner.probe_pays): the engine must say
    how many, before each round."""
    class Told(RoundPlanner):
        def plan(self, left=None):
            lefts.append(left)
            return super().plan(left)
    lefts = []
    run = Decoder(open_cache(tiny_model("llama"), "target"), TOK, [3, 1, 4, 1, 5],
                  drafter=ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache), strategy="speculative",
                  tree=TREE, planner=Told(Costs.of(cpu_plan(), 1), Calibration()), max_new_tokens=9).generate()
    written = [0] + [sum(len(s.committed_tokens) for s in run.steps[:i + 1]) for i in range(len(run.steps) - 1)]
    assert lefts == [9 - n for n in written] and lefts[0] == 9


def test_a_level_costs_what_the_run_fed_it_from_the_first_round_on():
    """The planner learns a draft level's cost from every forward after a round's first (which reads what the draft
    missed: at first the prompt), in the first round too."""
    p = planner(feed=DRAFT_FEED)
    prior, plan = p.costs.level, p.plan()
    assert plan.kind == "speculate"
    p.observe(plan, _chain_tree(2), [0, 1, 2], ["target", "model"], [128, 3])       # the prompt's read, then a level
    assert p.costs.level == pytest.approx(LEVEL_FADE * prior + (1 - LEVEL_FADE) * p.costs.drafting(3))
    p.observe(p.plan(), _chain_tree(2), [0, 1, 2], ["target", "model"], [1, 1])    # the root, then a level of one
    assert p.costs.level < p.costs.drafting(3)


def _chain_tree(length, prob=0.9):
    from specviz.decode.tree import Tree
    tree = Tree.with_root(0)
    for depth in range(length):
        tree.add(depth, depth + 1, 1, prob)
    return tree


class Overconfident(ModelDrafter):
    """A mutant that inflates its probabilities: the same first choices, each claimed near certain."""

    def expand(self, tree, nodes, context):
        return [None if row is None else _sure(row) for row in super().expand(tree, nodes, context)]


def _sure(row):
    row = row.clone()
    row[row.argmax()] += 20.0
    return row


class AlwaysDrafts(RoundPlanner):
    """A planner whose rounds always draft at one rate (3 tokens in 60 ms): what shrinks its trees is the calibration
    alone."""

    def observe(self, *args):
        super().observe(*args)
        self.tokens, self.seconds = 3.0, 0.060


def overconfident_run(learns: bool = True, planner_kind=AlwaysDrafts):
    calibration = Calibration()
    if not learns:
        calibration.observe = lambda *args: None
    plan = planner_kind(Costs.of(cpu_plan(), DRAFT_FEED), calibration)
    plan.tokens, plan.seconds = 3.0, 0.060
    drafter = Overconfident(tiny_model("llama", noise=0.3), backend=open_cache)
    return Decoder(open_cache(tiny_model("llama"), "target"), TOK, [3, 1, 4, 1, 5], drafter=drafter, strategy="staged",
                   tree=TREE, planner=plan, max_new_tokens=60).generate()


def test_an_overconfident_draft_is_caught_within_a_few_rounds_and_its_trees_shrink():
    run = overconfident_run()
    sizes = [len(s.nodes) - 1 for s in run.steps]
    own = [sum(n.stage == 1 for n in s.nodes) for s in run.steps]          # the draft's own guesses (not lookup's)
    claimed = [n.draft_prob for s in run.steps for n in s.nodes[1:] if n.stage == 1]
    assert sum(claimed) / len(claimed) > 0.95                               # it claims near certainty...
    taken = sum(len(s.accepted_path) - 1 for s in run.steps) / sum(sizes)
    assert taken < 0.6                                                      # ...and is right far less often
    assert own[0] >= 8 and max(own[3:]) <= own[0] / 2, own                 # caught within three rounds
    assert run.steps[-1].plan.calibration["model"][0][-1] < 0.8            # what its 0.97+ is worth, learnt
    plain = Decoder(open_cache(tiny_model("llama"), "target"), TOK, [3, 1, 4, 1, 5], max_new_tokens=60).generate()
    assert run.tokens == plain.tokens
    unlearnt = [sum(n.stage == 1 for n in s.nodes) for s in overconfident_run(learns=False).steps]
    assert sum(size >= 8 for size in unlearnt) >= len(unlearnt) / 2       # a calibration that never learns: no catch
    # the planner itself: its trees shrink as well, and once they do its rounds stop losing, so it drafts on (a rate
    # faded over three rounds took it to plain steps for good after its first rounds)
    planned = overconfident_run(planner_kind=RoundPlanner)
    sizes = [len(s.nodes) - 1 for s in planned.steps]
    assert sizes[0] >= 8 and max(sizes[1:4]) <= sizes[0] / 2, sizes
    assert planned.stats["rounds_by_plan"]["plain"] == 0


class Switching(Drafter):
    """A draft that knows nothing (an unrelated model) until `at` tokens were written, then everything (the target
    itself): its text turns predictable."""
    kind = "model"

    def __init__(self, useless, oracle, at):
        super().__init__()
        self.useless, self.oracle, self.at, self.name = useless, oracle, at, "switching"
        self.written, self.start_len = 0, 0

    def start(self, tokens, prefilled=None, **placed):
        super().start(tokens, **placed)
        self.start_len = len(tokens) + 1
        self.useless.start(tokens, **placed)
        self.oracle.start(tokens, **placed)

    def active(self):
        return self.oracle if self.written >= self.at else self.useless

    def expand(self, tree, nodes, context):
        self.written = len(context) - self.start_len
        return self.active().expand(tree, nodes, context)

    def seen(self, path):
        return self.active().seen(path)

    def commit(self, tree, path, context):
        self.useless.commit(tree, path, context)
        self.oracle.commit(tree, path, context)
        self.written = len(context) + len(path) - self.start_len

    def guess(self, sequence, n):
        return Guess([])

    def kv_models(self):
        return [self.active().kv, (self.useless if self.active() is self.oracle else self.oracle).kv]


USELESS_FOR = 24   # tokens the Switching draft is useless for


def useless_then_oracle(max_new_tokens: int):
    """The target, and its planned speculative run whose draft is useless for USELESS_FOR tokens, then the target.
    The target is made sure of its tokens, as a real model is on text that turned predictable: its own confidence is
    what tells the planner that a probe is worth its cost."""
    target = copy.deepcopy(tiny_model("llama"))     # tiny_model's are shared: sharpen a copy
    with torch.no_grad():
        target.lm_head.weight.mul_(40.0)
    drafter = Switching(ModelDrafter(tiny_model("llama", seed=7), name="useless", backend=open_cache),
                        ModelDrafter(target, name="oracle", backend=open_cache),
                        at=USELESS_FOR)
    return target, Decoder(open_cache(target, "target"), TOK, [3, 1, 4, 1, 5], drafter=drafter, strategy="speculative",
                           tree=CHAIN, planner=planner(), max_new_tokens=max_new_tokens).generate()


def test_a_useless_draft_falls_back_to_plain_steps_and_speculation_comes_back_when_the_text_turns_predictable():
    target, run = useless_then_oracle(USELESS_FOR + 66)
    kinds = [s.plan.kind for s in run.steps]
    before = [s for s in run.steps if s.position < USELESS_FOR]
    after = [s for s in run.steps if s.position >= USELESS_FOR + 16]
    assert [s.plan.kind for s in before].count("plain") >= len(before) // 2, kinds     # fell back
    assert "probe" in kinds[: len(before) + 1]
    assert all(s.plan.kind == "speculate" for s in after[1:]), kinds                    # came back
    assert sum(len(s.committed_tokens) for s in after) / len(after) > 3
    assert run.stats["rounds_by_plan"]["plain"] >= PROBE_EVERY
    plain = Decoder(open_cache(target, "target"), TOK, [3, 1, 4, 1, 5], max_new_tokens=USELESS_FOR + 66).generate()
    assert run.tokens == plain.tokens


def test_the_trace_says_why_each_round_had_its_shape_and_round_trips_through_json():
    stack = tiny_stack(("draft", "lookup"), plan=cpu_plan)
    run = stack.decoder([3, 1, 4, 1, 5, 9, 2, 6], "staged", max_new_tokens=16).generate()
    step = run.steps[0]
    assert step.plan is not None and reason(step.plan) and step.plan.kind in ("speculate", "plain", "probe")
    assert set(step.plan.calibration) == {"model", "ngram", "lookup"} & set(step.plan.calibration)
    assert all(n.calibrated is not None for n in step.nodes[1:])
    back = RunRecord.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back.steps[0].plan == step.plan and back.steps[0].nodes == step.nodes
    fixed = stack.decoder([3, 1, 4, 1, 5, 9, 2, 6], "staged", default_tree("staged", min_score=0.3),
                          max_new_tokens=4).generate()
    assert all(s.plan is None for s in fixed.steps)                      # settings given by hand: not planned


def test_a_stacks_calibration_is_stored_for_the_next_run_only_where_its_curves_are_stored(preparing, monkeypatch):
    from specviz.profile import store as machine_profile, tree_plans as tree_plan_store
    file = preparing.file.path()
    pinned = tiny_stack(("draft", "lookup"), plan=cpu_plan, profile=preparing)
    pinned_decoder = pinned.decoder([3, 1, 4, 1, 5], "speculative", max_new_tokens=8)
    pinned_decoder.generate()
    keep_learnt(pinned_decoder, preparing)
    assert not file.exists()                                            # a stack given curves by hand stores nothing
    monkeypatch.setattr(tree_plan_store, "measure", lambda *a: cpu_plan().to_dict())
    stack = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)
    assert stack.plans.tree_plan() is not None
    before = file.read_text()
    decoder = stack.decoder([3, 1, 4, 1, 5], "speculative", max_new_tokens=8)
    decoder.generate()
    assert file.read_text() == before                                   # a generation itself writes no file
    keep_learnt(decoder, preparing)
    keys = [k for k in json.loads(file.read_text())["machines"][machine_profile.machine()] if "calibration" in k]
    assert keys == [stack.plans.name().replace("tree plan", "calibration of speculative, greedy")]
    learnt = preparing.stored(keys[0])
    assert sum(cell[1] for row in learnt["model"] for cell in row) > 0
    assert stack.plans.for_decoder("speculative", CHAIN, Sampling())[1].calibration.stored == learnt


@settings(max_examples=25, deadline=None)
@given(prompt=st.lists(st.integers(0, 63), min_size=1, max_size=10),
       strategy=st.sampled_from(["speculative", "staged"]),
       one=st.floats(0.005, 0.05), slope=st.floats(0.0, 1.0), level=st.floats(0.0, 0.5), misses=st.integers(0, 12),
       n=st.integers(1, 30))
def test_planned_rounds_write_baselines_tokens(prompt, strategy, one, slope, level, misses, n):
    """Whatever the curves and whatever the rounds taught the calibration: plain steps, probes and trees alike."""
    target = tiny_model("llama")
    curve = {k: one * (1 + slope * (k - 1)) for k in (1, 2, 3, 4, 6, 8, 12, 16)}
    calibration = Calibration()
    missed(calibration, misses)
    lower = LookupDrafter(64) if strategy == "staged" else None
    gate = FeedGate(tuple(level * one * (1 + slope * (k - 1)) for k in range(17))) if lower is not None else None
    drafter = ModelDrafter(tiny_model("llama", noise=0.3), lower=lower, backend=open_cache, gate=gate)
    spec = TREE if strategy == "staged" else CHAIN
    plan = RoundPlanner(Costs.of(TreePlan(curve, {1: level * one, DRAFT_FEED: level * one}), 1), calibration)
    run = Decoder(open_cache(target, "target"), TOK, prompt, drafter=drafter, strategy=strategy, tree=spec,
                  planner=plan, max_new_tokens=n).generate()
    assert run.tokens == Decoder(open_cache(target, "target"), TOK, prompt, max_new_tokens=n).generate().tokens


@pytest.mark.parametrize("opening", ["speculate", "probe"])
def test_planned_rounds_sample_two_tokens_exactly_as_the_target(opening):
    """The second round's shape depends on what the first accepted (the rate and the calibration learn from it):
    decided before the round is drafted, it leaves the distribution exact. `probe`: the first round probes after plain
    steps, the second is a plain step or a probe."""
    vocab = 5
    target = tiny_model("llama", vocab=vocab, hidden=16)
    draft = tiny_model("llama", vocab=vocab, hidden=16, noise=0.8)
    prompt = [1, 3, 2, 4, 1, 3]
    sampling = Sampling(temperature=1.0)
    expected = exact_two_token_distribution(target, prompt, sampling)
    counts = torch.zeros(vocab * vocab)
    spec = TreeSpec(shape="dynamic", budget=6, max_depth=3, max_branch=3, lookup=2, lookup_ngram=1, planned=True)
    kinds = set()
    for seed in range(2000):
        plan = planner(DRAFT_FEED)
        if opening == "probe":
            plan.tokens, plan.seconds, plan.plain_run, plan.drafted_rounds = 1.0, 0.05, PROBE_EVERY, FIRST_ROUNDS
            drafting_lost(plan)
        run = Decoder(open_cache(target, "target"), TOK, prompt, drafter=ModelDrafter(draft, backend=open_cache),
                      tree=spec, strategy="staged", sampling=Sampling(1.0, seed=seed), planner=plan,
                      max_new_tokens=2).generate()
        counts[run.tokens[0] * vocab + run.tokens[1]] += 1
        kinds.update((s.step, s.plan.kind) for s in run.steps)
    stat, df = chi2(counts, expected)
    assert stat < chi2_critical(df), (stat, df)
    assert (0, opening) in kinds and any(step == 1 for step, _ in kinds)


def test_the_app_words_say_why_a_round_had_its_shape_and_that_a_lane_fell_back_to_plain_steps():
    from specviz.app.captions import step_caption
    from specviz.app.words import plan_note
    from specviz.decode.metrics import summarise
    target, run = useless_then_oracle(USELESS_FOR + 16)
    plain = next(s for s in run.steps if s.plan.kind == "plain")
    assert "**Plan:**" in step_caption(plain) and "plain step" in step_caption(plain)
    guessed = next(s for s in run.steps if s.plan.kind == "speculate" and len(s.nodes) > 1)
    assert "this round drafts" in step_caption(guessed)
    note = plan_note("speculative", summarise(run.steps))
    assert note.startswith("speculative took") and "plain steps" in note
    assert plan_note("staged", {"rounds_by_plan": {"speculate": 9, "plain": 0, "probe": 0}}) == ""
    copied = plan_note("staged", {"rounds_by_plan": {"speculate": 1, "plain": 5, "probe": 1},
                                  "lookup_joined_by_plan": {"speculate": 0, "plain": 2, "probe": 0}})
    assert "joined 2 of those plain steps" in copied and "joined" not in note
