"""The replay backend (specviz/bench/replay_backend.py): a shipped recording's rounds run again through the engine on
random Qwen2 models of tiny sizes. Every round must grow the recorded tree, feed the drafts the recorded sizes and
accept the recorded path; a replay that strays (a lost proposal, a wrong decision) must be caught."""
import pytest
import torch

from specviz.bench import replay_backend as kv_replay
from specviz.bench import projection
from specviz.recording import RECORDINGS, load

RECORDING = RECORDINGS / "cpu-qwen-coder-humaneval0-greedy.json.gz"


@pytest.fixture(scope="module")
def lanes():
    return {name: projection.decisions(lane.recorded_steps) | {"prompt_tokens": len(lane.prompt)}
            for name, lane in load(RECORDING).lanes.items()}


@pytest.fixture(scope="module")
def models(lanes):
    names = sorted({st["name"] for lane in lanes.values() for st in lane["stages"][1:] if st["kind"] == "model"})
    target, drafts, _, _ = projection._models(projection.PROJECTION_SIZES["tiny-qwen"], "cpu", "float32", names, None)
    return target, drafts


def replay(lanes, models, strategy):
    target, drafts = models
    recorded = lanes[strategy]
    row = {"_decisions": recorded}
    with torch.inference_mode():
        return projection.replay(target, projection._drafts_of(drafts, row), recorded, recorded["prompt_tokens"],
                                 projection.PROJECTION_SIZES["tiny-qwen"]["vocab"])


def test_every_recorded_round_is_grown_fed_and_accepted_again(lanes, models):
    assert {"baseline", "speculative", "staged"} <= set(lanes)
    for strategy, recorded in lanes.items():
        seconds, run = replay(lanes, models, strategy)
        drafts = {st["name"] for st in recorded["stages"][1:] if st["kind"] == "model"}
        parts = projection.round_parts(run.steps)                  # every phase's time lands in one part
        assert sum(parts.values()) == pytest.approx(sum(sum(step.phase_s.values()) for step in run.steps))
        assert parts["verify"] == pytest.approx(sum(step.phase_s["verify"] for step in run.steps))
        assert len(run.steps) == len(recorded["steps"])
        for step, st in zip(run.steps, recorded["steps"]):
            assert sorted(n.depth for n in step.nodes) == sorted(projection._depths(st["parents"]))
            assert [step.nodes[n].token for n in step.accepted_path[1:]] == st["path"][1:]
            assert len(step.committed_tokens) == st["committed"]
            assert {name: step.forwards[name] for name in drafts} == {name: st["forwards"].get(name, [])
                                                                      for name in drafts}
            assert set(step.phase_s) >= {"tree", "verify", "bookkeeping"} | ({"stage1_draft"} if drafts else set())


def test_a_replay_that_loses_a_proposal_is_caught(lanes, models, monkeypatch):
    expand = kv_replay.ReplayDrafter.expand

    def only_the_first_level(self, tree, nodes, context):
        rows = expand(self, tree, nodes, context)
        return [row if tree.depths[node] == 0 else None for node, row in zip(nodes, rows)]

    monkeypatch.setattr(kv_replay.ReplayDrafter, "expand", only_the_first_level)
    with pytest.raises(kv_replay.ReplayError):
        replay(lanes, models, "staged")


def test_a_replay_whose_target_decides_otherwise_is_caught(lanes, models, monkeypatch):
    of = kv_replay.RecordedRound.of

    def bonus_at_the_root(step, vocab):
        recorded = of(step, vocab)
        return kv_replay.RecordedRound(recorded.children, {kv_replay.ROOT: recorded.nodes}, recorded.forwards,
                                       recorded.nodes, recorded.committed)

    monkeypatch.setattr(kv_replay.RecordedRound, "of", staticmethod(bonus_at_the_root))
    with pytest.raises(kv_replay.ReplayError):
        replay(lanes, models, "speculative")


def test_a_tree_larger_than_the_vocabulary_is_refused():
    step = {"tokens": list(range(8)), "parents": [-1, 0, 1, 2, 3, 4, 5, 6], "path": [0, 1], "forwards": {},
            "committed": 2}
    with pytest.raises(kv_replay.ReplayError, match="vocabulary"):
        kv_replay.RecordedRound.of(step, vocab=8)
    assert kv_replay.RecordedRound.of(step, vocab=9).accepts == {kv_replay.ROOT: 1, 1: 8}


def test_a_branching_tree_of_a_table_drafter_is_replayed(models):
    """A tree with siblings and no draft model (an n-gram stage's): grown whole, and the recorded branch accepted."""
    target, _ = models
    step = {"tokens": [9, 11, 12, 13, 14, 15], "parents": [-1, 0, 0, 0, 2, 2], "probs": [None, .5, .3, .2, .6, .4],
            "path": [0, 2, 5], "forwards": {}, "committed": 3}
    recorded = {"stages": [], "steps": [step, {**step, "committed": 2}]}
    with torch.inference_mode():
        _, run = projection.replay(target, {}, recorded, 5, projection.PROJECTION_SIZES["tiny-qwen"]["vocab"])
    assert [len(st.nodes) for st in run.steps] == [6, 6]
    assert [[st.nodes[n].token for n in st.accepted_path] for st in run.steps][0][1:] == [2, 5]
    assert [len(st.committed_tokens) for st in run.steps] == [3, 2] and run.tokens[2] == 6     # 6: the bonus
