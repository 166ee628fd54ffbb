"""A run's rounds priced by the machine's curves (specviz/analysis/priced.py): each forward at its curve's price."""
import pytest

from specviz.analysis.priced import price
from specviz.decode.planner import Costs
from specviz.decode.trace import NodeRecord, StepRecord

# a target forward of n tokens costs 10 + n ms, a draft forward of n tokens 2n ms; the draft reads feeds of 8 tokens or
# more through its prompt reader: a one-token forward's 2 ms and 0.5 ms a token
COSTS = Costs(target=tuple((10 + n) / 1e3 for n in range(66)), draft=tuple(2 * n / 1e3 for n in range(66)), level=0.002,
              reader=(8, 0.0005))


def step(nodes: int, committed: int, draft_feeds: list[int]) -> StepRecord:
    node = NodeRecord(0, 0, "", -1, 0, 0, 0, None, None, None, True)
    return StepRecord(0, "speculative", [], [node] * nodes, [0], [1] * committed, [""] * committed, [0] * committed,
                      {}, {"target": [nodes], "draft": draft_feeds}, {}, 0.0, 0)


def test_each_forward_at_its_price_and_the_drafts_prompt_read_apart():
    steps = [step(4, 3, [20, 1, 1, 1]),     # the prompt read (20 tokens, through the reader), then 3 levels
             step(1, 1, []),                # a plain step
             step(3, 2, [10, 1, 1])]        # catching up 10 tokens (through the reader), then 2 levels
    priced = price(steps, COSTS, "target")
    assert priced.read_s == pytest.approx(0.002 + 20 * 0.0005)
    assert priced.draft_s == pytest.approx(3 * 0.002 + (0.002 + 10 * 0.0005) + 2 * 0.002)
    assert priced.verify_s == pytest.approx(0.014 + 0.011 + 0.013)
    assert priced.plain_s == pytest.approx(6 * 0.011)
    assert priced.ratio == pytest.approx(0.066 / (0.038 + 0.017 + 0.012))


def test_a_run_that_never_drafts_costs_what_plain_decoding_does():
    priced = price([step(1, 1, [])] * 5, COSTS, "target")
    assert (priced.read_s, priced.draft_s) == (0.0, 0.0) and priced.ratio == pytest.approx(1.0)
