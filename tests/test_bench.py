"""The benchmark on tiny random models: schema, ratios, exactness counts, and bad input."""
import json
import time

import pytest
import torch
from tiny import WordTokenizer, tiny_model
from tiny import tiny_stack as tiny

from specviz import bench
from specviz.peers import llama_cpp
from specviz.bench import run_bench
from specviz.peers.hf import hf_generate
from specviz.bench.prompts import Prompt, load_prompts
from specviz.decode.sampling import Sampling

KEYS = {"strategy", "sampling", "tokens_per_s_median", "tokens_per_s_p25", "tokens_per_s_p75",
        "speedup_vs_hf_generate", "speedup_vs_hf_assisted", "speedup_vs_baseline", "speedup_vs_reference",
        "tokens_per_target_forward", "mean_accepted_per_target_forward", "bytes_relative_to_baseline", "phase_share",
        "exact_match", "prompts"}


def tiny_stack(drafts=("draft", "lookup")):
    return tiny(drafts, WordTokenizer())


PROMPTS = [Prompt("a", "def add(a, b):\n    return a + b\n\ndef add("), Prompt("b", "x = [1, 2, 3]\ny = [1, 2,")]


@pytest.fixture(scope="module")
def report():
    return run_bench(tiny_stack(), PROMPTS, list(bench.ALL_STRATEGIES), ["greedy", "topk50"],
                     max_new_tokens=12, progress=False)


def test_report_has_every_strategy_and_the_schema(report):
    results = report["results"]
    ours = [t for t in bench.ALL_STRATEGIES if t not in llama_cpp.PEERS]     # tiny models are no GGUF files
    assert {(r["sampling"], r["strategy"]) for r in results} == {(s, t) for s in ("greedy", "topk50") for t in ours}
    assert [note.split(" skipped: ")[0] for note in report["settings"]["notes"]] == list(llama_cpp.PEERS)
    assert report["reference"]["strategy"] == "baseline" and "our baseline in float32" == report["reference"]["what"]
    for r in results:
        assert KEYS <= set(r)
        assert r["prompts"] == 2
        assert r["tokens_per_s_p25"] <= r["tokens_per_s_median"] <= r["tokens_per_s_p75"]
    json.loads(json.dumps(report))            # plain data
    assert len(report["per_prompt"]) == 2 * 2 * len(ours)
    assert all(row["new_tokens"] == 12 for row in report["per_prompt"])
    assert "exactly 12 tokens, past any end-of-text token" in report["settings"]["length"]     # and says so


def test_ratios_are_against_the_same_prompt(report):
    rows = {(r["prompt"], r["sampling"], r["strategy"]): r for r in report["per_prompt"]}
    for (prompt, sampling, strategy), row in rows.items():
        base, hf = rows[(prompt, sampling, "baseline")], rows[(prompt, sampling, "hf_generate")]
        assisted = rows[(prompt, sampling, "hf_assisted")]
        assert row["speedup_vs_baseline"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"])
        assert row["speedup_vs_hf_generate"] == pytest.approx(row["tokens_per_s"] / hf["tokens_per_s"])
        assert row["speedup_vs_hf_assisted"] == pytest.approx(row["tokens_per_s"] / assisted["tokens_per_s"])
        assert row["speedup_vs_reference"] == pytest.approx(row["speedup_vs_baseline"])   # no llama.cpp here
        if strategy.startswith("hf_"):
            assert row["bytes_relative_to_baseline"] is None
        else:
            assert row["bytes_relative_to_baseline"] == pytest.approx(row["bytes_per_token"] / base["bytes_per_token"])
    for r in report["results"]:
        if r["strategy"] == "baseline":
            assert r["bytes_relative_to_baseline"] == pytest.approx(1.0)
            assert r["speedup_vs_baseline"] == pytest.approx(1.0)
            assert r["tokens_per_target_forward"] == pytest.approx(1.0)
        if r["strategy"] == "hf_generate":
            assert r["speedup_vs_hf_generate"] == pytest.approx(1.0)
            assert r["tokens_per_target_forward"] == pytest.approx(1.0)
        if r["strategy"] == "hf_assisted":
            assert r["speedup_vs_hf_assisted"] == pytest.approx(1.0)
        if r["phase_share"]:
            assert sum(r["phase_share"].values()) == pytest.approx(1.0, abs=1e-6)
    for row in report["per_prompt"]:        # every row's clock sees its forwards (ours run the model's body)
        assert 0 < row["forward_s"] <= row["wall_s"]


def test_greedy_outputs_are_exact_and_counted(report):
    # fp32 tiny models: every strategy, HF's included, must reproduce plain greedy decoding
    for r in report["results"]:
        if r["sampling"] == "greedy":
            assert r["exact_match"] == 2, r["strategy"]
        else:
            assert r["exact_match"] is None


def test_exactness_counts_mismatches():
    engine = {"bytes_per_token": 10.0, "mean_accepted_per_target_forward": 0.0, "steps": 2,
              "decode_wall_s": 1.0, "phase_s": {"verify": 0.5}}
    peer = dict.fromkeys(engine)
    rows = [{"prompt": p, "sampling": "greedy", "strategy": s, "tokens": t, "wall_s": 1.0, "target_forwards": 2,
             "forward_s": 0.5, **(engine if s == "baseline" else peer)}
            for p, s, t in [("a", "baseline", [1, 2]), ("a", "hf_generate", [1, 2]),
                            ("b", "baseline", [1, 2]), ("b", "hf_generate", [1, 3])]]
    results = bench.summarise(bench.compare_rows(rows))
    hf = next(r for r in results if r["strategy"] == "hf_generate")
    assert hf["exact_match"] == 1 and hf["prompts"] == 2
    base = next(r for r in results if r["strategy"] == "baseline")
    assert base["exact_match"] == 2 and base["phase_share"] == {"verify": 0.5, "other": 0.5}


def test_hf_generate_ignores_end_of_sequence():
    model = tiny_model("llama", 0)
    first = hf_generate(model, [1, 2, 3], Sampling(), 1).tokens[0]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = first          # the very first token would end generation
    try:
        run = hf_generate(model, [1, 2, 3], Sampling(), 6)
    finally:
        model.generation_config.eos_token_id = saved
    assert len(run.tokens) == 6 and run.target_forwards == 6


def test_stack_without_model_draft_skips_with_notes():
    out = run_bench(tiny_stack(drafts=("lookup",)), PROMPTS[:1], list(bench.ALL_STRATEGIES),
                    ["greedy"], max_new_tokens=4, progress=False, warmup=False)
    ran = {r["strategy"] for r in out["results"]}
    assert "hf_assisted" not in ran and "staged" not in ran and "speculative" in ran
    notes = " ".join(out["settings"]["notes"])
    assert "hf_assisted skipped" in notes and "staged skipped" in notes


def test_each_speculative_strategy_gets_its_round_analysis(report):
    rows = report["per_prompt"]
    for r in report["results"]:
        if r["strategy"] in ("baseline",) or r["strategy"].startswith("hf_"):
            assert r["rounds"] is None, r["strategy"]
            continue
        mine = [x for x in rows if (x["sampling"], x["strategy"]) == (r["sampling"], r["strategy"])]
        plain = [x for x in rows if (x["sampling"], x["strategy"]) == (r["sampling"], "baseline")]
        rounds, tokens = sum(x["steps"] for x in mine), sum(x["new_tokens"] for x in mine)
        assert r["rounds"]["tokens"] == pytest.approx(tokens / rounds)
        assert r["rounds"]["round_s"] == pytest.approx(sum(x["decode_wall_s"] for x in mine) / rounds)
        assert r["rounds"]["plain_token_s"] == pytest.approx(sum(x["decode_wall_s"] for x in plain) / (12 * 2))
        verify = sum(x["phase_s"]["verify"] for x in mine) / rounds
        assert r["rounds"]["verify_s"] == pytest.approx(verify)
        assert r["rounds"]["analysis"].startswith(f"Analysis of {r['strategy']}'s rounds")
        whole = sum(x["wall_s"] for x in plain)          # plain decoding's prompt reads, as a share of its whole time
        share = (whole - sum(x["decode_wall_s"] for x in plain)) / whole
        assert 0 < r["rounds"]["read_share"] == pytest.approx(share)
        assert f"took {share:.0%} of plain decoding's whole time" in r["rounds"]["analysis"]


def test_planned_rounds_are_priced_by_the_stacks_curves(report):
    """The tiny stack's pinned plan (tests/tiny.py flat_plan): a target forward costs 10 ms whatever its size, a draft
    forward 1 ms. So a run's rounds cost 10 ms each, its draft forwards 1 ms each (the first, the prompt read, apart),
    and plain decoding 10 ms a token."""
    priced = [r for r in report["per_prompt"] if r.get("priced") is not None]
    assert {r["strategy"] for r in priced} == {"speculative", "staged"}
    assert all(r.get("priced") is None for r in report["per_prompt"] if r["strategy"] == "baseline")
    for r in priced:
        assert r["priced"]["plain_s"] == pytest.approx(0.01 * 12)
        assert r["priced"]["verify_s"] == pytest.approx(0.01 * r["steps"])
        assert r["priced"]["read_s"] == pytest.approx(0.001)
        assert r["priced"]["draft_s"] == pytest.approx(0.001 * (r["draft_forwards"] - 1))
    for r in report["results"]:
        mine = [x["priced"]["ratio"] for x in priced if (x["sampling"], x["strategy"]) == (r["sampling"],
                                                                                             r["strategy"])]
        assert (r["priced"] or {}).get("median") == (pytest.approx(sorted(mine)[0] / 2 + sorted(mine)[1] / 2)
                                                      if mine else None)
        if mine:
            assert r["priced"]["lowest"]["ratio"] == min(mine)
            assert "Priced by this machine's cost curves" in bench.report.format_analyses([r])


def test_outputs_json_and_html(report, tmp_path, capsys):
    full = {"machine": "test", "date": "today", "command": "python -m specviz.bench", **report}
    written = bench.write_outputs(full, tmp_path / "latest.json", png=False)
    assert json.loads((tmp_path / "latest.json").read_text())["results"] == report["results"]
    assert {p.name for p in written} >= {"latest.json", "latest_table.md", "latest_tokens_per_s.html",
                                         "latest_bytes.html"}
    table_md = (tmp_path / "latest_table.md").read_text()
    assert table_md.startswith(bench.format_table(report["results"], markdown=True) + "\n\n")
    assert table_md.count("Analysis of staged's rounds") == 2            # greedy and topk50
    capsys.readouterr()
    assert bench.main(["--render", str(tmp_path / "latest.json"), "--no-png"]) == 0
    printed = capsys.readouterr().out                     # a saved report reprints its table and its analyses
    assert printed.count("Analysis of staged's rounds") == 2
    table = bench.format_table(report["results"])
    assert "staged" in table and "2/2" in table


def test_parse_sampling():
    assert bench.parse_sampling("greedy").greedy
    s = bench.parse_sampling("topk50")
    assert (s.temperature, s.top_k, s.top_p) == (1.0, 50, 1.0)
    s = bench.parse_sampling("temp0.7-topp0.9")
    assert (s.temperature, s.top_k, s.top_p) == (0.7, 0, 0.9)
    for bad in ("topk", "beam4", "temp0"):
        with pytest.raises(ValueError):
            bench.parse_sampling(bad)


@pytest.mark.parametrize("argv, message", [
    (["--limit", "0"], "--limit must be at least 1"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "prompt file not found"),
    (["--strategies", "fast"], "unknown strategy fast"),
    (["--sampling", "beam4"], "unknown sampling"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be in"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--render", "/nonexistent/report.json"], "report not found"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_two_real_humaneval_prompts_on_tiny_models():
    prompts = load_prompts("humaneval", limit=2)
    out = run_bench(tiny_stack(), prompts, ["hf_generate", "baseline", "staged"], ["greedy"],
                    max_new_tokens=6, progress=False, warmup=False)
    assert [r["prompts"] for r in out["results"]] == [2, 2, 2]
    assert {r["prompt"] for r in out["per_prompt"]} == {"HumanEval/0", "HumanEval/1"}
    assert all(r["exact_match"] == 2 for r in out["results"])


def test_repeats_rotate_the_order_and_keep_each_strategys_median_run(monkeypatch):
    from specviz.bench import run as bench_run
    order = []
    real = bench_run.run_strategy

    def spy(stack, strategy, *args, **kwargs):
        order.append(strategy)
        return real(stack, strategy, *args, **kwargs)
    monkeypatch.setattr(bench_run, "run_strategy", spy)
    out = run_bench(tiny_stack(), PROMPTS[:1], ["baseline", "speculative", "staged"], ["greedy"], max_new_tokens=6,
                    progress=False, warmup=False, repeats=3)
    assert order == ["baseline", "speculative", "staged", "speculative", "staged", "baseline",
                     "staged", "baseline", "speculative"]
    for row in out["per_prompt"]:
        times = row["wall_s_repeats"]
        assert len(times) == 3 and row["wall_s"] == pytest.approx(sorted(times)[1], abs=1e-4)
        assert row["repeats_agree"] and row["exact"]


def test_repeats_start_from_one_stored_calibration_and_replay_one_sampled_run(preparing, monkeypatch):
    """Each prompt's repeats of a planned strategy plan from the calibration the earlier prompts stored, and what they
    learnt is stored once: were each repeat to store its own, the next would plan other trees and draw another text."""
    from test_round_plan import cpu_plan
    from specviz.profile import tree_plans
    monkeypatch.setattr(tree_plans, "measure", lambda *a: cpu_plan().to_dict())
    stack = tiny(("draft", "lookup"), WordTokenizer(), plan=None, profile=preparing)
    assert stack.plans.tree_plan() is not None          # the pair's curves are stored: what runs learn is stored too
    stored = []
    real = preparing.learnt
    monkeypatch.setattr(preparing, "learnt", lambda key, value: (stored.append(key), real(key, value)))
    out = run_bench(stack, PROMPTS, ["baseline", "speculative", "staged"], ["topk50"], max_new_tokens=12,
                    progress=False, warmup=False, repeats=3)
    assert len(set(stored)) == 2 and all(stored.count(key) == len(PROMPTS) for key in stored)   # once a prompt each
    sampled = [row for row in out["per_prompt"] if row["strategy"] != "baseline"]
    assert len(sampled) == 4 and all(row["repeats_agree"] for row in sampled)


def test_a_strategy_that_does_not_repeat_itself_is_not_exact():
    from specviz.bench.report import compare_rows
    from specviz.bench.run import median_run
    runs = [{"tokens": [1, 2], "wall_s": 0.3, "target_forwards": 2, "bytes_per_token": None},
            {"tokens": [1, 3], "wall_s": 0.1, "target_forwards": 2, "bytes_per_token": None},
            {"tokens": [1, 2], "wall_s": 0.2, "target_forwards": 2, "bytes_per_token": None}]
    kept = median_run(runs)
    assert kept["wall_s"] == 0.2 and kept["wall_s_repeats"] == [0.3, 0.1, 0.2] and not kept["repeats_agree"]
    base = {"prompt": "p", "sampling": "greedy", "strategy": "baseline", **median_run([runs[0], runs[2]])}
    rows = compare_rows([base, {"prompt": "p", "sampling": "greedy", "strategy": "speculative", **kept}])
    assert [r["exact"] for r in rows] == [True, False]


def test_forward_clock_measures_model_time():
    model = tiny_model("llama", 0)
    clock = bench.ForwardClock([model])
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            model(torch.tensor([[1, 2, 3]]))
            time.sleep(0.2)                         # between forwards: not theirs
            model(torch.tensor([[1, 2, 3]]))
            wall = time.perf_counter() - started
    finally:
        clock.close()
    assert 0 < clock.seconds <= wall - 0.2
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_projection_replays_recorded_decisions_on_tiny_gpt2():
    out = run_bench(tiny_stack(), PROMPTS[:1], ["hf_generate", "baseline", "speculative", "staged"], ["greedy"],
                    max_new_tokens=8, progress=False, warmup=False, projection="tiny")
    projection = out["projection"]
    assert projection["note"].startswith("PROJECTION")
    real = {r["strategy"]: r for r in out["results"]}
    projected = {r["strategy"]: r for r in projection["results"]}
    assert set(projected) == {"baseline", "speculative", "staged"}      # HF rows have nothing to replay
    for name, r in projected.items():
        assert r["tokens_per_s_median"] > 0
        assert r["tokens_per_target_forward"] == pytest.approx(real[name]["tokens_per_target_forward"])
    assert projected["baseline"]["speedup_vs_baseline"] == pytest.approx(1.0)
    assert "PROJECTION" in bench.format_projection(projection)
    assert all(not k.startswith("_") for row in out["per_prompt"] for k in row)
    json.dumps(out)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_replay_projects_recorded_lanes_with_no_model_loaded(tmp_path, compiled):
    """`--replay`: the shipped qwen-coder recordings' decisions (real CPU runs) timed on random Qwen2 models of
    tiny sizes, eager and compiled over static caches; every recorded round is replayed."""
    from specviz.recording import RECORDINGS, load

    files = [RECORDINGS / "cpu-qwen-coder-humaneval0-greedy.json.gz",
             RECORDINGS / "cpu-qwen-coder-humaneval2-topk50.json.gz"]
    files = files[:1] if compiled else files        # compiling is most of the time: one recording shows it
    out = tmp_path / "projection.json"
    assert bench.main(["--replay", *map(str, files), "--projection", "tiny-qwen", "--out", str(out),
                       *(["--compile"] if compiled else [])]) == 0
    projection = json.loads(out.read_text())["projection"]
    assert projection["note"].startswith("PROJECTION") and projection["compiled"] is compiled
    assert (projection["static_cache_entries"] or 0) % 256 == 0 and bool(projection["static_cache_entries"]) is compiled
    rows = {(r["prompt"], r["strategy"]): r for r in projection["per_prompt"]}
    for path in files:
        for strategy, lane in load(path).lanes.items():
            row = rows[(path.name.split(".")[0], strategy)]
            assert row["new_tokens"] == len([t for step in lane.recorded_steps for t in step.committed_tokens])
            assert row["target_forwards"] == len(lane.recorded_steps) and row["tokens_per_s"] > 0
    assert {r["sampling"] for r in projection["results"]} == ({"greedy"} if compiled else {"greedy", "topk50"})


def test_replay_without_a_projection_is_refused_in_one_line(capsys):
    assert bench.main(["--replay", "run.json"]) == 2
    assert capsys.readouterr().err.strip() == "error: --replay needs --projection SIZES (e.g. --projection qwen-coder)"


@pytest.mark.parametrize("name", ["greedy", "topk50", "temp0.7-topp0.9", "temp0.5-topk40-topp0.95", "temp1"])
def test_sampling_names_read_back(name):
    assert bench.sampling_name(bench.parse_sampling(name)) == name


def test_projection_flag():
    parser = bench.build_parser()
    assert parser.parse_args(["--projection"]).projection == "paper"
    assert parser.parse_args(["--projection", "tiny"]).projection == "tiny"
    assert parser.parse_args([]).projection is None


def test_compile_flag_sizes_one_static_cache_and_feeds_every_bucket_before_timing(monkeypatch):
    """The plumbing of `bench --compile`, for the target and the draft model; the real torch.compile is
    exercised in test_compiled.py."""
    from specviz.stack import compiled as stack_compile
    from specviz.backends.choose import BUCKETS

    calls = []

    def counting_compile(model):
        def run(**inputs):
            calls.append((model, inputs["input_ids"].shape[1]))
            return model(**inputs)
        return run

    monkeypatch.setattr(stack_compile, "compile_model", counting_compile)
    stack = tiny_stack()
    out = run_bench(stack, PROMPTS, ["baseline", "staged"], ["greedy"], max_new_tokens=8, progress=False,
                    warmup=False, compile=True)
    assert out["settings"]["compiled"] is True
    assert stack.compiled.static_len is not None and stack.compiled.static_len % 256 == 0
    assert out["settings"]["static_cache_entries"] == stack.compiled.static_len
    target, draft = stack.target.model, stack.loaded["draft"].model
    warm = [(target, size) for size in (1, *BUCKETS)] + [(draft, size) for size in (1, *BUCKETS)]
    assert calls[:len(warm)] == warm       # compile_buckets, before any generation
    timed = calls[len(warm):]
    assert {size for _, size in timed} <= set(BUCKETS)
    assert {model for model, _ in timed} == {target, draft}
    assert all(r["exact_match"] == 2 for r in out["results"])


def test_cost_curve_times_each_size_and_prints_a_table():
    from specviz.profile.cost_curve import cost_curve, format_curve
    curve = cost_curve(tiny_model("llama", 0), sizes=(1, 4, 16), context=20, reps=2)
    assert list(curve) == [1, 4, 16] and all(0 < s < 5 for s in curve.values())
    table = format_curve(curve)
    assert table.splitlines()[2].startswith("1 ") and "1.00" in table.splitlines()[2]
    assert len(table.splitlines()) == 5


def test_cost_curves_of_several_models_take_turns_within_each_round(monkeypatch):
    """The draft probe compares precisions on a machine whose speed drifts: every round times each model."""
    from specviz.backends.choose import KVModel
    from specviz.profile.cost_curve import cost_curves
    models = [tiny_model("llama", 0), tiny_model("llama", 1)]
    order, forward = [], KVModel.forward
    monkeypatch.setattr(KVModel, "forward", lambda self, tokens, *rest: order.append(
        (models.index(self.model), len(tokens))) or forward(self, tokens, *rest))
    curves = cost_curves(models, sizes=(1, 4), context=20, reps=2)
    assert [list(c) for c in curves] == [[1, 4], [1, 4]] and all(0 < s < 5 for c in curves for s in c.values())
    # the prefixes, then rounds: each timed forward after an untimed one-token forward of the same model
    assert order == [(0, 20), (1, 20)] + [(0, 1), (0, 1), (0, 1), (0, 4), (1, 1), (1, 1), (1, 1), (1, 4)] * 2


def test_a_forward_slowed_by_the_larger_one_before_it_is_not_what_the_curve_prices(monkeypatch):
    """On these VMs a forward right after a larger one runs slower (one token after 16: 64 against 59 ms), and most
    forwards of a run follow a one-token forward. A machine whose forward of n tokens takes 10 + 2 (n - 1) ms, and 5 ms
    more right after a larger forward, has the curve 10, 12, 16 ms; timed in turn, the one-token forward would take the
    5 ms (after the previous round's 4) and a second token would look free."""
    from specviz.backends.choose import KVModel
    from specviz.profile import cost_curve as curves
    clock, last, real = [0.0], [1], KVModel.forward

    def forward(self, tokens, *rest):
        n = len(tokens)
        clock[0] += 0.010 + 0.002 * (n - 1) + (0.005 if last[0] > n else 0.0)
        last[0] = n
        return real(self, tokens, *rest)
    monkeypatch.setattr(KVModel, "forward", forward)
    monkeypatch.setattr(curves, "perf_counter", lambda: clock[0])
    curve = curves.cost_curve(tiny_model("llama", 0), sizes=(1, 2, 4), context=20, reps=3)
    assert curve == pytest.approx({1: 0.010, 2: 0.012, 4: 0.016})


def test_cost_curve_flag_writes_json(tmp_path, capsys):
    from tiny import save_with_word_tokenizer

    from specviz.profile.cost_curve import SIZES
    save_with_word_tokenizer(tiny_model("llama", 0), tmp_path / "model")
    # float32 named: `auto` would time the probe layer in every precision first (this worker's one thread is a
    # machine of its own to the profile), which is not what this test is about
    assert bench.main(["--cost-curve", "--target", str(tmp_path / "model"), "--dtype", "float32",
                       "--out", str(tmp_path / "c.json")]) == 0
    report = json.loads((tmp_path / "c.json").read_text())
    assert list(report["seconds_per_forward"]) == [str(n) for n in SIZES]
    assert "tokens fed" in capsys.readouterr().out


def test_the_bench_data_loads_the_prompt_sets_and_the_decisions_the_gpu_projection_replays():
    """specviz/bench/data/: the held-out and tuning prompts the documented commands name, and the recorded CPU
    runs scripts/gpu_projection.sh replays (every lane a projection needs: baseline, speculative, tree, staged)."""
    from pathlib import Path

    from specviz.recording import load

    data = Path(bench.__file__).parent / "data"
    assert [p.id for p in load_prompts(str(data / "heldout_humaneval_136_143.jsonl"))] == [
        f"HumanEval/{i}" for i in range(136, 144)]
    assert len(load_prompts(str(data / "tuning_humaneval_20_25.jsonl"))) == 6
    decisions = sorted((data / "decisions").glob("*.json.gz"))
    assert len(decisions) == 8
    for path in decisions:
        assert {"baseline", "speculative", "tree", "staged"} <= set(load(path).lanes), path.name


def test_the_no_regret_line_names_each_prompt_a_speculating_strategy_ran_slower_on_than_plain_decoding():
    from specviz.bench.report import NO_REGRET, lowest, regret_line

    def result(strategy, ratios):
        rows = [{"prompt": f"prose/{i}", "speedup_vs_baseline": r} for i, r in enumerate(ratios)]
        return {"strategy": strategy, "sampling": "greedy", "lowest_vs_baseline": lowest(rows)}
    calm = [result("baseline", [1.0, 1.0]), result("speculative", [1.3, 0.99]), result("staged", [1.4, NO_REGRET])]
    assert calm[2]["lowest_vs_baseline"] == {"ratio": NO_REGRET, "prompt": "prose/1"}
    assert regret_line(calm).startswith("no regret")
    sore = calm[:2] + [result("staged", [1.4, 0.74])]
    assert regret_line(sore) == ("regret: under 0.97x our baseline on at least one prompt: staged (greedy) 0.74x on "
                                 "prose/1")
    assert regret_line([result("baseline", [1.0])]) == ""


def test_the_bench_feeds_plain_language_as_chat_and_code_as_written_unless_told(tmp_path, capsys):
    """As the app and the CLI: each prompt's default format, or the one --prompt-format names for all."""
    from tiny import WORD_CHAT_TEMPLATE, save_with_word_tokenizer

    save_with_word_tokenizer(tiny_model("llama", 0), tmp_path / "model", WORD_CHAT_TEMPLATE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w5 w6 w7"}) + "\n" + json.dumps({"prompt": "w5(w6)"}) + "\n")

    def report(*extra):
        out = tmp_path / "report.json"
        assert bench.main(["--target", str(tmp_path / "model"), "--draft", "lookup", "--dtype", "float32",
                           "--prompts", str(prompts), "--strategies", "baseline", "--sampling", "greedy",
                           "--max-new-tokens", "2", "--no-png", "--no-progress", "--out", str(out), *extra]) == 0, \
            capsys.readouterr().err[-2000:]
        return json.loads(out.read_text())

    mixed = report()
    assert mixed["settings"]["prompt_formats"] == {"chat": 1, "completion": 1}
    assert sorted(row["prompt_tokens"] for row in mixed["per_prompt"]) == [4, 6]     # "w5(w6)" as written; w1 ... w3
    written = report("--prompt-format", "completion")
    assert written["settings"]["prompt_formats"] == {"completion": 2}
    assert sorted(row["prompt_tokens"] for row in written["per_prompt"]) == [3, 4]
