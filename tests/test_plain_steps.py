"""A plain step is plain: context lookup's copied tokens join a planned round only where their calibrated chance pays
for what they add to verification, priced by the machine's cost curve, and a chance learnt elsewhere (code, where
copies are often right) gives way to what this run's copies yield (prose, where they are not)."""
import pytest
import torch
from test_round_plan import ICE_LAKE_AVX2, drafting_lost

from specviz.decode import calibration, tree_builder
from specviz.decode.calibration import Calibration, unverified_copies
from specviz.decode.drafters import LookupDrafter
from specviz.decode import planner as planner_module
from specviz.decode.planner import FIRST_ROUNDS, Costs, LookupChoice, RoundPlanner
from specviz.decode.reasons import lookup_reason, reason
from specviz.decode.sampling import Sampling
from specviz.decode.trace import Phase, PlanRecord
from specviz.decode.tree import TreeSpec
from specviz.decode.tree_builder import build_tree
from specviz.decode.costs import DRAFT_FEED, TreePlan

# An AVX2 2-core machine's curves for the 1.5B (prepare, a Zen 3): a plain token 80 ms, each more token fed ~10 ms,
# so a copied token must be right at least 1 time in 8 to pay for verifying it in a plain step
AVX2 = TreePlan({1: 0.080, 2: 0.090, 4: 0.110, 8: 0.168, 16: 0.255}, {1: 0.021, DRAFT_FEED: 0.024, 16: 0.08})
PRICE = (0.090 - 0.080) / 0.080
# ICE_LAKE_AVX2 (test_round_plan): a plain token 60 ms, a copied token 21 ms more: right a third of the time to pay
CODE_PRIOR = {"lookup": [[[0.9, 200.0]] * 7, [[0.8, 200.0]] * 7, [[0.7, 200.0]] * 7, [[0.6, 200.0]] * 7]}
SPEC = TreeSpec(shape="dynamic", budget=8, max_depth=8, level_width=1, lookup=3, planned=True)
# a context whose last two tokens came before: lookup copies what followed them (6, 7, 8)
CONTEXT = [4, 9, 5, 6, 7, 8, 1, 2, 3, 9, 5]


def plain_planner(calibration: Calibration, curves: TreePlan = AVX2) -> RoundPlanner:
    planner = RoundPlanner(Costs.of(curves, DRAFT_FEED), calibration)
    planner.tokens, planner.seconds, planner.read_prompt = 1.0, 0.2, True     # drafting has been slower than plain
    planner.drafted_rounds = FIRST_ROUNDS
    drafting_lost(planner)                                                   # ...every drafted round alike
    planner.probe_wait = 10 ** 6                                               # no probe in these rounds
    return planner


def plain_round(planner: RoundPlanner, lookup_right: bool):
    """One planned round with context lookup's copy, verified: the copy's first token accepted or not. The target's
    own next tokens are the copy's (6, 7) where it is right, else another."""
    plan = planner.plan()
    assert plan.kind == "plain"
    drafted = build_tree(CONTEXT[-1], CONTEXT, LookupDrafter(16), SPEC, Sampling(), torch.Generator(), plan=plan)
    tree = drafted.tree
    path = [0, 1] if lookup_right and len(tree) > 1 else [0]
    committed = ([6, 7] if len(path) > 1 else [6]) if lookup_right else [99]
    planner.observe(plan, tree, path, ["target", "lookup", "lookup"], [], committed=committed, lookup=drafted.lookup)
    return tree, planner.record(plan, ["lookup"], drafted.lookup)


def copied(tree) -> int:
    return sum(tree.point_mass[1:])


def test_a_copied_token_that_does_not_pay_is_left_out_of_a_plain_step_and_one_that_pays_joins():
    doubtful = Calibration({"lookup": [[[0.05, 200.0]] * 7] * 4})          # copies right 5% of the time: under 12.5%
    tree, record = plain_round(plain_planner(doubtful), lookup_right=False)
    assert len(tree) == 1 and record.lookup_found == 3 and record.lookup_joined == 0
    assert record.lookup_chance < record.lookup_price == pytest.approx(PRICE, rel=1e-6)
    assert "none joined" in reason(record)
    sure = Calibration({"lookup": [[[0.95, 200.0]] * 7] * 4})
    sure.observe([("lookup", 1, 1.0, True)], reached=0, accepted=0)          # this run's copies were right
    tree, record = plain_round(plain_planner(sure), lookup_right=True)
    assert copied(tree) == 3 and record.lookup_joined == 3 and "all joined" in reason(record)


def test_a_plain_step_takes_one_copied_token_until_this_runs_copies_were_right():
    """A plain step follows rounds that lost: where the prior (learnt on code here) vouched for a copy's whole chain,
    prose's runs paid for verifying three copied tokens about once a run, 1.5% of it (AVX2, priced). The first token
    finds out at a third of that price; the chain follows once a copy was right. Mutant: every copied token priced by
    its chance alone joins 3 at once, and fails."""
    planner = plain_planner(Calibration(CODE_PRIOR))
    tree, record = plain_round(planner, lookup_right=True)
    assert copied(tree) == 1 and record.lookup_found == 3
    assert copied(plain_round(planner, lookup_right=True)[0]) == 3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Calibration, "any_right", lambda self, kind: True)
        assert copied(plain_round(plain_planner(Calibration(CODE_PRIOR)), lookup_right=True)[0]) == 3


def test_a_chance_learnt_on_code_gives_way_within_a_few_plain_steps_where_copies_fail():
    """The mutants fail here: a plan that always lets the copy join, and a prior that keeps its weight while the run's
    evidence fades (it held lookup's chance at 15%, over the price, for as long as the run went on)."""
    def joined_per_round(rounds=30):
        planner = plain_planner(Calibration(CODE_PRIOR))
        return [copied(plain_round(planner, lookup_right=False)[0]) for _ in range(rounds)]

    joined = joined_per_round()
    assert joined[0] >= 1 and sum(joined[12:]) == 0, joined
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tree_builder, "_lookup_worth",
                      lambda tree, follow, plan: LookupChoice(tuple(follow), len(follow), 1.0, 0.0))
        assert sum(joined_per_round()[12:]) > 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "PRIOR_FLOOR", calibration.PRIOR_WEIGHT)
        assert sum(joined_per_round()[12:]) > 0


def test_copies_left_out_are_judged_by_the_tokens_committed_and_join_once_they_would_have_been_right():
    """A copy left out of every round could never show that it would have been right: each copied token a round found
    but did not verify is judged by the tokens the round committed, so copies start unlikely (on held-out code three
    copied tokens that joined ahead of any evidence cost staged 1.3% of 64 greedy tokens, both CPU classes, priced) and
    join as soon as the text repeats itself. Mutant: no such evidence, and the copies stay out for good."""
    def joined_per_round(rounds=6):
        planner = plain_planner(Calibration(), ICE_LAKE_AVX2)
        return [copied(plain_round(planner, lookup_right=True)[0]) for _ in range(rounds)]

    assert unverified_copies((6, 7, 8), 1, [6, 7]) == [("lookup", 2, 1.0, True)]
    assert unverified_copies((6, 7, 8), 0, [5]) == [("lookup", 1, 1.0, False)]
    joined = joined_per_round()
    assert joined[0] == 0 and joined[-1] >= 1, joined
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner_module, "unverified_copies", lambda copied, joined, committed: [])
        assert sum(joined_per_round()) == 0


def test_copies_that_turn_right_join_again_in_the_rounds_that_draft():
    """A run's evidence moves the chance both ways: copies right in drafted rounds raise it over a plain step's price
    again."""
    calibration = Calibration(CODE_PRIOR)
    planner = plain_planner(calibration)
    for _ in range(12):
        plain_round(planner, lookup_right=False)
    assert calibration.chance("lookup", 1, 1.0) < PRICE
    for _ in range(6):
        calibration.observe([("lookup", 1, 1.0, True)], reached=0, accepted=0)
    assert calibration.chance("lookup", 1, 1.0) > PRICE
    assert copied(plain_round(planner, lookup_right=True)[0]) >= 1


def test_the_reason_says_whether_lookup_joined_and_why():
    base = dict(kind="plain", recent_tokens=1.0, recent_ms=100.0, plain_ms=80.0, rates=[], calibration={})
    assert lookup_reason(PlanRecord(**base)) == ""
    some = PlanRecord(**base, lookup_found=3, lookup_joined=1, lookup_chance=0.1, lookup_price=0.125)
    assert lookup_reason(some) == ("Context lookup found 3 tokens to copy from the text; 1 joined, and the next had a "
                                   "calibrated chance of 10% against the 12% its verifying costs.")


def test_building_a_round_leaves_its_plan_as_it_was():
    """The round passes values: what lookup offered and the chances given come back with the tree, not in the plan."""
    plan = plain_planner(Calibration(CODE_PRIOR)).plan()
    before = dict(vars(plan))
    drafted = build_tree(CONTEXT[-1], CONTEXT, LookupDrafter(16), SPEC, Sampling(), torch.Generator(), plan=plan)
    assert vars(plan) == before
    assert drafted.lookup is not None and drafted.lookup.found > 0
    assert set(drafted.chances) == set(range(1, len(drafted.tree)))


def test_a_phase_name_says_its_stage_and_nothing_else_claims_one():
    assert [Phase.stage_of(Phase.draft(stage)) for stage in (1, 2, 3)] == [1, 2, 3]
    assert {Phase.stage_of(key) for key in (Phase.TREE, Phase.VERIFY, Phase.BOOKKEEPING, Phase.PROMPT_READ)} == {None}


def drafted_round(with_copy: bool, path: list[int]) -> RoundPlanner:
    """A planner after one drafted round: a model guess under the root (node 1), and with `with_copy` a copied chain of
    3 beside it (nodes 2-4), verified along `path`."""
    from specviz.decode.tree import Tree
    planner = RoundPlanner(Costs.of(AVX2, DRAFT_FEED), Calibration())
    planner.read_prompt = True
    plan = planner.plan()
    assert plan.kind == "speculate"
    tree = Tree.with_root(0)
    tree.add(0, 5, 1, 0.9)
    if with_copy:
        tree.add_lookup_chain([7, 8, 9], 2)
    planner.observe(plan, tree, path, ["target", "model", "lookup"], [1, 1])
    return planner


def test_context_lookups_copies_leave_the_rate_drafting_makes_as_it_was():
    """Lookup joins plain steps as well, so its copies are no reason to draft or not: a drafted round whose copies
    failed, or were right, leaves the rate that decides it (tokens and seconds) where the same round without them
    would. A mutant that counts the copies in fails: one failed copy had taken staged off speculation for 10 rounds
    (held-out HumanEval/157, AVX2), where speculative drafted every round."""
    alone = drafted_round(False, [0])
    for path in ([0], [0, 2, 3, 4]):
        beside = drafted_round(True, path)
        assert (beside.tokens, beside.seconds) == (alone.tokens, alone.seconds), path
    assert drafted_round(True, [0, 1]).tokens > alone.tokens           # the model's own guess accepted still counts
