"""Staged's tree planned from the machine's cost curves (specviz/decode/costs.py): the rule, the builder that follows
it, and the stack that measures, stores and applies it."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny import tiny_model, tiny_stack

from specviz.profile import store as machine_profile, tree_plans as tree_plan_store
from specviz import prepare
from specviz.decode import costs as tree_plan
from specviz.backends.choose import open_cache
from specviz.decode.drafters import ModelDrafter
from specviz.decode.sampling import Sampling
from specviz.stack.strategies import default_tree
from specviz.decode.tree import TreeSpec
from specviz.decode.tree_builder import build_tree
from specviz.decode.costs import DRAFT_FEED, MAX_NODES, TreePlan


def plan(target: dict, draft_level: float) -> TreePlan:
    return TreePlan(target, {1: draft_level / 2, DRAFT_FEED: draft_level})


def test_the_minimum_score_of_each_guess_is_its_cost_over_a_plain_token():
    # one token 100 ms; 2 -> 110, 4 -> 150 (20 ms a token), 8 -> 310, 16 -> 630 (40 ms a token); a draft level 20 ms
    p = plan({1: 0.1, 2: 0.11, 4: 0.15, 8: 0.31, 16: 0.63}, 0.02)
    expected = (0.3, 0.4, 0.4) + (0.6,) * (MAX_NODES - 3)      # (10 + 20) / 100, (20 + 20) / 100, (40 + 20) / 100
    assert p.min_scores() == pytest.approx(expected)


def test_where_each_token_costs_a_forward_no_guess_pays_and_where_verification_is_free_trees_are_big():
    compute_bound = plan({n: 0.1 * n for n in (1, 2, 4, 8, 16)}, 0.001)
    assert compute_bound.min_scores() == ()
    flat = plan({n: 0.1 for n in (1, 2, 4, 8, 16)}, 0.005)
    assert flat.min_scores() == pytest.approx((0.05,) * MAX_NODES)


def test_a_plan_where_no_guess_pays_says_so_and_names_the_costs():
    said = tree_plan.describe(plan({n: 0.1 * n for n in (1, 2, 4, 8, 16)}, 0.02))
    assert said.startswith("no guess pays here") and "one token 100 ms, a draft level 20 ms" in said
    assert "guess 1, 2" not in said
    assert "0.30, 0.40" in tree_plan.describe(plan({1: 0.1, 2: 0.11, 4: 0.15, 8: 0.31, 16: 0.63}, 0.02))


@st.composite
def curves(draw):
    """A cost curve that grows with the tokens fed, and a draft level's cost."""
    steps = draw(st.lists(st.floats(0.0, 0.05), min_size=4, max_size=4))
    one = draw(st.floats(0.01, 0.2))
    target = {1: one}
    for (low, high), step in zip(((1, 2), (2, 4), (4, 8), (8, 16)), steps):
        target[high] = target[low] + step * (high - low)
    return target, draw(st.floats(0.0, 0.1))


@given(curves(), st.floats(0.0, 1.0))
def test_scores_never_fall_stay_in_range_and_cheaper_verification_never_shrinks_the_tree(curve, cheaper):
    target, level = curve
    scores = plan(target, level).min_scores()
    assert len(scores) <= MAX_NODES
    assert all(0 <= s <= 1 for s in scores) and list(scores) == sorted(scores)
    cheap = {n: target[1] + cheaper * (s - target[1]) for n, s in target.items()}   # every extra token cheaper
    cheap_scores = plan(cheap, level).min_scores()
    assert len(cheap_scores) >= len(scores)
    assert all(c <= s + 1e-9 for c, s in zip(cheap_scores, scores))


def test_a_plan_fills_in_a_planned_spec_within_its_budget_and_depth():
    p = plan({1: 0.1, 2: 0.11, 4: 0.15, 8: 0.31, 16: 0.63}, 0.02)
    spec = p.tree(default_tree("staged", budget=5))
    assert spec.min_scores == p.min_scores()[:5] and spec.budget == 5 and spec.max_depth == 5
    assert p.tree(TreeSpec(max_depth=3, planned=True)).max_depth == 3
    assert TreePlan.from_dict(p.to_dict()) == p


def _score(tree, node):
    return math.prod(tree.draft_probs[n] for n in tree.path(node)[1:])


@given(prompt=st.lists(st.integers(0, 63), min_size=1, max_size=12),
       scores=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), width=st.integers(1, 4),
       budget=st.integers(0, 12))
def test_the_builder_adds_a_guess_only_where_its_path_score_meets_its_minimum(prompt, scores, width, budget):
    """Level by level, the guesses added in order of their scores: the j-th of a level, with k nodes drafted before
    that level, scores at least min_scores[k + j]; no guess past the minimums' end."""
    mins = tuple(sorted(scores))
    spec = TreeSpec(shape="dynamic", budget=budget, max_depth=8, max_branch=4, level_width=width, min_scores=mins)
    drafter = ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache)
    tree = build_tree(prompt[-1], prompt, drafter, spec, Sampling(), torch.Generator().manual_seed(0)).tree
    drafted = len(tree) - 1
    assert drafted <= min(budget, len(mins))
    before = 0
    for depth in range(1, max(tree.depths) + 1):
        level = sorted((_score(tree, n) for n in range(len(tree)) if tree.depths[n] == depth), reverse=True)
        for j, score in enumerate(level):
            assert score >= mins[before + j] - 1e-6
        before += len(level)


def test_the_builder_takes_every_guess_that_meets_a_zero_minimum():
    """The mutant that stops at the first minimum fails here: zero minimums must fill the budget."""
    spec = TreeSpec(shape="dynamic", budget=6, max_depth=8, level_width=2, min_scores=(0.0,) * 6)
    drafter = ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache)
    tree = build_tree(3, [1, 2, 3], drafter, spec, Sampling(), torch.Generator().manual_seed(0)).tree
    assert len(tree) - 1 == 6


def test_a_stack_measures_its_plan_only_in_prepare_stores_it_and_every_later_stack_reads_it(own_profile,
                                                                                            monkeypatch):
    # The tiny models' curves are timed for real (beside the suite's other worker: how precise they get is the tests
    # below's business)
    first = tiny_stack(("draft", "lookup"), plan=None, profile=own_profile)
    unplanned = first.plans.planned(default_tree("staged"))        # a process that only generates never times anything
    assert unplanned.min_scores == () and unplanned.min_score == 0.5 and not own_profile.file.path().exists()
    assert first.plans.tree_plan() is None and not own_profile.file.path().exists()
    with own_profile.preparing("the tests"):        # measured as prepare measures
        measured = first.plans.tree_plan()
    planned = first.plans.planned(default_tree("staged"))
    assert planned.min_scores == measured.min_scores()[:MAX_NODES] and planned.planned
    assert "tree plan: tiny-target" in own_profile.file.path().read_text()
    monkeypatch.setattr(tree_plan_store, "measure", lambda *a: pytest.fail("a stored plan was measured again"))
    second = tiny_stack(("draft", "lookup"), plan=None, profile=own_profile)
    with own_profile.preparing("the tests"):
        stored = second.plans.tree_plan()
    assert stored == TreePlan(measured.target, measured.draft, second.plans.tree_plan().source)
    run = second.decoder([1, 2, 3], "staged", max_new_tokens=6).generate()
    assert run.settings["tree"]["min_scores"] == list(planned.min_scores)
    by_hand = second.plans.planned(default_tree("staged", min_score=0.3))     # settings given by hand are not planned
    assert by_hand.min_scores == () and by_hand.min_score == 0.3


def fake_rounds(target_one: list[float], noise: float = 0.0, seed: int = 0):
    """CostSampler.rounds on a machine whose speed swings: round r runs at speed `target_one[r % len] / 10 ms`, every
    size and model of the round alike, each timing off by up to `noise` of its own."""
    import random
    rng, done = random.Random(seed), [0]

    def rounds(self, count):
        out = [{n: [] for n in self.sizes} for _ in self.kvs]
        for _ in range(count):
            swing = target_one[done[0] % len(target_one)] / 0.010
            done[0] += 1
            for model, curve in enumerate(out):
                for n in curve:
                    base = (0.010 + 0.002 * (n - 1)) if model == 0 else 0.004
                    curve[n].append(base * swing * (1 + rng.uniform(-noise, noise)))
        return out
    return rounds


def test_a_swing_of_the_machines_speed_takes_nothing_from_the_curves_shape():
    """Each round scaled by its own total: rounds at 0.7x to 1.3x the speed give the exact shape, at the median speed,
    and leave the plan's scores certain; one wild timing moves neither a median nor a score's error much."""
    swings = [0.7, 1.0, 1.3, 0.9, 1.1]
    samples = [{1: [0.010 * k for k in swings], 4: [0.016 * k for k in swings]},
               {n: [0.003 * n * k for k in swings] for n in (1, tree_plan.DRAFT_FEED)}]
    target, draft = tree_plan_store.summarise(samples)
    assert target == pytest.approx({1: 0.010, 4: 0.016})
    assert draft == pytest.approx({n: 0.003 * n for n in (1, tree_plan.DRAFT_FEED)})
    assert tree_plan_store.score_error(samples) == pytest.approx(0.0, abs=1e-12)
    samples[0][4][2] *= 20                                  # one forward timed 20x slower (the 267 ms of a busy VM)
    target, _ = tree_plan_store.summarise(samples)
    assert target[4] / target[1] == pytest.approx(1.6, rel=0.05)
    assert tree_plan_store.score_error(samples) < tree_plan_store.SCORE_PRECISION


def test_a_plan_settles_on_the_scores_it_uses_not_on_every_size():
    """A size the plan never reaches may swing on its own (its scores stay certain); the same swing at a size whose
    price decides a score leaves that score uncertain."""
    target = {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 6: 0.031, 8: 0.049, 12: 0.085, 16: 0.121}
    swing = (1.0, 1.5, 1.0, 0.6, 1.4, 0.7, 1.3, 1.0, 0.8, 1.2, 1.0, 1.5, 0.6)
    rounds = len(swing)

    def samples(swinging: int) -> list[dict[int, list[float]]]:
        curve = {n: [t * (swing[r] if n == swinging else 1.0) for r in range(rounds)] for n, t in target.items()}
        return [curve, {n: [0.002] * rounds for n in target}]
    plan = tree_plan.TreePlan(*tree_plan_store.summarise(samples(16)))
    assert plan.min_scores() == pytest.approx((0.3, 0.3, 0.3))      # the fourth guess would need 1.1: the plan ends
    assert tree_plan_store.score_error(samples(16)) == pytest.approx(0.0, abs=1e-12)
    assert tree_plan_store.score_error(samples(12)) == pytest.approx(0.0, abs=1e-12)
    assert tree_plan_store.score_error(samples(2)) > tree_plan_store.SCORE_PRECISION
    assert tree_plan_store.score_error(samples(6)) > tree_plan_store.SCORE_PRECISION   # it decides where the plan ends


def test_a_quiet_machine_settles_at_once_and_prepare_says_the_profile_holds_it(preparing, monkeypatch):
    from specviz.profile.cost_curve import CostSampler
    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.007, 0.013, 0.010, 0.012], noise=0.01))
    stack = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)
    plan = stack.plans.tree_plan()
    stored = preparing.stored(stack.plans.name())
    assert machine_profile.settled(stored) and stored["rounds"] == tree_plan_store.FIRST_ROUNDS
    assert plan.target[4] / plan.target[1] == pytest.approx(1.6, rel=0.03)
    assert prepare.closing_line(preparing) == "this machine's profile holds every measurement"


def test_curves_that_stay_noisy_are_stored_and_planned_from_and_prepare_names_them(preparing, monkeypatch):
    """The fallback is the curves measured, not staged's fixed rule; the last line asks for a run at rest, and every
    prepare measures them again until they settle. Under --remeasure, noisy curves never replace precise ones."""
    from specviz.profile.cost_curve import CostSampler
    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.010], noise=0.6))
    stack = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)
    noisy = stack.plans.tree_plan()
    stored = preparing.stored(stack.plans.name())
    # so noisy that settling would take more than HOPELESS times MOST_ROUNDS: it stops at its first look
    assert not machine_profile.settled(stored) and stored["rounds"] == tree_plan_store.FIRST_ROUNDS
    assert tree_plan_store.rounds_needed(stored["score_error"], stored["rounds"]) > \
        tree_plan_store.HOPELESS * tree_plan_store.MOST_ROUNDS and "would settle them" in stored["why"]
    assert noisy is not None and stack.plans.planned(default_tree("staged")).min_scores == noisy.min_scores()
    last = prepare.closing_line(preparing)
    assert "stored all the same, and used" in last and "uncertain" in last
    later = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)   # in the same prepare: not measured again
    assert later.plans.tree_plan().target == noisy.target
    preparing.records.measured = []           # the next prepare measures it again: still noisy
    again = tiny_stack(("draft", "lookup"), plan=None, profile=preparing).plans.tree_plan()
    assert again.target != noisy.target and not machine_profile.settled(preparing.stored(stack.plans.name()))
    noisy = again

    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.010], noise=0.01))     # at rest: --remeasure refines
    preparing.records.measured = []
    precise = tiny_stack(("draft", "lookup"), plan=None, profile=preparing).plans.tree_plan()
    assert machine_profile.settled(preparing.stored(stack.plans.name())) and precise.target != noisy.target
    preparing.records.remeasured = set()
    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.010], noise=0.6))     # busy again: the precise stand
    with preparing.preparing("the tests", remeasure=True):
        assert tiny_stack(("draft", "lookup"), plan=None, profile=preparing).plans.tree_plan().target == precise.target
    assert "the profile's earlier value stands" in prepare.closing_line(preparing)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_quiet_machine_whose_timings_spread_more_takes_more_rounds_and_settles(preparing, monkeypatch, seed):
    """Timings off by up to 22% each (a quiet Ice Lake held to AVX2 spread about so): 41 rounds leave the scores
    uncertain by more than SCORE_PRECISION, and the rounds go on (45 to 69 of them), as the spread says they should."""
    from specviz.profile.cost_curve import CostSampler
    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.010], noise=0.22, seed=seed))
    stack = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)
    stack.plans.tree_plan()
    stored = preparing.stored(stack.plans.name())
    assert machine_profile.settled(stored) and 41 < stored["rounds"] <= tree_plan_store.MOST_ROUNDS
    assert stored["score_error"] <= tree_plan_store.SCORE_PRECISION
    assert prepare.closing_line(preparing) == "this machine's profile holds every measurement"


def test_curves_timed_while_other_work_kept_the_cores_busy_are_stored_unsettled_and_planned_from(preparing,
                                                                                                   monkeypatch):
    from specviz.profile.cost_curve import CostSampler
    monkeypatch.setattr(CostSampler, "rounds", fake_rounds([0.010], noise=0.01))
    monkeypatch.setattr(machine_profile.OthersWatch, "share", lambda self: 0.9)
    preparing.busy_share = 0.25
    monkeypatch.setattr(machine_profile, "SETTLE_WAIT_S", 0.0)
    stack = tiny_stack(("draft", "lookup"), plan=None, profile=preparing)
    busy = stack.plans.tree_plan()
    stored = preparing.stored(stack.plans.name())
    assert busy is not None and not machine_profile.settled(stored) and "other work used 90%" in stored["why"]
    assert preparing.records.measured.count(stack.plans.name()) == machine_profile.SETTLE_TRIES
    assert "stored all the same, and used" in prepare.closing_line(preparing)
    preparing.records.imprecise = {}          # the next prepare, on a machine at rest
    preparing.records.measured = []
    monkeypatch.setattr(machine_profile.OthersWatch, "share", lambda self: 0.0)
    tiny_stack(("draft", "lookup"), plan=None, profile=preparing).plans.tree_plan()
    assert machine_profile.settled(preparing.stored(stack.plans.name()))
    assert prepare.closing_line(preparing) == "this machine's profile holds every measurement"


def test_interpolate_is_linear_between_sizes_and_past_the_last_two():
    curve = {1: 10.0, 2: 12.0, 4: 20.0}
    assert [tree_plan.interpolate(curve, n) for n in (1, 2, 3, 4, 6)] == [10.0, 12.0, 16.0, 20.0, 28.0]
    assert TreePlan(curve, curve).cost(3) == 16.0


@pytest.mark.slow
def test_the_sweeps_model_prices_each_runs_forwards_by_the_curves_and_baseline_at_one_token_each(tmp_path):
    """scripts/tree_settings_sweep.py --modelled on the offline stack: plain decoding priced at one one-token forward
    a token (its other phases' clocks aside), every setting's tokens baseline's, and priced times that follow the
    forwards each run made."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    prompts = tmp_path / "one.jsonl"
    prompts.write_text((repo / "specviz/bench/data/tuning_humaneval_20_25.jsonl").read_text().splitlines()[0] + "\n")
    out, tokens = tmp_path / "sweep.json", 12
    run = subprocess.run([sys.executable, "scripts/tree_settings_sweep.py", "--modelled", "--new-tokens", str(tokens),
                          "offline", str(prompts), str(out), "base=baseline", "staged=staged",
                          "wide=staged:budget=12:min_score=0.01"],
                         cwd=repo, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    summary, curves = result["summary"], result["curves"]
    assert len(curves) == 2 and all({int(n) for n in c} == set(tree_plan.SIZES) for c in curves.values())
    assert summary["base"]["modelled"] == 1.0
    # baseline's price: one one-token forward a token, plus its own clocked phases (timed, so not bounded here)
    clocked_phases = ("prompt_read", "tree", "bookkeeping")
    for base in result["runs"]["base"]:
        (target,) = {name for step in base["forwards"] for name in step}
        clocked = sum(s for phase, s in base["clocked_s"].items() if phase in clocked_phases)
        assert [step[target] for step in base["forwards"]] == [[1]] * tokens
        assert base["priced_s"] == pytest.approx(tokens * curves[target]["1"] + clocked)
    assert all(s["same_tokens"] == 1 for s in summary.values())
    # a drafted run's price: each model's forwards at its curve's price for the tokens each fed, but the draft's first
    # (its read of the prompt, clocked), and the phases that run no model by their clocks. A wider tree accepts more a
    # round, so it may need fewer draft forwards, but it never makes the same trees: the settings cannot price equal
    by_name = {name: {int(n): s for n, s in curve.items()} for name, curve in curves.items()}
    for name in ("staged", "wide"):
        for run_ in result["runs"][name]:
            assert sum(len(step.get(target, [])) for step in run_["forwards"]) == run_["target_forwards"]
            clocks = run_["clocked_s"]
            priced = sum(s for phase, s in clocks.items() if phase in clocked_phases
                         or (phase.endswith("_draft") and phase != "stage1_draft"))
            for index, step in enumerate(run_["forwards"]):
                for model, feeds in step.items():
                    read = index == 0 and model != target and "prompt_read" in clocks
                    priced += sum(tree_plan.interpolate(by_name[model], n) for n in feeds[read:])
            assert run_["priced_s"] == pytest.approx(priced)
    assert [r["forwards"] for r in result["runs"]["wide"]] != [r["forwards"] for r in result["runs"]["staged"]]
    assert summary["wide"]["modelled"] != summary["staged"]["modelled"]
    assert "| modelled | vs plain |" in run.stdout
