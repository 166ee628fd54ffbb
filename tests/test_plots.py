"""Plot builders on recorded traces (tests/data, re-recorded by tests/data/record_traces.py): no models."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specviz import plots
from specviz.decode.metrics import accept_by_position
from specviz.decode.trace import NodeRecord, RunRecord, StageInfo, StepRecord

DATA = Path(__file__).resolve().parent / "data"


def load_runs(name: str) -> dict[str, RunRecord]:
    return {k: RunRecord.from_dict(v) for k, v in json.loads((DATA / name).read_text()).items()}


@pytest.fixture(scope="module")
def greedy():
    return load_runs("greedy_runs.json")


@pytest.fixture(scope="module")
def sampled():
    return load_runs("sampled_runs.json")["speculative"]


def node_traces(fig):
    return [t for t in fig.data if t.meta == "nodes"]


def all_steps(greedy, sampled):
    return [s for run in greedy.values() for s in run.steps] + sampled.steps


def test_recorded_traces_cover_every_stage_kind(greedy, sampled):
    kinds = {stage.kind for s in all_steps(greedy, sampled) for n in s.nodes[1:] for stage in [s.stages[n.stage]]}
    assert {"model", "lookup"} <= kinds
    staged_stages = {n.stage for s in greedy["staged"].steps for n in s.nodes[1:]}
    assert staged_stages == {1, 2}, "the staged recording should have nodes from both drafting stages"


def test_tree_figure_has_one_marker_and_one_label_per_node(greedy, sampled):
    for step in all_steps(greedy, sampled):
        fig = plots.tree_figure(step)
        ids = sorted(i for t in node_traces(fig) for i in t.customdata)
        assert ids == [n.id for n in step.nodes]
        bonus = [t for t in fig.data if t.meta == "bonus"]
        assert len(bonus) == (plots.bonus_token(step) is not None)
        labels = [a.text for a in fig.layout.annotations]
        assert {a.name for a in fig.layout.annotations} >= {f"node-{n.id}" for n in step.nodes}
        expected = [plots.token_label(n.text) for n in step.nodes]
        if bonus:
            expected.append(plots.token_label(step.committed_text[-1]))
        assert sorted(labels) == sorted(html.escape(x, quote=False) for x in expected)
        layout = plots.tree_layout(step)
        assert len(set(layout.values())) == len(layout), "no two boxes (the target's token included) overlap"
        assert (plots.BONUS_ID in layout) == bool(bonus)
        json.loads(fig.to_json())


def test_tree_nodes_are_coloured_by_the_stage_that_proposed_them(greedy):
    step = next(s for s in greedy["staged"].steps if {n.stage for n in s.nodes[1:]} == {1, 2})
    fig = plots.tree_figure(step)
    by_node = {}
    for trace in node_traces(fig):
        for node_id in trace.customdata:
            by_node[node_id] = trace.marker.color
    assert by_node[0] == plots.ROOT_COLOUR
    for n in step.nodes[1:]:
        expected = {"model": "#0072B2", "ngram": "#009E73", "lookup": "#CC79A7"}[step.stages[n.stage].kind]
        assert by_node[n.id] == expected
    names = {t.name for t in node_traces(fig)}
    assert any("stage 1 draft model" in name for name in names)
    assert any("stage 2 context lookup" in name for name in names)
    bonus = next(t for t in fig.data if t.meta == "bonus")
    assert bonus.marker.color == "#D55E00"          # the target's token is vermillion (red)


def test_accepted_path_is_highlighted_and_rejected_nodes_dimmed(greedy, sampled):
    for step in all_steps(greedy, sampled):
        fig = plots.tree_figure(step)
        path = next(t for t in fig.data if t.meta == "accepted-path")
        assert list(path.customdata) == step.accepted_path
        assert sum(x is None for x in path.x) == len(step.accepted_path) - 1      # one segment per accepted edge
        rejected = next(t for t in fig.data if t.meta == "rejected-edges")
        assert sum(x is None for x in rejected.x) == sum(not n.accepted for n in step.nodes[1:])
        colour = {i: t.marker.color for t in node_traces(fig) for i in t.customdata}
        boxes = {a.name: a for a in fig.layout.annotations}
        for n in step.nodes:
            box = boxes[f"node-{n.id}"]
            if n.accepted:
                assert box.bgcolor == colour[n.id] and box.bordercolor == "#111111"
            else:
                assert box.bgcolor == plots.blend(colour[n.id], plots.REJECTED_TINT)
    tree_step = next(s for s in greedy["tree"].steps if any(not n.accepted for n in s.nodes))
    place = plots.tree_layout(tree_step)
    assert {place[i][1] for i in tree_step.accepted_path} == {0.0}, "the accepted path is the top row"


def test_hover_shows_draft_target_and_acceptance_probabilities(greedy, sampled):
    steps = all_steps(greedy, sampled)
    seen = set()
    for step in steps:
        fig = plots.tree_figure(step)
        hover = {i: h for t in node_traces(fig) for i, h in zip(t.customdata, t.hovertext)}
        for n in step.nodes[1:]:
            text = hover[n.id]
            assert f"q = {n.draft_prob:.3f}" in text and f"p = {n.target_prob:.3f}" in text
            if n.accept_prob is None:
                assert "not checked" in text
                seen.add("unchecked")
            else:
                assert f"acceptance probability = {n.accept_prob:.3f}" in text
                assert ("accepted ✓" if n.accepted else "rejected ✗") in text
                seen.add("accepted" if n.accepted else "rejected")
    assert seen == {"accepted", "rejected", "unchecked"}
    # sampling: lookup proposals are point masses, so their acceptance probability is the target's p
    sampled_nodes = [n for s in sampled.steps for n in s.nodes[1:] if n.accept_prob is not None]
    assert any(0 < n.accept_prob < 1 for n in sampled_nodes)


def test_baseline_step_is_a_root_and_the_target_token(greedy):
    step = greedy["baseline"].steps[0]
    fig = plots.tree_figure(step)
    assert sum(len(t.x) for t in node_traces(fig)) == 1
    assert next(t for t in fig.data if t.meta == "bonus").marker.color == "#D55E00"
    assert "nothing drafted" in fig.layout.title.text


def test_empty_tree_figure_explains_what_to_do():
    fig = plots.tree_figure(None)
    assert "Step" in fig.layout.annotations[0].text


@given(st.lists(st.integers(0, 10**6), min_size=0, max_size=30), st.integers(0, 40))
def test_tree_layout_places_every_node_once_at_its_depth(choices, accepted_upto):
    nodes = [NodeRecord(0, 0, "r", -1, 0, 0, 0, None, None, None, True)]
    for i, choice in enumerate(choices, start=1):
        parent = choice % i
        rank = sum(1 for n in nodes if n.parent == parent)
        nodes.append(NodeRecord(i, i, f"t{i}", parent, nodes[parent].depth + 1, rank, 1, 0.5, 0.5, None, False))
    path = [0]
    while len(path) <= accepted_upto:
        kids = [n for n in nodes if n.parent == path[-1]]
        if not kids:
            break
        path.append(kids[-1].id)
    for i in path:
        nodes[i].accepted = True
    step = StepRecord(0, "tree", [StageInfo("t", "target"), StageInfo("d", "model")], nodes, path, [], [], [],
                      {}, {}, {}, 0.0, 0)
    place = plots.tree_layout(step)
    assert len(set(place.values())) == len(nodes)
    for n in nodes:
        assert place[n.id][0] == n.depth
    assert {place[i][1] for i in path} == {0.0}


def test_token_labels_make_whitespace_visible():
    assert plots.token_label("\n") == "↵"
    assert plots.token_label(" the") == "·the"
    assert plots.token_label("") == "∅"
    assert plots.token_label("x" * 40).endswith("…") and len(plots.token_label("x" * 40)) == 14


def test_stage_colours_follow_the_paper_and_stay_distinct():
    stages = [StageInfo("t", "target"), StageInfo("d", "model"), StageInfo("g", "ngram")]
    assert plots.stage_colours(stages) == ["#D55E00", "#0072B2", "#009E73"]
    twice = plots.stage_colours([StageInfo("t", "target"), StageInfo("a", "model"), StageInfo("b", "model")])
    assert len(set(twice)) == 3


def test_acceptance_figure_matches_the_metrics(greedy, sampled):
    steps = greedy["tree"].steps
    fig = plots.acceptance_figure(steps)
    heat = fig.data[0]
    assert heat.type == "heatmap" and heat.colorbar.title.text
    for key, value in accept_by_position(steps).items():
        depth, rank = map(int, key.split("."))
        assert heat.z[rank][depth - 1] == pytest.approx(value["rate"])
        assert f"n={value['count']}" in heat.text[rank][depth - 1]
    assert not plots.acceptance_figure(greedy["baseline"].steps).data      # nothing drafted: a message
    assert plots.acceptance_figure(sampled.steps).data


def has_legend(fig) -> bool:
    named = [t for t in fig.data if t.name and t.showlegend is not False]
    bars = [t for t in fig.data if t.type == "heatmap" and t.colorbar]
    return fig.layout.showlegend is not False and bool(named or bars)


def test_compare_charts_have_legends_and_consistent_numbers(greedy):
    stats = {name: greedy[name].stats for name in ("baseline", "speculative", "staged")}
    stages = {name: greedy[name].steps[0].stages for name in stats}
    latency = plots.latency_figure(stats, stages)
    forwards = plots.forwards_figure(stats)
    memory = plots.memory_figure(stats, stages)
    for fig in (latency, forwards, memory, plots.acceptance_figure(greedy["tree"].steps)):
        assert has_legend(fig)
        json.loads(fig.to_json())
    # latency: per-token stacks add up to the wall time per token
    per_token = [t for t in latency.data if t.xaxis == "x"]
    for i, name in enumerate(stats):
        total = sum(t.y[i] for t in per_token)
        assert total == pytest.approx(1000 * stats[name]["wall_s"] / stats[name]["new_tokens"], rel=1e-6)
    assert {t.name for t in per_token} >= {"verification (target forward)", "overhead (bookkeeping, Python)",
                                           "drafting: draft model (stage 1)"}
    # one colour per stage everywhere: each drafting bar has its stage's colour in the tree
    staged = stages["staged"]
    tree_colours = plots.stage_colours(staged)
    for trace in per_token:
        for index, stage in enumerate(staged):
            if trace.name == f"drafting: {plots.KIND_WORDS[stage.kind]} (stage {index})":
                assert trace.marker.color == tree_colours[index]
    assert any("context lookup" in t.name for t in per_token) and "#CC79A7" in tree_colours
    assert [t.y[0] for t in forwards.data] == [pytest.approx(stats[n]["tokens_per_target_forward"]) for n in stats]
    bars = [t for t in memory.data if t.type == "bar"]
    for i, name in enumerate(stats):
        assert sum(t.y[i] for t in bars) == pytest.approx(stats[name]["bytes_relative_to_baseline"])
    assert stats["baseline"]["bytes_relative_to_baseline"] == pytest.approx(1.0)


def test_compare_charts_without_data_show_a_message():
    for build in (plots.latency_figure, plots.forwards_figure, plots.memory_figure):
        fig = build({})
        assert not fig.data and "Compare" in fig.layout.annotations[0].text


def test_benchmark_figure_groups_by_sampling():
    bench = {"machine": "test box", "date": "today", "command": "python -m specviz.bench", "results": [
        {"strategy": s, "sampling": m, "tokens_per_s_median": v, "speedup_vs_hf_generate": v / 10,
         "tokens_per_target_forward": None, "bytes_relative_to_baseline": None, "phase_share": None,
         "exact_match": None, "prompts": 3}
        for (s, m, v) in [("baseline", "greedy", 10.0), ("staged", "greedy", 30.0), ("staged", "topk50", 20.0)]]}
    fig = plots.benchmark_figure(bench)
    assert [t.name for t in fig.data] == ["greedy", "topk50"]
    assert list(fig.data[0].y) == [10.0, 30.0] and list(fig.data[1].y) == [None, 20.0]
    assert has_legend(fig) and "test box" in fig.layout.title.text
    assert not plots.benchmark_figure(None).data


def test_the_targets_token_gets_its_own_box_beside_rejected_children():
    """All drafts rejected: the target's token continues the top row, the rejected child moves down."""
    nodes = [NodeRecord(0, 5, " Wed", -1, 0, 0, 0, None, None, None, True),
             NodeRecord(1, 6, ",", 0, 1, 0, 1, 0.6, 0.1, 0.0, False),
             NodeRecord(2, 7, '"', 1, 2, 0, 1, 0.5, 0.2, None, False)]
    step = StepRecord(0, "tree", [StageInfo("t", "target"), StageInfo("d", "model")], nodes, [0], [8], [";"], [0],
                      {}, {}, {}, 0.0, 0)
    layout = plots.tree_layout(step)
    assert layout[plots.BONUS_ID] == (1.0, 0.0) and layout[1] == (1.0, -1.0) and layout[2] == (2.0, -1.0)
    fig = plots.tree_figure(step)
    assert {a.text for a in fig.layout.annotations} == {"·Wed", ",", '"', ";"}      # quotes stay readable
