"""A probe waits until the target's own confidence says it pays (specviz/decode/planner.py): after plain steps the draft
must first read every token it missed, so a probe on text the target itself is unsure of costs more than it finds."""
import math

import pytest
from test_round_plan import _chain_tree, cpu_plan, drafting_lost, planner

from specviz.decode import planner as planner_module
from specviz.decode.calibration import TOKEN_KEEP, Agreement
from specviz.decode.costs import TreePlan
from specviz.decode.reasons import reason
from specviz.decode.planner import (FIRST_ROUNDS, HORIZON, PROBE_EVERY, PROBE_GUESSES, Costs, RoundPlanner,
                                    chain_rate, probe_pays, spell)


def pays(p: RoundPlanner) -> bool:
    return probe_pays(p.agreement, p.costs, p.behind)


def slow(p: RoundPlanner) -> RoundPlanner:
    p.tokens, p.seconds, p.read_prompt = 1.0, 0.045, True      # recent drafted rounds slower than plain steps
    p.drafted_rounds = FIRST_ROUNDS
    drafting_lost(p)                                        # ...and every one lost alike
    return p


def run(p: RoundPlanner, rounds: int, confidence: float, probes_pass: bool = False) -> list[str]:
    kinds = []
    for _ in range(rounds):
        plan = p.plan()
        kinds.append(plan.kind)
        if plan.kind == "probe":
            path = list(range(PROBE_GUESSES + 1)) if probes_pass else [0]
            p.observe(plan, _chain_tree(PROBE_GUESSES), path, ["target", "model"], [3, 1],
                      [confidence] * len(path))
        else:
            p.observe(plan, _chain_tree(0), [0], ["target", "model"], [], [confidence])
    return kinds


def test_no_probe_while_the_target_is_unsure_and_one_soon_after_it_is_sure():
    p = slow(planner())
    assert run(p, 40, confidence=0.25) == ["plain"] * 40
    kinds = run(p, PROBE_EVERY + 3, confidence=0.99, probes_pass=True)
    assert "probe" in kinds and kinds[-1] in ("probe", "speculate")


def test_a_gate_always_open_would_probe_on_unsure_text(monkeypatch):
    """The mutant: a planner whose gate is always open probes every few steps on the same text."""
    monkeypatch.setattr(planner_module, "probe_pays", lambda agreement, costs, behind, left: True)
    assert run(slow(planner()), 40, confidence=0.25).count("probe") >= 3


def test_without_the_target_s_probabilities_the_planner_probes_by_count_alone():
    p = slow(planner())
    kinds = []
    for _ in range(PROBE_EVERY + 1):
        plan = p.plan()
        kinds.append(plan.kind)
        p.observe(plan, _chain_tree(0), [0], ["target", "model"], [])
    assert p.agreement.predicted is None
    assert kinds == ["plain"] * PROBE_EVERY + ["probe"]


def test_a_probe_weighs_what_the_draft_must_catch_up():
    """At a confidence where a probe pays after a few plain steps, it does not after many: the draft would read them
    all first."""
    p = slow(planner())
    p.agreement.follow([0.8] * 5)
    chance = p.agreement.predicted
    saved = spell(chance) * p.costs.verify(1) * (1 - 1 / (chain_rate(p.costs, chance) * p.costs.verify(1)))
    p.behind = 2
    cost = p.costs.drafting(2) + p.costs.level + p.costs.verify(3) - p.costs.verify(1)
    assert saved >= cost and pays(p)
    p.behind = 64
    assert not pays(p)


def test_a_probe_counts_only_the_spell_it_is_likely_to_open(monkeypatch):
    """At a chance of 0.7 two guesses pass together half the time, so a probe opens a spell of about 4 tokens, not
    HORIZON: after 8 missed tokens it does not pay. The mutant that counts a flat HORIZON probes there."""
    assert 3.5 < spell(0.7) < 5 and spell(0.99) == HORIZON and spell(0.3) < 2
    p = slow(planner())
    p.agreement.follow([0.7] * 5)
    assert 0.65 < p.agreement.predicted < 0.75
    p.behind = 8
    assert not pays(p)
    monkeypatch.setattr(planner_module, "spell", lambda chance: float(HORIZON))
    assert pays(p)


def test_a_probe_near_the_end_of_the_generation_is_held_for_want_of_room():
    """A probe reads every token the draft missed for a gain counted over the spell it opens, but no longer than the
    tokens left to write. The mutant that counts the whole spell probes with 2 tokens left."""
    p = slow(planner())
    p.agreement.follow([0.9] * 10)
    p.behind = 8
    assert pays(p) and probe_pays(p.agreement, p.costs, p.behind, left=HORIZON)
    assert not probe_pays(p.agreement, p.costs, p.behind, left=2)
    p.plain_run = PROBE_EVERY
    assert p.plan(left=HORIZON).kind == "probe" and p.plan(left=2).probe_held


def test_a_draft_that_reads_long_feeds_through_its_prompt_reader_catches_up_at_the_reader_s_price():
    """After a long plain run the draft reads what it missed in one feed, through its prompt reader where it has one
    (specviz/cpu/prompt_reader.py). Priced at its own forward's price instead, a probe 32 tokens behind is held."""
    reader = (8, 128, 0.100)                    # from 8 tokens on; 128 tokens in 100 ms
    own, read = planner().costs, Costs.of(cpu_plan(), 1, reader=reader)
    assert read.catch_up(4) == own.drafting(4) and read.catch_up(7) == own.drafting(7)
    assert read.catch_up(128) == pytest.approx(0.100) and read.catch_up(32) < 0.6 * own.drafting(32)
    p = slow(planner())
    p.agreement.follow([0.8] * 10)
    assert probe_pays(p.agreement, read, 32) and not probe_pays(p.agreement, own, 32)


def test_a_read_through_the_reader_costs_a_forward_and_its_tokens_at_the_timed_read_s_rate():
    """A read of n tokens through the reader costs the draft's one-token forward and n tokens at the rate of the timed
    read past it. Measured on the Ice Lake held to AVX2 (its stored curves and read: 128 tokens in 506 ms, the reader
    from 16): an 18-token read took 80-100 ms, 32 tokens 135-165, 64 229-305. The line drawn from the draft's own
    16-token forward (143 ms) priced 18 tokens at 149 ms; one through the origin priced them at 71."""
    draft = {1: 0.0156, 2: 0.0211, 4: 0.0397, 8: 0.0743, 12: 0.1018, 16: 0.1435}
    costs = Costs.of(TreePlan({1: 0.065, 2: 0.0895}, draft, "Ice Lake, AVX2"), 1, reader=(16, 128, 0.506))
    assert costs.catch_up(128) == pytest.approx(0.506) and costs.catch_up(12) == costs.drafting(12)
    for fed, (low, high) in {18: (0.075, 0.100), 32: (0.125, 0.165), 64: (0.229, 0.305)}.items():
        assert low <= costs.catch_up(fed) <= high, fed
    line_from_own = costs.drafting(16) + 2 * (0.506 - costs.drafting(16)) / (128 - 16)     # the mutant: 149 ms
    through_origin = 18 * 0.506 / 128                                                      # the mutant: 71 ms
    assert not 0.075 <= line_from_own <= 0.100 and not 0.075 <= through_origin <= 0.100


def test_agreement_learns_a_draft_that_fails_where_the_target_is_sure_and_forgets_it_later():
    a = Agreement()
    prior = a.chance(0.99)
    for _ in range(10):
        a.learn(0.99, False)
    assert a.chance(0.99) < 0.3 < prior
    a.follow([0.5] * math.ceil(math.log(0.02) / math.log(TOKEN_KEEP)))     # their weight fell to 2% since
    assert a.chance(0.99) > 0.8
    assert a.chance(0.1) == pytest.approx(0.1)      # a bin without evidence keeps its prior


def test_the_step_says_why_a_due_probe_was_held():
    p = slow(planner())
    run(p, 12, confidence=0.25)
    plan = p.plan()
    record = p.record(plan, ["model"])
    assert plan.kind == "plain" and plan.probe_held and record.probe_held
    assert record.behind == p.behind >= 12
    assert f"the draft reading the {p.behind} tokens it missed" in reason(record)
    assert f"passes {record.predicted:.0%} of the time" in reason(record)
