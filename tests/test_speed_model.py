"""The numbers behind 'why it is fast': the chain formula, acceptance per rank, the cost fit, the
tree optimiser, all checked against runs whose true acceptance and costs are known."""
import random

import pytest

from specviz.analysis.speed_model import (
    FittedCosts,
    best_chain,
    chain_curve,
    chain_tokens,
    explain,
    fit_costs,
    rank_rates,
    tree_tokens,
)
from specviz.decode.trace import NodeRecord, StageInfo, StepRecord
from specviz.decode.tree import chain_shape

STAGES = [StageInfo("target", "target"), StageInfo("draft", "model")]


def chain_step(k: int, alpha: float, rng: random.Random, verify_s: float = 0.0, draft_s: float = 0.0) -> StepRecord:
    """One round of a k-token chain whose tokens are each accepted with chance alpha (independently)."""
    nodes = [NodeRecord(0, 0, "", -1, 0, 0, 0, None, None, 1.0, True)]
    alive = True
    for d in range(1, k + 1):
        accepted = alive and rng.random() < alpha
        nodes.append(NodeRecord(d, d, "", d - 1, d, 0, 1, 0.5, 0.5, None, accepted))
        alive = accepted
    path = [n.id for n in nodes if n.accepted]
    tokens = list(range(len(path)))
    return StepRecord(0, "speculative", STAGES, nodes, path, tokens, [""] * len(tokens), [0] * len(tokens),
                      {"verify": verify_s, "stage1_draft": draft_s, "tree": draft_s, "bookkeeping": 0.0},
                      {"target": [k + 1], "draft": [1] * k}, {}, verify_s + draft_s, 0)


def test_chain_formula_at_its_limits_and_in_between():
    assert chain_tokens(0.0, 5) == 1.0
    assert chain_tokens(1.0, 5) == 6.0
    assert chain_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    # a chain is a tree whose every node is a first child: both formulas agree
    assert tree_tokens(chain_shape(4), [0.7]) == pytest.approx(chain_tokens(0.7, 4))


@pytest.mark.parametrize("alpha,k", [(0.3, 3), (0.8, 5), (0.95, 8)])
def test_measured_acceptance_and_tokens_match_the_formula_on_independent_chains(alpha, k):
    rng = random.Random(7)
    steps = [chain_step(k, alpha, rng) for _ in range(4000)]
    rates = rank_rates(steps)
    assert rates[0] == pytest.approx(alpha, abs=0.02)
    got = explain(steps)
    assert got.alpha == rates[0]
    assert got.tokens_measured == pytest.approx(chain_tokens(alpha, k), rel=0.03)
    assert got.tokens_predicted == pytest.approx(got.tokens_measured, rel=0.03)


def test_rates_per_rank_count_only_children_of_accepted_nodes():
    # root has children ranks 0 (rejected) and 1 (accepted); under the rejected one sits a child that
    # must not count; under the accepted one a rank-0 child that was rejected
    nodes = [NodeRecord(0, 0, "", -1, 0, 0, 0, None, None, 1.0, True),
             NodeRecord(1, 1, "", 0, 1, 0, 1, 0.6, 0.1, 0.0, False),
             NodeRecord(2, 2, "", 0, 1, 1, 1, 0.3, 0.8, 1.0, True),
             NodeRecord(3, 3, "", 1, 2, 0, 1, 0.9, 0.9, None, False),
             NodeRecord(4, 4, "", 2, 2, 0, 1, 0.9, 0.1, 0.0, False)]
    step = StepRecord(0, "tree", STAGES, nodes, [0, 2], [2, 5], ["", ""], [1, 0], {}, {"target": [5]}, {}, 0.1, 0)
    assert rank_rates([step]) == [0.0, 1.0]      # rank 0: 0 of 2 (nodes 1, 4); rank 1: 1 of 1


def test_costs_are_recovered_from_the_steps_clocks():
    rng = random.Random(1)
    steps = [chain_step(k, 0.5, rng, verify_s=0.020 + 0.004 * (k + 1), draft_s=0.003 * k) for k in (1, 3, 5, 7) * 5]
    costs = fit_costs(steps)
    assert costs.verify_fixed == pytest.approx(0.020) and costs.verify_per_token == pytest.approx(0.004)
    assert costs.draft_per_forward == pytest.approx(0.003)
    assert costs.round(2, 3) == pytest.approx(2 * 0.003 + 0.020 + 0.004 * 3)


def test_the_chain_curve_and_the_best_length_follow_the_costs():
    cheap = FittedCosts(0.010, 0.0001, 0.001, 0.0)      # a flat verification curve and a cheap draft (a GPU)
    dear = FittedCosts(0.010, 0.0050, 0.004, 0.0)       # verification that grows fast (a small CPU)
    curve = chain_curve(0.8, cheap, cheap.round(0, 1))
    assert curve[0]["speedup"] == pytest.approx(1.0) and max(c["speedup"] for c in curve) > 2.0
    for point in curve:                            # tokens per pass over seconds per round, against baseline
        assert point["speedup"] == pytest.approx(chain_tokens(0.8, point["k"]) * cheap.round(0, 1)
                                                 / cheap.round(point["k"], point["k"] + 1))
    long, short = best_chain(curve), best_chain(chain_curve(0.8, dear, dear.round(0, 1)))
    assert long["k"] > short["k"] >= 1 and long["speedup"] > short["speedup"] > 1.0
    assert best_chain(chain_curve(0.0, dear, dear.round(0, 1)))["k"] == 0     # a draft never right: do not draft
    assert best_chain(chain_curve(0.5, dear, 0.0)) is None
