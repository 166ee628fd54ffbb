"""Recorded runs: save -> open -> the same figures as live, with no model; bad and hostile files refused
or escaped with one line, leaving the session as it was."""
from __future__ import annotations

import copy
import gzip
import json

import pytest
from test_app import SETTINGS

from specviz import plots
from specviz import recording as rec
from specviz.app import replay as app_replay
from specviz.app import settings as app_settings
from specviz.app import captions, stacks, words
from specviz.app.race import Race
from specviz.app.sessions import Session

HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'


def live_session(**change) -> Session:
    """A session that raced every lane and ran its Step strategy to the end on the tiny stack."""
    settings = app_settings.parse_settings(**{**SETTINGS, "max_new_tokens": 8, **change})
    session = Session(settings=settings)
    session.race = Race.start(settings)
    while not session.race.finished:
        session.race.step()
    session.decoder = stacks.new_decoder(stacks.get_stack(settings.stack_key()), settings)
    while not session.decoder.finished:
        session.decoder.step()
    return session


def figure(fig) -> str:
    return fig.to_json()


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_a_saved_run_replays_to_the_same_figures_without_models(tiny_default, tmp_path, mode):
    tiny_default()
    live = live_session(sampling_mode=mode, top_k=5)
    path = app_replay.save(live, tmp_path)
    stacks.held().clear()                   # no model from here on
    session = Session()
    recording = app_replay.open_into(session, path.read_bytes())
    assert recording.recorded["machine"] and recording.label().startswith("recorded on ")
    lane, steps = session.decoder, live.decoder.steps
    assert lane.steps == [] and not lane.finished
    for live_step in steps:
        lane.step()
        assert figure(plots.tree_figure(lane.steps[-1])) == figure(plots.tree_figure(live_step))
    assert lane.finished and lane.new_tokens == live.decoder.new_tokens
    assert words.text_html(SETTINGS["prompt"], lane.steps, lane.stages) == \
        words.text_html(SETTINGS["prompt"], steps, live.decoder.stages)
    assert figure(plots.acceptance_figure(lane.steps)) == figure(plots.acceptance_figure(steps))
    assert stacks.stats_of(lane) == stacks.stats_of(live.decoder)
    race = app_replay.race_of(recording)
    while not race.finished:
        race.step()
    assert race.table_stats() == live.race.table_stats()
    for draw in (plots.latency_figure, plots.forwards_figure, plots.memory_figure):
        assert figure(draw(race.stats())) == figure(draw(live.race.stats()))
    assert race.peers["hf_assisted"].text() == live.race.peers["hf_assisted"].text()
    session.reset()                                            # Reset replays from the first step
    assert session.recording is recording and session.decoder.steps == []
    again = rec.load(app_replay.save(session, tmp_path / "again").read_bytes())    # saving an open replay
    assert again.to_dict()["lanes"] == recording.to_dict()["lanes"] == json.loads(path.read_text())["lanes"]


def test_shipped_recordings_open_and_replay_to_the_end():
    assert rec.shipped(), "assets/recordings holds the shipped runs"
    for name in rec.shipped():
        session = Session()
        recording = app_replay.open_into(session, name)
        while not session.decoder.finished:
            session.decoder.step()
        assert session.decoder.new_tokens and app_replay.race_of(recording) is not None
        assert app_replay.control_values(recording)["prompt"] == recording.settings["prompt"]


def test_a_recording_made_while_plans_carried_their_words_opens_and_says_why_from_its_numbers():
    """A plan record used to carry its reason in words, and a recording holds its steps' plans: such a file must
    still open (its words dropped), and a plain round whose probe wait was not kept says so without a number."""
    with gzip.open(rec.shipped()["cpu-qwen-coder-humaneval0-greedy"]) as f:
        data = json.load(f)
    step = data["lanes"]["staged"]["steps"][0]
    step["plan"] = dict(kind="plain", recent_tokens=1.0, recent_ms=90.0, plain_ms=58.0, rates=[0.3], calibration={},
                        reason="The last drafted rounds made 1.0 tokens in 90 ms ...")
    with pytest.raises(rec.RecordingError):                 # unknown fields are refused elsewhere
        rec.from_dict({**data, "lanes": {"staged": {**data["lanes"]["staged"], "old": 1}}})
    plan = rec.from_dict(copy.deepcopy(data)).lanes["staged"].recorded_steps[0].plan
    assert plan.kind == "plain" and plan.probe_wait is None
    assert "a small guess probes after a few plain steps in a row" in captions.step_caption(
        rec.from_dict(data).lanes["staged"].recorded_steps[0])


def test_a_recording_made_past_the_end_of_text_replays_to_its_end_and_shows_no_special_token():
    """The qwen-coder recordings were made while the engine stopped at the GGUF's eos only: every lane of ours wrote
    on past `<|endoftext|>`. Replayed, each lane ends there, with its recorded times up to it."""
    path = rec.shipped()["cpu-qwen-coder-humaneval0-greedy"]
    raw = json.loads(gzip.decompress(path.read_bytes()))
    recording = rec.load(path)
    ended = set()
    for name, lane in recording.lanes.items():
        steps = lane.recorded_steps
        assert steps[-1].finish_reason == "eos" and steps[-1].committed_text[-1] == "<|endoftext|>", name
        assert sum(map(len, (s.committed_tokens for s in steps))) < raw["lanes"][name]["max_new_tokens"]
        assert [s["wall_s"] for s in raw["lanes"][name]["steps"][: len(steps)]] == [s.wall_s for s in steps]
        ended.add(steps[-1].committed_tokens[-1])
        shown = words.text_html(recording.settings["prompt"], steps, lane.stages)
        assert "<|" not in shown and "⟨endoftext⟩" in shown
        assert all("<|" not in plots.tree_figure(s).to_json() for s in steps)
    peer = recording.peers["hf_assisted"]
    assert peer.chunks[-1][-1] in ended and "<|" not in peer.texts[-1]
    race = app_replay.race_of(recording)
    while not race.finished:
        race.step()
    assert "hf_assisted" not in race.differing() and "staged" not in race.differing()


def _saved(tiny_default, tmp_path) -> dict:
    tiny_default()
    return json.loads(app_replay.save(live_session(), tmp_path).read_text())


def _edit(data: dict, change) -> bytes:
    data = copy.deepcopy(data)
    change(data)
    return json.dumps(data).encode()


def _first_node(data: dict) -> dict:
    return data["lanes"]["tree"]["steps"][0]["nodes"][0]


BAD = {
    "not JSON": lambda d: b"<html>hello</html>",
    "another format": lambda d: _edit(d, lambda x: x.update(format="something-else")),
    "a newer version": lambda d: _edit(d, lambda x: x.update(version=99)),
    "a token that is text": lambda d: _edit(d, lambda x: _first_node(x).update(token="7")),
    "an unknown field": lambda d: _edit(d, lambda x: _first_node(x).update(script="alert(1)")),
    "a missing field": lambda d: _edit(d, lambda x: _first_node(x).pop("depth")),
    "texts that do not match tokens": lambda d: _edit(
        d, lambda x: x["lanes"]["tree"]["steps"][0]["committed_text"].append("extra")),
    "a stage it does not have": lambda d: _edit(d, lambda x: _first_node(x).update(stage=9)),
    "settings out of range": lambda d: _edit(d, lambda x: x["settings"]["tree"].update(budget=10**6)),
    "a lane the race names but lacks": lambda d: _edit(d, lambda x: x["race"].append("phantom")),
    "a broken gzip": lambda d: b"\x1f\x8b\x08\x00broken",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_files_are_refused_with_one_line_and_change_nothing(tiny_default, tmp_path, case):
    payload = BAD[case](_saved(tiny_default, tmp_path))
    session = live_session()
    before = (session.decoder, session.race, session.settings)
    with pytest.raises(app_settings.UserError) as refused:
        app_replay.open_into(session, payload)
    message = str(refused.value)
    assert message.startswith("This file cannot be replayed: ") and "\n" not in message, message
    assert (session.decoder, session.race, session.settings) == before and session.recording is None


def test_large_files_and_gzip_bombs_are_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(rec, "MAX_BYTES", 10_000)
    for payload in (b" " * 10_001, gzip.compress(b" " * 10_000_000)):       # the bomb is ~10 kB packed
        with pytest.raises(rec.RecordingError, match="too large"):
            rec.load(payload)


def test_token_texts_from_a_file_are_drawn_as_text(tiny_default, tmp_path):
    def hostile(data):
        for lane in data["lanes"].values():
            for step in lane["steps"]:
                step["committed_text"] = [HOSTILE] * len(step["committed_text"])
                for node in step["nodes"]:
                    node["text"] = HOSTILE
                for stage in step["stages"]:
                    stage["name"] = HOSTILE
        data["recorded"]["machine"] = HOSTILE
    session = Session()
    recording = app_replay.open_into(session, _edit(_saved(tiny_default, tmp_path), hostile))
    lane = session.decoder
    lane.step()
    drawn = [words.text_html("p", lane.steps, lane.stages), words.legend_html(lane.stages),
             app_replay.label(recording), figure(plots.tree_figure(lane.steps[-1]))]
    for html_text in drawn:
        assert "<img" not in html_text, html_text[:300]
    assert "&lt;img" in drawn[0] and "&lt;img" in drawn[2]
    caption = captions.step_caption(lane.steps[-1])        # Markdown: tokens sit in code spans, shown as text
    assert caption.count("<img") == caption.count("`<img") > 0
