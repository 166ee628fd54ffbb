"""The app's plain-Python half: settings, words, sessions, the race and the panels, on recorded traces
and tiny random models (fast). The running app in a real browser and through its API: test_browser.py.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from tiny import WordTokenizer

from specviz.peers import llama_cpp
from specviz.app import bench_panel, captions, stacks, words
from specviz.app import settings as app_settings
from specviz.app.race import COMPARED, ENGINE_LANES, IN_TURN, ONE_AFTER_ANOTHER, SHOWN, TIMING, Race, time_lanes
from specviz.app.sessions import Session
from specviz.stack.strategies import default_tree
from specviz.decode.trace import RunRecord

DATA = Path(__file__).resolve().parent / "data"
SETTINGS = dict(prompt="def add(a, b):\n", strategy="tree", preset=app_settings.OFFLINE_DEFAULT, target="", drafts="",
                sampling_mode="greedy", temperature=1.0, top_k=50, top_p=1.0, seed=0, budget=12, shape="auto",
                max_depth=8, max_branch=4, lookup=10, max_new_tokens=16, prompt_format="completion")


def controls(**change) -> list:
    """The page's control values for SETTINGS (with changes), as a handler receives them."""
    values = {**SETTINGS, **change}
    return [values[name] for name in app_settings.SETTING_NAMES]


@pytest.fixture(scope="module")
def greedy():
    return {k: RunRecord.from_dict(v) for k, v in json.loads((DATA / "greedy_runs.json").read_text()).items()}


# -- helpers, no browser -----------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt="x" * (app_settings.MAX_PROMPT_CHARS + 1)), "too long"),
    (dict(strategy="fastest"), "Unknown strategy"),
    (dict(max_new_tokens=0), "max new tokens must be between"),
    (dict(max_new_tokens=10**6), "max new tokens must be between"),
    (dict(budget="lots"), "tree budget must be a number"),
    (dict(sampling_mode="sample", temperature=-1), "temperature must be between"),
    (dict(sampling_mode="sample", top_p=0), "top-p must be between"),
    (dict(shape="spiral"), "Unknown tree shape"),
    (dict(lookup=-1), "context lookup tokens must be between"),
    (dict(preset=app_settings.CUSTOM, target=""), "need a target model id"),
    (dict(preset="gpt-17"), "Unknown model preset"),
])
def test_bad_settings_give_one_clear_message(change, message, monkeypatch):
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    with pytest.raises(app_settings.UserError, match=message):
        app_settings.parse_settings(**{**SETTINGS, **change})


def test_handlers_map_the_controls_by_name():
    assert set(app_settings.SETTING_NAMES) == set(SETTINGS)
    assert app_settings.settings_of_values(controls(lookup=6)).tree.lookup == 6
    with pytest.raises(ValueError):
        app_settings.settings_of_values(controls()[:-1])          # a control missing is an error, not a shift


def test_settings_turn_into_engine_settings(monkeypatch):
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    s = app_settings.parse_settings(**{**SETTINGS, "strategy": "speculative", "budget": 5})
    assert (s.tree.shape, s.tree.budget, s.tree.max_depth) == ("chain", 5, 5)
    s = app_settings.parse_settings(**{**SETTINGS, "sampling_mode": "sample", "temperature": 0.7, "top_k": 50,
                                       "seed": 3})
    assert (s.sampling.temperature, s.sampling.top_k, s.sampling.seed) == (0.7, 50, 3)
    assert app_settings.parse_settings(**SETTINGS).sampling.greedy
    custom = app_settings.parse_settings(**{**SETTINGS, "preset": app_settings.CUSTOM, "target": " org/model ",
                                       "drafts": "org/draft, trigram"})
    assert custom.stack_key() == (app_settings.CUSTOM, "org/model", ("org/draft", "trigram"))
    assert app_settings.parse_settings(**SETTINGS).stack_key() == ("offline",)
    assert app_settings.parse_settings(**{**SETTINGS, "lookup": 6}).tree.lookup == 6
    assert app_settings.parse_settings(**SETTINGS).tree.min_score == default_tree("tree").min_score > 0


def test_context_lookup_goes_to_staged_only(tiny_default):
    stack = tiny_default()
    settings = app_settings.parse_settings(**{**SETTINGS, "prompt": "a b a b a", "lookup": 6})
    staged, tree = (stacks.new_decoder(stack, settings, name) for name in ("staged", "tree"))
    assert staged.spec.lookup == 6 and staged.stages[-1].kind == "lookup"
    assert tree.spec.lookup == 0 and all(s.kind != "lookup" for s in tree.stages)


def test_a_model_that_cannot_load_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    monkeypatch.setenv("SPECVIZ_MODEL_DIRS", str(tmp_path))
    with pytest.raises(app_settings.UserError, match="Could not load the models: .*not found"):
        stacks.get_stack((app_settings.CUSTOM, str(tmp_path / "missing.gguf"), ()))


def test_custom_models_are_off_unless_the_operator_turns_them_on(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECVIZ_ALLOW_CUSTOM_MODELS", raising=False)
    read = []
    monkeypatch.setattr(stacks.Stack, "load", lambda *a, **k: read.append(a))      # must never be reached
    assert app_settings.CUSTOM not in app_settings.preset_names()
    custom = {**SETTINGS, "preset": app_settings.CUSTOM, "target": "/etc"}
    with pytest.raises(app_settings.UserError, match="^Custom models are disabled on this server; pick a preset.$"):
        app_settings.parse_settings(**custom)
    with pytest.raises(app_settings.UserError, match="disabled on this server"):
        stacks.get_stack((app_settings.CUSTOM, "/etc", ()))
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    assert app_settings.CUSTOM in app_settings.preset_names() and app_settings.parse_settings(**custom).target == "/etc"
    with pytest.raises(app_settings.UserError, match="Local model paths are disabled"):
        stacks.get_stack((app_settings.CUSTOM, "/etc", ()))
    monkeypatch.setenv("SPECVIZ_MODEL_DIRS", str(tmp_path / "models"))
    for outside in ("/etc", str(tmp_path / "models" / ".." / "secret.gguf"), "~/x.gguf"):
        with pytest.raises(app_settings.UserError, match="outside the model directories"):
            stacks.get_stack((app_settings.CUSTOM, outside, ()))
    with pytest.raises(app_settings.UserError, match="outside the model directories"):
        stacks.get_stack((app_settings.CUSTOM, str(tmp_path / "models" / "ok.gguf"), ("/etc/passwd.npz",)))
    assert read == []


def test_hub_models_are_size_checked_before_any_download(monkeypatch):
    import specviz.app.server_policy as policy
    monkeypatch.setenv("SPECVIZ_ALLOW_CUSTOM_MODELS", "1")
    monkeypatch.setenv("SPECVIZ_MAX_MODEL_BYTES", "1e9")
    monkeypatch.setattr(policy, "hub_weight_bytes", lambda repo: 7_000_000_000)
    monkeypatch.setattr(stacks.Stack, "load", lambda *a, **k: pytest.fail("loaded a model over the limit"))
    with pytest.raises(app_settings.UserError, match=r"'big/model' has 7.0 GB of weights; .* at most 1.0 GB"):
        stacks.get_stack((app_settings.CUSTOM, "big/model", ("lookup",)))

    def offline(repo):
        raise OSError("no network")
    monkeypatch.setattr(policy, "hub_weight_bytes", offline)
    with pytest.raises(app_settings.UserError, match="Could not check the size of 'org/model' on the hub"):
        stacks.get_stack((app_settings.CUSTOM, "org/model", ()))
    with pytest.raises(app_settings.UserError, match="neither a hub id"):
        stacks.get_stack((app_settings.CUSTOM, "not a model id!", ()))


def test_captions_say_what_happened(greedy):
    base = captions.step_caption(greedy["baseline"].steps[0])
    assert "plain decoding" in base and "one next token" in base
    for step in greedy["tree"].steps + greedy["staged"].steps:
        caption = captions.step_caption(step)
        assert f"guessed {len(step.nodes) - 1} tokens ahead" in caption
        assert f"{len(step.committed_tokens)} new token" in caption
        assert "one target pass" in caption
    saving = next(s for s in greedy["staged"].steps if len(s.committed_tokens) > 1)
    said = captions.step_caption(saving)
    assert "saved." in said and "plain decoding would have needed" in said
    assert "min(1, p/q)" in captions.step_caption(saving, greedy=False)


def test_text_is_coloured_by_the_producing_stage(greedy):
    run = greedy["staged"]
    page = words.text_html("PROMPT<", run.steps, run.steps[0].stages)
    assert "PROMPT&lt;" in page                                  # escaped prompt
    assert page.count('class="tok" data-stage') == len(run.tokens)
    for stage, colour in enumerate(["#D55E00", "#0072B2"]):
        if any(stage in s.committed_stage for s in run.steps):
            assert f'data-stage="{stage}" style="background:{colour}' in page
    assert "Who produced each token" in page
    assert "outline" in page                                      # the latest step stands out


def test_counters_and_compare_table(greedy):
    stats = {k: greedy[k].stats for k in ("baseline", "speculative", "staged")}
    counters = words.counters_md(stats["staged"], 14, finished=True)
    assert "Tokens per target pass" in counters and "finished" in counters
    table = words.compare_table_md(stats)
    assert table.count("\n") == 2 + len(stats) - 1 and "| baseline |" in table and "1.00×" in table


BENCH = {"machine": "m", "date": "d", "command": "python -m specviz.bench", "results": [
    {"strategy": "staged", "sampling": "greedy", "tokens_per_s_median": 12.5, "speedup_vs_hf_generate": 2.0,
     "tokens_per_target_forward": None, "bytes_relative_to_baseline": 0.3, "phase_share": None,
     "exact_match": 3, "prompts": 3}]}


def test_benchmark_results_are_optional(tmp_path):
    assert bench_panel.load_benchmark(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert bench_panel.load_benchmark(tmp_path / "bad.json") is None
    assert "No benchmark results yet" in bench_panel.benchmark_md(None)
    (tmp_path / "latest.json").write_text(json.dumps(BENCH))
    md = bench_panel.benchmark_md(bench_panel.load_benchmark(tmp_path / "latest.json"))
    assert "| staged | greedy | 12.5 | 2.00× | – | 0.30× | 3 / 3 |" in md
    assert md.startswith("A saved benchmark run of this stack, not the race above: ")


def test_the_benchmark_panel_shows_only_a_run_of_the_stack_on_screen():
    """A saved run of another stack answers nothing about the race above it: the panel then says how to make one."""
    offline = {**BENCH, "settings": {"target": "smollm2-135m", "drafts": list(bench_panel.stack_of("offline")[1])}}
    assert bench_panel.benchmark_for("offline", offline) is offline
    assert "| staged | greedy | 12.5 |" in bench_panel.panel_md("offline", offline)
    assert bench_panel.benchmark_for("qwen-coder", offline) is None
    line = bench_panel.panel_md("qwen-coder", offline)
    assert "No saved benchmark of this stack (qwen-coder)" in line
    assert "python -m specviz.bench --preset qwen-coder" in line
    assert "12.5" not in line and bench_panel.benchmark_for("offline", None) is None


def test_the_benchmark_panel_names_its_stack_machine_and_date():
    ran = datetime(2026, 11, 23, 9, 32).strftime("%Y-%m-%d %H:%M UTC")      # as specviz.bench writes the date
    bench = {**BENCH, "machine": "AMD EPYC, 2 cores", "date": ran,
             "settings": {"target": "smollm2-135m", "drafts": ["assets/draft", "trigram"], "precision": "float32",
                          "prompts": 10, "max_new_tokens": 48}}
    assert bench_panel.benchmark_label(bench) == ("A saved benchmark run of this stack, not the race above: "
                                                  "smollm2-135m + assets/draft + trigram in float32, 10 prompts × 48 "
                                                  f"new tokens, on AMD EPYC, 2 cores, {ran}.")


def test_example_prompts_include_humaneval_and_plain_language():
    examples = app_settings.example_prompts()
    assert any(name.startswith("HumanEval") for name in examples)
    assert any(not name.startswith("HumanEval") for name in examples)
    assert all(text.strip() for text in examples.values())


# -- sessions and the race on tiny random models -------------------------------------------------------

def test_a_stacks_first_race_is_timed_after_its_lanes_ran_once_untimed(tiny_default, monkeypatch):
    """A process's first forwards pack blocks and fault pages in: untimed, once per loaded stack, each of our lanes
    decodes 2 tokens before the first race (else the first lane timed pays for every lane)."""
    from specviz.app import race as race_module
    made = []
    def counting(stack, settings, strategy=None, prefilled=None):
        made.append((strategy, settings.max_new_tokens))
        return new_decoder(stack, settings, strategy, prefilled)
    new_decoder = race_module.new_decoder
    monkeypatch.setattr(race_module, "new_decoder", counting)
    tiny_default()
    settings = app_settings.parse_settings(**{**SETTINGS, "max_new_tokens": 5})
    Race.start(settings, ENGINE_LANES)
    assert made == [(lane, 2) for lane in ENGINE_LANES] + [(lane, 5) for lane in ENGINE_LANES]
    made.clear()
    Race.start(settings, ENGINE_LANES)
    assert made == [(lane, 5) for lane in ENGINE_LANES]          # warm once per stack
    tiny_default()                                               # another stack loaded: warmed again
    Race.start(settings, ENGINE_LANES)
    assert [n for _, n in made[3:]] == [2, 2, 2, 5, 5, 5]


def test_the_race_times_each_step_alone_ours_in_turn_then_replays_them_at_their_own_times(tiny_default):
    tiny_default()
    settings = app_settings.parse_settings(**{**SETTINGS, "max_new_tokens": 10})
    timing, reports = time_lanes(settings), []
    while True:
        try:
            reports.append(next(timing))
        except StopIteration as done:
            timed = done.value
            break
    ours = [lane for lane in COMPARED if lane not in llama_cpp.PEERS]
    assert list(timed.lanes()) == ours and set(timed.skipped) == set(llama_cpp.PEERS)   # tiny models are no GGUF files
    assert all("GGUF" in why for why in timed.skipped.values())
    # the peers one after another, each to its end; ours a step each in turn, always the one whose own clock
    # (its set-up, then its steps' times) shows the least time so far
    assert [r.lane for r in reports if not r.together] == [lane for lane in COMPARED if lane not in ENGINE_LANES]
    turns = [r.lane for r in reports if r.together][1:]
    taken = {lane: 0 for lane in ENGINE_LANES}
    def clock(lane):
        decoder = timed.decoders[lane]
        return timed.setup_s[lane] + sum(s.wall_s for s in decoder.steps[: taken[lane] - 1]) if taken[lane] else 0.0
    for lane in turns:
        pending = [other for other in ENGINE_LANES if taken[other] <= len(timed.decoders[other].steps)]
        assert lane == min(pending, key=clock), (lane, {other: clock(other) for other in pending})
        taken[lane] += 1
    assert all(taken[lane] == len(timed.decoders[lane].steps) + 1 for lane in ENGINE_LANES)
    assert sum(a != b for a, b in zip(turns, turns[1:])) > len(ENGINE_LANES)          # interleaved, not one by one
    assert [r.tokens for r in reports if r.lane == "baseline"] == [0, 0, *range(1, 11)]   # its progress, step by step
    assert set(reports[-1].done) == set(COMPARED[:-1]) and timed.finished
    assert timed.same_text() and not timed.differing()        # greedy: HF assisted writes the same text too
    race = timed.replay()
    peer = race.peers["hf_assisted"]
    assert not race.finished and peer.shown == 0 and all(not lane.steps for lane in race.decoders.values())
    assert peer.chunks and all(a <= b for (a, _), (b, _) in zip(peer.chunks, peer.chunks[1:]))
    first = min(race.next_time(name) for name in race.lanes())
    assert race.advance_to(first / 2) == 0 and race.advance_to(first) >= 1
    assert race.advance_to(race.duration()) > 0 and race.finished         # the slowest lane's time shows them all
    assert race.duration() == max(timed.elapsed(name) for name in timed.lanes())
    for name in race.lanes():
        assert race.elapsed(name) == pytest.approx(timed.elapsed(name))    # replayed at the times it was timed
    assert all(len(lane.new_tokens) == 10 for lane in race.lanes().values())
    stats, table = race.stats(), race.table_stats()
    assert "hf_assisted" not in stats and set(table) == set(ours) and table == timed.table_stats()
    assert stats["baseline"]["tokens_per_target_forward"] == 1.0
    assert stats["staged"]["tokens_per_target_forward"] >= 1.0
    assert table["hf_assisted"]["wall_s"] == peer.chunks[-1][0] and table["hf_assisted"]["new_tokens"] == 10
    assert table["baseline"]["wall_s"] >= stats["baseline"]["wall_s"]          # its clock includes the prefill
    assert "speculative" in words.race_column_html("speculative", race.decoders["speculative"], table["speculative"])
    column = words.race_column_html("hf_assisted", peer, table["hf_assisted"], body="<b>x</b>")
    assert "done ✓" in column and "&lt;b&gt;x&lt;/b&gt;" in column
    assert "| hf_assisted |" in words.compare_table_md(table)
    # what this test checks is what the page says: the help, the verdict's fold and the recordings, in race.py's words
    from specviz.app.texts import HELP
    for said in (HELP["compare"].more, words.TIMED_ALONE, TIMING):
        assert IN_TURN in said and ONE_AFTER_ANOTHER in said


def test_the_panels_explain_the_race_and_sample_the_next_token(tiny_default):
    """Why it is fast: measured and predicted tokens per pass for each speculating lane, from the race's
    traces. Is it lossless: plain and staged samples of the next token with their chi-square tests, or
    under greedy the race's lanes compared token by token."""
    from specviz.app import compare_events, events, panels

    tiny_default()
    session = Session()
    list(compare_events.on_compare(session, *controls(max_new_tokens=12)))
    view = panels.speed_view({name: lane.steps for name, lane in session.race.decoders.items()})
    assert set(view["explained"]) == {"speculative", "staged"}
    for e in view["explained"].values():
        assert e.tokens_measured >= 1.0 and e.tokens_predicted >= 1.0 and e.speedup_measured > 0
    drafted = [step for step in session.race.decoders["speculative"].steps if len(step.nodes) > 1]
    guesses = sum(len(step.nodes) - 1 for step in drafted) / len(drafted)     # its chain planned round by round
    assert f"| speculative | {guesses:.1f} |" in panels.speed_md(view)
    *_, figure, summary, regime_figure, regime_text = compare_events.render_race(session, "")
    assert "tokens per pass" in summary and len(figure.data) >= 3
    assert "the target is no GGUF file" in regime_text and len(regime_figure.data) >= 3    # measured on the tiny target
    assert "planned from this curve" in regime_text and "0.10, 0.10" in regime_text      # staged's plan (tests/tiny.py)

    greedy = list(events.on_lossless(session, 20, *controls()))
    assert "all 12 tokens identical" in greedy[-1][-1] and "baseline" not in greedy[-1][-1].split("\n", 1)[1]
    sampled = controls(strategy="staged", sampling_mode="sample", max_new_tokens=4)
    updates = list(events.on_lossless(session, 40, *sampled))
    session_, status, figure, summary = updates[-1]
    assert status == "Sampled 40 next tokens per lane." and "plain 40/40, staged 40/40" in summary
    assert summary.count("p = ") == 3 and [t.name for t in figure.data][0] == "target's exact probability"
    errors = list(events.on_lossless(session, "many", *sampled))
    assert "samples must be a number" in errors[-1][1]


def sentences(text: str) -> list[str]:
    return [part for part in re.split(r"(?<=[.!?])\s+(?=[*A-Z])", text.strip()) if part]


def test_each_view_shows_two_sentences_of_help_and_none_says_what_the_code_no_longer_does():
    from specviz.app.texts import HELP
    assert set(HELP) >= {"intro", "tree", "text", "accept", "compare", "charts", "lossless"}
    for view, help in HELP.items():
        assert 1 <= len(sentences(help.shown)) <= 2, (view, sentences(help.shown))
    every = " ".join(h.shown + " " + h.more for h in HELP.values()) + words.TIMED_ALONE + TIMING
    assert "alone, one after another, to its end" not in every     # our lanes take steps in turn (the test above)
    compare = HELP["compare"].shown + HELP["compare"].more
    assert all(name in compare.replace("*", "").replace("llama.cpp", "llama_cpp") or name.replace("_", ".") in compare
               for name in ("baseline", "speculative", "staged"))
    assert "llama_cpp" in HELP["compare"].more and "hf_assisted" in HELP["compare"].more
    assert "stops at the model's end of text" in HELP["compare"].more     # tests/test_end_tokens.py


def test_a_space_with_the_qwen_coder_files_runs_that_pair_live(monkeypatch):
    from specviz.stack import presets

    monkeypatch.setattr(presets, "qwen_coder_installed", lambda: True)
    monkeypatch.setattr(presets, "predicted_token_seconds", lambda profile: 9.9)      # a slow shared CPU
    monkeypatch.setattr(presets, "memory_bytes", lambda: 32 * 2**30)
    monkeypatch.delenv(presets.PRESET_ENV, raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    stacks.default_choice.cache_clear()
    try:
        assert stacks.default_choice() == ("qwen-coder", "the pair the recording shows, installed from this Space's "
                                                         "requirements")
        monkeypatch.delenv("SPACE_ID")
        stacks.default_choice.cache_clear()
        preset, why = stacks.default_choice()        # elsewhere the probe decides, and the page says why
        assert preset == "offline" and "9.90 s a token" in why
    finally:
        stacks.default_choice.cache_clear()


def test_a_space_opens_on_a_recorded_step_and_race(monkeypatch):
    from specviz.app import compare_events, replay_events

    monkeypatch.setattr(replay_events, "START_RECORDING", "")
    assert len(replay_events.on_start(5)) == 5 and isinstance(replay_events.on_start(5)[0], Session)
    monkeypatch.setattr(replay_events, "START_RECORDING", replay_events.SPACE_RECORDING)
    outputs = replay_events.on_start(replay_events.OPEN_OUTPUTS + compare_events.COMPARE_OUTPUTS - 2)
    session, status = outputs[:2]
    assert session.recording is not None and len(session.decoder.steps) == 1 and session.race.finished
    assert "Showing a recorded run (recorded on AMD EPYC, 2 cores" in status      # the qwen-coder pair's race
    assert "**staged** won at " in status and "llama.cpp's plain decoding (the reference" in status
    assert "Every lane" in status and "<|" not in status
    counters = outputs[2 + len(app_settings.SETTING_NAMES) + 3]
    assert "recorded on " in counters
    columns = dict(zip(SHOWN, outputs[replay_events.OPEN_OUTPUTS:replay_events.OPEN_OUTPUTS + len(SHOWN)]))
    assert all("done ✓" in columns[name] for name in session.race.lanes()) and set(session.race.lanes()) == set(SHOWN)
    measured = outputs[replay_events.OPEN_OUTPUTS + len(SHOWN)]
    assert "How it was timed" in measured and "Analysis of staged's rounds" in measured
    assert "tokens per pass" in outputs[-3] and "live models" in outputs[-1]      # why it is fast; the regime
    monkeypatch.setattr(replay_events, "START_RECORDING", "cpu-offline-humaneval2-greedy")     # one lane is absent
    outputs = replay_events.on_start(replay_events.OPEN_OUTPUTS + compare_events.COMPARE_OUTPUTS - 2)
    columns = dict(zip(SHOWN, outputs[replay_events.OPEN_OUTPUTS:replay_events.OPEN_OUTPUTS + len(SHOWN)]))
    absent = [columns[name] for name in SHOWN if name not in outputs[0].race.lanes()]
    assert absent and all("not in this recording" in c or "not in this race" in c for c in absent)   # says why


class ChatWordTokenizer(WordTokenizer):
    """A word tokenizer with a chat template: a user's turn, then the assistant's turn opened."""
    chat_template = "user, then assistant"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize and add_generation_prompt and messages[0]["role"] == "user"
        return f"<|im_start|>user {messages[0]['content']} <|im_end|> <|im_start|>assistant"

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"<|w{i}|>" if i in CHAT_TOKENS else f"w{i}" for i in ids)


CHAT_TOKENS = {sum(map(ord, word)) % 64 for word in ("<|im_start|>user", "<|im_end|>", "<|im_start|>assistant")}


def test_plain_language_examples_open_in_chat_and_the_race_is_the_same_in_either_mode(own_stacks):
    """Chat puts the prompt in the model's chat template (its tokens grey, as the prompt is); it changes the prompt's
    tokens only, so every lane still writes baseline's text, and a model without a template says so."""
    from tiny import tiny_stack

    from specviz.app import events
    from specviz.models.prompt_format import default_format

    for name, text in app_settings.example_prompts().items():       # code and the pattern are continued as written
        code = name.startswith("HumanEval") or name == app_settings.PATTERN_EXAMPLE
        assert default_format(text) == ("completion" if code else "chat"), name
    stack = own_stacks.hold(("offline",), tiny_stack(tokenizer=ChatWordTokenizer()))
    chat = app_settings.parse_settings(**{**SETTINGS, "prompt": "why is the sky blue", "prompt_format": "chat",
                                          "max_new_tokens": 8})
    plain = stacks.prompt_ids(stack, app_settings.parse_settings(**{**SETTINGS, "prompt": "why is the sky blue"}))
    ids = stacks.prompt_ids(stack, chat)
    assert len(ids) == len(plain) + 3 and ids[1:-2] == plain
    race = Race.start(chat)
    assert all(lane.prompt == ids for lane in race.decoders.values()) and not race.differing()
    session = Session()
    list(events.on_step(session, *controls(prompt="why is the sky blue", prompt_format="chat", max_new_tokens=8)))
    shown = events.render_step(session, "")[3]
    assert "⟨w" in shown and "<|" not in shown         # the template's tokens, by name, in the prompt's grey
    assert shown.index('class="prompt-text">') < shown.index("⟨w") < shown.index("data-stage")
    with pytest.raises(app_settings.UserError, match="no chat template"):
        stacks.prompt_ids(tiny_stack(tokenizer=WordTokenizer()), chat)
    with pytest.raises(app_settings.UserError, match="Unknown prompt format"):
        app_settings.parse_settings(**{**SETTINGS, "prompt_format": "poem"})


def test_the_race_says_when_lanes_differ():
    assert "Every lane wrote exactly" in words.sameness_note([], greedy=True)
    assert "bug" in words.sameness_note(["staged"], greedy=True)
    assert "random draws" in words.sameness_note(["staged"], greedy=False)


def test_the_race_explains_a_missing_staged_stack(tiny_default):
    tiny_default(drafts=("lookup",))
    race = Race.start(app_settings.parse_settings(**SETTINGS))
    assert "staged" not in race.decoders and "this model stack has: lookup" in race.skipped["staged"]
    assert "hf_assisted" not in race.peers and "needs a draft model" in race.skipped["hf_assisted"]


def test_new_settings_or_reset_start_a_new_generation(tiny_default):
    """(How sessions share decodes, and only identical ones: tests/test_shared_decodes.py.)"""
    tiny_default()
    first = Session()
    a, _ = first.decoder_for(app_settings.parse_settings(**{**SETTINGS, "strategy": "staged", "max_new_tokens": 12}))
    again, note = first.decoder_for(app_settings.parse_settings(**{**SETTINGS, "max_new_tokens": 5}))
    assert again is not a and "new generation" in note and again.max_new_tokens == 5
    run_id = first.run_id
    first.reset()
    assert first.decoder is None and first.run_id > run_id


def test_stop_leaves_the_status_to_the_loop_it_stops():
    """Stop must not write a status while a loop runs: its reply could reach the page after the
    loop's own "Stopped after …" and hide it (seen in the browser test)."""
    from specviz.app import events
    session = Session()
    assert events.on_stop(session)[1] == "Nothing is running."
    loop = session.loop(lambda run_id: iter([run_id, run_id]))
    stopped_run = next(loop)                                         # the loop is going on
    _, status = events.on_stop(session)
    assert status is not None and not isinstance(status, str)       # gr.skip(): left as it is
    assert session.stopped_run == stopped_run and session.run_id != stopped_run
    loop.close()                                                     # the loop ends
    assert events.on_stop(session)[1] == "Nothing is running."


def test_the_model_bytes_a_server_holds_are_bounded():
    from tiny import tiny_model

    from specviz.models.load import LoadedModel
    from specviz.stack.stack import Stack

    def load(key, profile=None):
        return Stack(LoadedModel(key[0], tiny_model("llama", seed=len(key[0])), WordTokenizer()), [], {})
    size = load(("a",)).weight_bytes
    with stacks.isolated(load=load, most_bytes=1.5 * size) as held:
        held.get(("a",))
        held.get(("b",))                  # two would exceed the bound: the older one is dropped
        assert held.keys() == [("b",)]
        held.most_bytes = 0.5 * size
        with pytest.raises(app_settings.UserError, match="this server holds at most"):
            held.get(("cc",))
        assert held.keys() == [("b",)]


def test_an_unknown_preset_named_by_the_operator_stops_the_app_with_one_line():
    import os
    import subprocess
    import sys

    from specviz.stack.presets import PRESETS
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "SPECVIZ_PRESET": "gpt5", "SPECVIZ_PRELOAD": "0", "GRADIO_ANALYTICS_ENABLED": "False"}
    done = subprocess.run([sys.executable, str(root / "app.py")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("specviz: SPECVIZ_PRESET='gpt5' is not a preset; choose one of "
                                                    + ", ".join(PRESETS))


def test_the_page_says_in_its_status_where_the_profile_lacks_a_measurement_and_the_race_names_each_source(
        tiny_default, own_profile, monkeypatch):
    """A live decoder started where this machine's profile lacks a measurement says so in the status line; the race's
    "How this was measured" groups the settings by where they came from."""
    stack = tiny_default()          # its profile: the test's own file, which SPECVIZ_PROFILE names
    settings = app_settings.parse_settings(**{**SETTINGS, "strategy": "staged", "max_new_tokens": 4})
    note = Session().decoder_for(settings)[1]                      # staged's plan: not in the empty profile
    assert note.startswith("No machine profile here; stated defaults are used") and note.endswith(".")
    said = {"draft d": "a stated default: x", "tree plan: p": "a stated default: x", "calibration c": "learnt y"}
    text = words.profile_note(said, stack.profile.missing_line())
    assert text.startswith("**Where the settings came from.** draft d, tree plan: p: a stated default: x. "
                           "calibration c: learnt y. No machine profile here") and "\n" not in text
    stack.profile.records.defaulted = {}
    assert Session().decoder_for(app_settings.parse_settings(**{**SETTINGS, "strategy": "baseline"}))[1] == ""


def test_the_step_says_where_the_draft_read_a_long_prompts_head_and_tail_only():
    """The first round a draft model reads in: a caption line where it left part of the text unread, none where it
    read it all, and none in later rounds."""
    from tiny import tiny_stack
    stack = tiny_stack(("draft", "lookup"))
    prompt = [(7 * i) % 61 + 1 for i in range(80)]
    steps = stack.decoder(prompt, "speculative", max_new_tokens=4).generate().steps       # reads 32 + 32 of 80
    assert captions.prompt_read_note(steps[:1], len(prompt)).startswith("The draft model read 64 of the 80 tokens")
    assert captions.prompt_read_note(steps[:2], len(prompt)) == ""
    whole = stack.decoder(prompt[:40], "speculative", max_new_tokens=4).generate().steps
    assert captions.prompt_read_note(whole[:1], 40) == ""


def test_the_step_says_what_the_second_stage_handed_the_draft():
    """A draft fed a trigram's guess beside the node above: two forwards for three levels of guesses, one saved."""
    from specviz.decode.trace import NodeRecord, StageInfo, StepRecord
    stages = [StageInfo("target", "target"), StageInfo("draft", "model"), StageInfo("trigram", "ngram"),
              StageInfo("context lookup", "lookup")]
    nodes = [NodeRecord(0, 5, "a", -1, 0, 0, 0, None, None, None, True),
             NodeRecord(1, 6, "b", 0, 1, 0, 1, 0.9, 0.9, 1.0, True),
             NodeRecord(2, 7, "c", 1, 2, 0, 2, 0.9, 0.9, 1.0, True),     # guessed by the trigram, taken by the draft
             NodeRecord(3, 8, "d", 2, 3, 0, 1, 0.9, 0.9, 1.0, False),
             NodeRecord(4, 9, "e", 0, 1, 1, 3, 1.0, 0.1, 0.0, False)]    # context lookup's branch: not the draft's
    step = StepRecord(0, "staged", stages, nodes, [0, 1, 2], [6, 7, 8], ["b", "c", "d"], [0, 0, 0], {},
                      {"target": [5], "draft": [1, 3]}, {}, 0.0, 0)
    assert captions.second_stage_note(step) == ("The n-gram handed the draft 1 of these guesses before it asked for "
                                                "them; the draft ran 2 forwards for 3 levels of guesses, 1 saved.")
    assert captions.second_stage_note(step) in captions.step_caption(step)
    alone = StepRecord(0, "speculative", stages[:2], nodes[:2] + [NodeRecord(2, 7, "c", 1, 2, 0, 1, 0.9, 0.9, 1.0,
                                                                             True)],
                       [0, 1, 2], [6, 7, 8], ["b", "c", "d"], [0, 0, 0], {}, {"target": [3], "draft": [1, 1]}, {},
                       0.0, 0)
    assert captions.second_stage_note(alone) == ""


def test_the_fold_says_why_staged_won_or_lost_against_speculative():
    def lane(rate, passes, forwards, forward_ms, verify_ms, tokens=64):
        return {"tokens_per_s": rate, "tokens_per_target_forward": passes, "new_tokens": tokens,
                "draft_forwards": {"draft": forwards},
                "phase_s": {"stage1_draft": forwards * forward_ms / 1e3, "verify": verify_ms / 1e3,
                            "prompt_read": 0.5, "bookkeeping": 0.01}}
    spared = words.staged_note({"staged": lane(44.0, 4.0, 16, 8.0, 512), "speculative": lane(40.0, 4.0, 32, 6.0, 512)})
    assert spared == ("Staged beat speculative (1.10×), mostly in drafting (2.0 ms a token against 3.0): its draft "
                      "models ran 0.25 forwards a token at 8.0 ms each, against 0.50 at 6.0, and its target passes "
                      "made 4.0 tokens against 4.0.")
    # fewer draft forwards and more tokens a pass, and still slower: its bigger trees cost more to verify
    bigger = words.staged_note({"staged": lane(38.0, 4.8, 26, 7.5, 560), "speculative": lane(40.0, 4.4, 32, 6.0, 512)})
    assert bigger.startswith("Staged lost to speculative (0.95×), mostly in verifying (8.8 ms a token against 8.0)")
    assert "0.41 forwards a token at 7.5 ms each, against 0.50 at 6.0" in bigger and "4.8 tokens against 4.4" in bigger
    dearer = words.staged_note({"staged": lane(36.0, 4.0, 30, 8.0, 512), "speculative": lane(40.0, 4.0, 32, 6.0, 512)})
    assert dearer.startswith("Staged lost to speculative (0.90×), mostly in drafting (3.8 ms a token against 3.0)")
    assert words.staged_note({"staged": lane(36.0, 3.0, 30, 8.0, 512)}) == ""
