"""llama.cpp as a peer and the reference, on the shipped SmolLM2 GGUF file (tiny and fast): its programs' output
and clocks, the bench rows, the race lanes, the reference label, and one line where llama.cpp is missing."""
import json

import pytest
from test_cli import in_process

from specviz.peers import llama_cpp
from specviz.app import settings as app_settings
from specviz.app import words
from specviz.app.race import COMPARED, Race
from specviz.bench import run_bench
from specviz.stack.presets import load_preset
from specviz.bench.prompts import Prompt
from specviz.decode.sampling import Sampling

PROMPT = 'def running_max(values: list[int]) -> list[int]:\n    """Return the running maximum of values."""\n'
GGUF = llama_cpp.gguf_file("smollm2-135m")
pytestmark = pytest.mark.slow            # llama.cpp's programs on the real SmolLM2 file, and the model itself


@pytest.fixture(scope="module")
def self_drafted():
    """SmolLM2 drafting for itself: the one stack whose target and draft are both GGUF files offline."""
    return load_preset("offline", "float32", drafts=["smollm2-135m"])


def test_the_stacks_gguf_files_are_found():
    assert GGUF is not None and GGUF.suffix == ".gguf" and GGUF.is_file()
    assert llama_cpp.gguf_file("assets/draft") is None and llama_cpp.gguf_file(None) is None
    assert llama_cpp.program("llama-completion") is not None, "setup builds llama.cpp into .venv/llama.cpp"


def test_plain_decoding_streams_its_text_on_its_own_clock():
    run = llama_cpp.generate(llama_cpp.PLAIN, GGUF, PROMPT, Sampling(), 12, 2)
    assert run.new_tokens == 12 == run.target_forwards and run.drafted is None
    assert "".join(piece for _, piece in run.chunks) == run.text and run.text.strip()
    assert not run.text.startswith(PROMPT)                      # the prompt's echo is removed
    times = [t for t, _ in run.chunks]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= run.seconds + 1e-9   # on its clock


def test_a_run_that_stops_at_the_models_end_of_text_keeps_no_end_marker():
    """Without --ignore-eos (the app's race) llama-completion ends its output with " [end of text]": not the model's
    text."""
    log = "prompt eval time =      10.00 ms\n       eval time =      20.00 ms /     3 runs\n"
    raw = [(0.5, PROMPT.encode() + b"abc"), (0.7, b"d [end of text]\n")]
    run = llama_cpp._parse(llama_cpp.PLAIN, raw, log, PROMPT)
    assert run.text == "abcd" and "".join(piece for _, piece in run.chunks) == "abcd" and run.new_tokens == 4
    assert "--ignore-eos" not in _args_of(stop_at_end=True) and "--ignore-eos" in _args_of(stop_at_end=False)


def _args_of(**kw) -> list[str]:
    """The command line generate() runs, caught before it runs."""
    seen = []
    def catch(args):
        seen.extend(args)
        raise llama_cpp.LlamaCppMissing("caught")
    original, llama_cpp._run = llama_cpp._run, catch
    try:
        with pytest.raises(llama_cpp.LlamaCppMissing):
            llama_cpp.generate(llama_cpp.PLAIN, GGUF, PROMPT, Sampling(), 4, 2, **kw)
    finally:
        llama_cpp._run = original
    return seen


def test_its_own_speculation_drafts_and_verifies():
    run = llama_cpp.generate(llama_cpp.SPECULATIVE, GGUF, PROMPT, Sampling(), 16, 2, draft_gguf=GGUF)
    assert run.new_tokens >= 16 and 0 < run.accepted <= run.drafted
    assert run.target_forwards == run.new_tokens - run.accepted < run.new_tokens   # a model drafting for itself


def test_sampling_is_passed_as_ours_with_nothing_else_in_the_chain():
    assert llama_cpp.sampling_args(Sampling()) == ["--temp", "0"]
    assert llama_cpp.sampling_args(Sampling(1.0, 50, 1.0, 7)) == ["--temp", "1.0", "--top-k", "50", "--top-p", "1.0",
                                                                  "--min-p", "0", "--seed", "7"]


def test_bench_rows_and_the_reference(self_drafted):
    report = run_bench(self_drafted, [Prompt("p", PROMPT)], ["llama_cpp", "llama_cpp_speculative", "baseline"],
                       ["greedy"], max_new_tokens=10, progress=False, warmup=False)
    rows = {r["strategy"]: r for r in report["results"]}
    assert set(rows) == {"llama_cpp", "llama_cpp_speculative", "baseline"} and not report["settings"]["notes"]
    assert report["reference"]["strategy"] == "llama_cpp" and "llama-completion" in report["reference"]["what"]
    assert report["reference"]["tokens_per_s"] == rows["llama_cpp"]["tokens_per_s_median"]
    assert rows["llama_cpp"]["speedup_vs_reference"] == pytest.approx(1.0)
    base = rows["baseline"]
    reference = rows["llama_cpp"]["tokens_per_s_median"]
    assert base["speedup_vs_reference"] == pytest.approx(base["tokens_per_s_median"] / reference)
    assert all(r["exact_match"] in (0, 1) for r in rows.values()) and base["exact_match"] == 1
    assert rows["llama_cpp_speculative"]["tokens_per_target_forward"] > 1.0
    assert all(row["new_tokens"] == 10 for row in report["per_prompt"])


def test_the_race_runs_llama_cpp_lanes_and_says_where_the_reference_stands():
    settings = app_settings.parse_settings(PROMPT, "staged", "offline", "", "", "greedy", 0.0, 0, 1.0, 0, 8, "dynamic",
                                           4, 4, 3, 10)
    race = Race.start(settings)
    assert "llama_cpp" in race.peers and "GGUF draft" in race.skipped["llama_cpp_speculative"]
    assert COMPARED[0] == "llama_cpp" and set(race.lanes()) == set(COMPARED) - {"llama_cpp_speculative"}
    while not race.finished:
        race.step()
    table = race.table_stats()
    assert len(race.peers["llama_cpp"].new_tokens) == 10
    assert "vs reference (llama.cpp plain" in words.compare_table_md(table, race.precision)
    assert race.precision in words.compare_table_md(table, race.precision)
    note = words.reference_note(table)
    assert f"{table['llama_cpp']['tokens_per_s']:.1f}" in note
    assert note.startswith("No strategy of ours beats the reference") or " beats the reference" in note


def test_the_reference_note_tells_who_beats_whom():
    slow, fast = {"tokens_per_s": 5.0}, {"tokens_per_s": 20.0}
    assert words.reference_note({"llama_cpp": fast, "staged": slow}).startswith("No strategy of ours beats")
    assert "more cores, bf16 or AMX units, a GPU" in words.reference_note({"llama_cpp": fast, "staged": slow})
    assert words.reference_note({"llama_cpp": slow, "staged": fast}).startswith("staged beats the reference")
    assert "No speculation beat" in words.reference_note({"llama_cpp": slow, "baseline": fast, "staged": slow})
    assert "No speculation beat" not in words.reference_note({"llama_cpp": slow, "baseline": slow, "staged": fast})
    assert words.reference_note({"staged": fast}).startswith("No reference in this race")


def test_without_llama_cpp_the_rows_lanes_and_cli_say_so_in_one_line(tmp_path, monkeypatch, self_drafted):
    monkeypatch.setenv(llama_cpp.DIR_ENV, str(tmp_path))            # a folder without its programs
    report = run_bench(self_drafted, [Prompt("p", PROMPT)], ["llama_cpp", "baseline"], ["greedy"],
                       max_new_tokens=4, progress=False, warmup=False)
    assert [r["strategy"] for r in report["results"]] == ["baseline"]
    assert report["settings"]["notes"] == [f"llama_cpp skipped: {llama_cpp.missing_reason('llama_cpp', GGUF, GGUF)}"]
    assert "not installed here" in report["settings"]["notes"][0] and report["reference"]["strategy"] == "baseline"
    result = in_process("--prompt", PROMPT, "--strategy", "baseline", "--max-new-tokens", "4", "--dtype", "float32",
                        "--json", reference=True)
    assert result.returncode == 0, result.stderr[-1000:]
    out = json.loads(result.stdout)
    assert out["reference"]["tokens_per_s"] is None and "not installed here" in out["reference"]["how"]
    assert out["speedup_vs_reference"] is None


def test_the_cli_gives_its_speed_against_the_reference():
    result = in_process("--prompt", PROMPT, "--strategy", "staged", "--max-new-tokens", "8", "--dtype", "float32",
                        reference=True)
    assert result.returncode == 0, result.stderr[-1000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("reference: llama.cpp plain decoding (llama-completion) of the same GGUF file, ")
    assert "x the reference" in line


def test_llama_bench_gives_its_cost_curve():
    curve = llama_cpp.cost_curve(GGUF, 2, sizes=(1, 4), repeats=1)
    # no order between the two, and no bounds: one repeat on a 135M model is noise-bound (CI once timed 1 token at
    # 51 ms, 4 at 33); the units are the parser's, checked below on llama-bench's own row format
    assert set(curve) == {1, 4}


def test_llama_bench_rows_read_as_seconds_per_forward():
    rows = ('[{"n_prompt": 1, "n_gen": 0, "avg_ns": 51000000, "avg_ts": 19.6},'
            ' {"n_prompt": 4, "n_gen": 0, "avg_ns": 80000000, "avg_ts": 50.0}]')
    assert llama_cpp.curve_of(rows) == {1: pytest.approx(0.051), 4: pytest.approx(0.080)}


def test_the_regime_panel_draws_ours_llama_cpp_and_each_precision(self_drafted, monkeypatch):
    from specviz.app import regime

    # each precision's probe layer as made-up seconds: the panel draws whatever was measured (the real probe is
    # tests/test_presets.py's), and a worker that has not timed it yet would take a minute here
    monkeypatch.setattr(regime, "probe_seconds",
                        lambda name, profile: {n: 0.01 * (1 + n / 8) for n in (1, 2, 4, 8, 16)})
    view = regime.regime_view(self_drafted)
    precisions = regime.probed_precisions()
    assert "gguf" in precisions and set(view["probes"]) == set(precisions)
    assert set(view["ours"]) == set(view["llama"]) == set(regime.SIZES)
    figure = regime.regime_figure(view)
    assert len(figure.data) == 2 + 2 + len(precisions)              # two guides, ours, llama.cpp, each precision
    assert all(trace.y[0] == 1.0 for trace in figure.data)          # costs relative to one token
    text = regime.regime_md(view)
    need = regime.break_even(view["ours"], view["llama"][1])
    assert text.count("Analysis (from these curves") == 1 and f"{need[16]:.1f} tokens at k = 16" in text
    assert "llama.cpp on the same GGUF file" in text and "more cores, bf16 or AMX units" in text
    assert "planned" not in text                                    # a stack that cannot run staged plans no tree
    assert "live models" in regime.regime_md(None) and not regime.regime_figure(None).data


def test_break_even_is_the_verification_cost_in_reference_tokens():
    from specviz.app import regime
    assert regime.break_even({1: 0.06, 4: 0.105}, 0.035) == pytest.approx({1: 0.06 / 0.035, 4: 3.0})


def test_a_program_that_hangs_is_stopped_with_one_line(tmp_path, monkeypatch):
    hanging = tmp_path / "llama-completion"
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    hanging.chmod(0o755)
    monkeypatch.setenv(llama_cpp.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(llama_cpp, "TIMEOUT_S", 1)
    with pytest.raises(llama_cpp.LlamaCppMissing, match="^llama-completion ran past 1 s and was stopped$"):
        llama_cpp.generate(llama_cpp.PLAIN, GGUF, PROMPT, Sampling(), 4, 2)
