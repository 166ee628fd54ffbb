"""A class on one server: identical requests share one decode (specviz/app/shared_decodes.py) and one race
(shared_races.py), each visitor reads at their own pace, and a visitor beyond the live decoders waits in line with
their place and an estimate instead of being turned away (decoder_slots.py). On tiny random models (fast)."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, fields, replace

import pytest
from test_app import SETTINGS, controls

from specviz.decode import engine
from specviz.app import compare_events, decoder_slots, events, shared_decodes, shared_races, stacks
from specviz.app import settings as app_settings
from specviz.app.compute import computed
from specviz.app.sessions import Session


def settings_of(**change) -> app_settings.Settings:
    return app_settings.parse_settings(**{**SETTINGS, "strategy": "staged", "max_new_tokens": 12, **change})


@pytest.fixture
def table(monkeypatch):
    """install(limit, ...): this test's table of shared decodes over `limit` live decoders."""
    def install(limit=16, idle_s=900.0, size=64, clock=None):
        slots = decoder_slots.DecoderSlots(limit, idle_s, **({"clock": clock} if clock else {}))
        shared = shared_decodes.SharedDecodes(size, slots)
        monkeypatch.setattr(decoder_slots, "SLOTS", slots)
        monkeypatch.setattr(shared_decodes, "SHARED", shared)
        return shared
    return install


@pytest.fixture
def rounds_computed(monkeypatch):
    """How many rounds the engine computed (Decoder.step calls) from here on."""
    count = [0]
    step = engine.Decoder.step

    def counted(self):
        count[0] += 1
        return step(self)
    monkeypatch.setattr(engine.Decoder, "step", counted)
    return count


def rounds(steps) -> list[dict]:
    """A trace's rounds without their clocks: the tree (every node's token, parent, stage, probabilities, whether
    accepted), the accepted path, the committed tokens, the forwards and the plan."""
    return [{k: v for k, v in asdict(step).items() if k not in ("wall_s", "phase_s")} for step in steps]


def private(settings) -> list[dict]:
    """The rounds of the request decoded alone, as a session decoded before decodes were shared."""
    decoder = stacks.new_decoder(stacks.get_stack(settings.stack_key()), settings)
    decoder.generate()
    return rounds(decoder.steps)


def read_to_the_end(*sessions_and_settings) -> None:
    """Step the sessions' readers in turn, as visitors' Step presses arrive, until every one has finished."""
    readers = [session.decoder_for(settings)[0] for session, settings in sessions_and_settings]
    while not all(reader.finished for reader in readers):
        for reader in readers:
            if not reader.finished:
                reader.step()


# -- exactness: what a session reads is what a private decode computes, and only identical requests share ---------

@pytest.mark.parametrize("change", [dict(), dict(strategy="speculative"), dict(strategy="baseline"),
                                    dict(sampling_mode="sample", top_k=8, seed=3)])
def test_a_shared_decode_gives_every_session_the_rounds_of_a_private_decode(tiny_default, table, rounds_computed,
                                                                             change):
    tiny_default()
    table()
    settings = settings_of(**change)
    alone = private(settings)
    rounds_computed[0] = 0
    visitors = [Session() for _ in range(3)]
    read_to_the_end(*[(visitor, settings) for visitor in visitors])
    assert len({id(visitor.decoder.shared) for visitor in visitors}) == 1
    for visitor in visitors:
        assert rounds(visitor.decoder.steps) == alone and visitor.decoder.finish_reason == "length"
        assert visitor.decoder.new_tokens == [t for step in alone for t in step["committed_tokens"]]
    assert rounds_computed[0] == len(alone)            # each round computed once, for the three of them


def changed(value):
    """Another value of a setting's type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if value < 1 else value / 2
    if isinstance(value, str):
        return value + " x"
    if isinstance(value, tuple):
        return (*value, 0.5)
    raise TypeError(f"no other value for {value!r}")


def every_single_change(settings):
    """(name, settings) for each setting of a request changed alone, the sampling's and the tree's one by one."""
    for field in fields(settings):
        value = getattr(settings, field.name)
        if field.name in ("sampling", "tree"):
            for inner in fields(value):
                yield f"{field.name}.{inner.name}", replace(settings, **{field.name: replace(
                    value, **{inner.name: changed(getattr(value, inner.name))})})
        else:
            yield field.name, replace(settings, **{field.name: changed(value)})


def test_requests_share_a_decode_only_where_every_setting_and_the_precision_agree():
    sampled, greedy = settings_of(sampling_mode="sample", top_k=8, seed=3), settings_of()
    key = shared_decodes.request_key
    for name, other in every_single_change(sampled):
        assert key(other, "gguf") != key(sampled, "gguf"), name
    for name, other in every_single_change(greedy):
        assert (key(other, "gguf") == key(greedy, "gguf")) == (name == "sampling.seed"), name   # greedy draws nothing
    assert key(greedy, "gguf") != key(greedy, "int4")


@pytest.mark.parametrize("first, second", [(dict(sampling_mode="sample", seed=1), dict(sampling_mode="sample", seed=2)),
                                           (dict(strategy="staged"), dict(strategy="speculative")),
                                           (dict(prompt="def add(a, b):\n"), dict(prompt="x y z w"))])
def test_sessions_whose_requests_differ_each_read_their_own_decode(tiny_default, table, first, second):
    """Two visitors asking at once, differing in one setting: each gets the rounds of their own request's private
    decode (the two decodes differ, so a key that let them share would fail here)."""
    tiny_default()
    table()
    a, b = settings_of(**first), settings_of(**second)
    alone_a, alone_b = private(a), private(b)
    assert alone_a != alone_b
    visitor_a, visitor_b = Session(), Session()
    read_to_the_end((visitor_a, a), (visitor_b, b))
    assert visitor_a.decoder.shared is not visitor_b.decoder.shared
    assert rounds(visitor_a.decoder.steps) == alone_a and rounds(visitor_b.decoder.steps) == alone_b


def test_sessions_stepping_at_their_own_pace_each_see_their_own_position(tiny_default, table, rounds_computed):
    tiny_default()
    table()
    settings = settings_of()
    fast, slow = Session(), Session()
    ahead, _ = fast.decoder_for(settings)
    behind, note = slow.decoder_for(settings)
    assert "Shared" in note and ahead.shared is behind.shared
    for _ in range(3):
        ahead.step()
    behind.step()
    assert len(ahead.steps) == 3 and len(behind.steps) == 1 and rounds_computed[0] == 3
    assert behind.steps[0] is ahead.steps[0] and len(behind.new_tokens) < len(ahead.new_tokens)
    for _ in range(3):
        behind.step()                       # round 4 is new: the slow visitor computes it
    assert len(behind.steps) == 4 and len(ahead.steps) == 3 and rounds_computed[0] == 4
    ahead.step()                            # ...and the fast one reads it
    assert ahead.steps[3] is behind.steps[3] and rounds_computed[0] == 4
    shown = events.render_step(slow, "")
    assert shown[5].startswith(events.render_step(slow, "")[5][:10])      # each page draws its own position
    fast.reset()
    again, _ = fast.decoder_for(settings)
    assert again.shared is behind.shared and again.steps == [] and len(behind.steps) == 4


def test_the_table_of_shared_decodes_is_bounded_and_a_reader_outlives_its_entry(tiny_default, table):
    tiny_default()
    shared = table(size=2)
    visitors = {prompt: Session() for prompt in ("a b", "c d", "e f")}
    for prompt, visitor in visitors.items():
        visitor.decoder_for(settings_of(prompt=prompt))[0].step()
    assert len(shared.entries) == 2            # the first request left the table...
    first = visitors["a b"].decoder
    while not first.finished:
        first.step()                           # ...and its visitor reads on
    late = Session()
    assert late.decoder_for(settings_of(prompt="a b"))[0].shared is not first.shared     # asked again: a new one


def test_a_visitor_who_read_a_shared_decode_saves_it_as_a_recording(tiny_default, table, tmp_path):
    from specviz import recording
    from specviz.app import replay
    tiny_default()
    table()
    settings = settings_of()
    first, second = Session(), Session()
    read_to_the_end((first, settings), (second, settings))
    lane = recording.load(replay.save(second, tmp_path)).lanes[settings.strategy]
    assert rounds(lane.recorded_steps) == rounds(first.decoder.steps)
    assert lane.prompt_text and lane.prompt_text == first.decoder.prompt_text


# -- the line: nobody is turned away while others hold every live decoder ----------------------------------------

def test_a_visitor_beyond_the_live_decoders_waits_in_line_with_a_place_and_an_estimate(tiny_default, table):
    tiny_default()
    table(limit=1)
    first, second, third = Session(), Session(), Session()
    values = controls(strategy="staged", max_new_tokens=6)
    assert "went wrong" not in list(events.on_step(first, *values))[-1][1]      # holds the only live decoder
    waiting = events.on_step(second, *controls(prompt="x y z", max_new_tokens=6))
    status = next(waiting)[1]
    assert "Waiting for a decoder" in status and "you are next" in status and "about" in status
    assert "busy" not in status and "Try again" not in status
    behind = events.on_step(third, *controls(prompt="p q", max_new_tokens=6))
    assert "1 ahead of you" in next(behind)[1]
    reading = list(events.on_step(Session(), *values))[-1][1]      # the first's request: read, no wait
    assert "Shared" in reading
    list(events.on_run(first, *values))                  # the first decode ends and gives its decoder back
    served = list(waiting)
    assert len(second.decoder.steps) == 1 and "Waiting" not in served[-1][1] and "went wrong" not in served[-1][1]
    assert "Waiting" in next(behind)[1]                  # the second's decode holds it now
    behind.close()


def test_an_idle_decoder_is_given_back_to_one_who_waits_and_its_visitor_starts_again(tiny_default, table):
    tiny_default()
    clock = [1000.0]
    table(limit=1, idle_s=60, clock=lambda: clock[0])
    idle, waiting = Session(), Session()
    idle.decoder_for(settings_of())[0].step()
    with pytest.raises(decoder_slots.InLine):
        waiting.decoder_for(settings_of(prompt="x y z"))
    clock[0] += 61                                       # the first visitor walked away
    reader, _ = waiting.decoder_for(settings_of(prompt="x y z"))
    reader.step()
    assert idle.decoder.finished and idle.decoder.finish_reason == "released"
    assert "gave its memory back" in events.render_step(idle, events._finished_note(idle.decoder))[1]
    with pytest.raises(decoder_slots.InLine):            # back, but the decoder is in use: in line again
        idle.decoder_for(settings_of())
    while not reader.finished:
        reader.step()
    again, note = idle.decoder_for(settings_of())
    assert again is not reader and "gave its memory back: started a new one" in note and again.steps == []


def test_the_estimate_follows_the_holders_pace_and_drops_a_place_nobody_asks_about():
    clock = [0.0]
    slots = decoder_slots.DecoderSlots(2, idle_s=100, clock=lambda: clock[0])
    a, b, c, d = (decoder_slots.Claim() for _ in range(4))
    assert slots.ask(a) == 0 and slots.ask(b) == 0 and slots.ask(c) == 1
    assert slots.estimate(1) is None                     # nothing has progressed: nothing to go by
    clock[0] = 10.0
    a.done, b.done = 0.5, 0.25                           # 10 s for half of a's work, a quarter of b's
    slots.touch(a), slots.touch(b)
    assert slots.estimate(1) == pytest.approx(10.0) and slots.estimate(2) == pytest.approx(30.0)
    assert slots.ask(d) == 2
    clock[0] += decoder_slots.GONE_AFTER_S + 1           # c's visitor left; d asks again and moves up
    slots.touch(a), slots.touch(b)
    assert slots.ask(d) == 1
    slots.give_back(a)
    assert slots.ask(d) == 0


def test_runs_in_progress_share_the_frames_a_second():
    """A frame costs the compute thread tens of ms: 16 Runs at 4 frames a second each would leave it nothing to
    decode with, so the Runs in progress share FrameBudget.per_s."""
    budget = events.FrameBudget(per_s=8)
    assert budget.interval() == budget.FRAME_S
    with ExitStack() as runs:
        for _ in range(16):
            runs.enter_context(budget.drawing())
        assert budget.interval() == pytest.approx(2.0)
    assert budget.running == 0 and budget.interval() == budget.FRAME_S


# -- the race: timed once for everyone who asks while it runs or soon after ---------------------------------------

def test_a_race_asked_for_while_it_is_timed_or_soon_after_is_timed_once(tiny_default, table, monkeypatch):
    tiny_default()
    table()
    clock = [1000.0]
    monkeypatch.setattr(shared_races, "RACES", shared_races.SharedRaces(8, decoder_slots.SLOTS, lambda: clock[0]))
    timed = []
    time_lanes = shared_races.time_lanes
    monkeypatch.setattr(shared_races, "time_lanes", lambda settings, *lanes: timed.append(settings) or
                        time_lanes(settings, *lanes))
    values = controls(max_new_tokens=6)
    first = Session()
    running = compare_events.on_compare(first, *values)
    while "Timing each lane alone" not in next(running)[1]:
        pass
    second = Session()
    joined = list(compare_events.on_compare(second, *values))[-1][1]        # asked while the first's is timed
    own = list(running)[-1][1]
    assert len(timed) == 1 and "Race finished" in own and "Shared race" not in own
    assert "Shared race" in joined and "being timed when you asked" in joined
    clock[0] += 60
    third = Session()
    later = list(compare_events.on_compare(third, *values))[-1][1]
    assert len(timed) == 1 and "Shared race: raced at" in later and "60 s before you asked" in later
    for visitor in (second, third):
        assert visitor.race is not first.race
        for name, lane in first.race.decoders.items():
            assert rounds(visitor.race.decoders[name].steps) == rounds(lane.steps)
    clock[0] += shared_races.REUSE_S
    list(compare_events.on_compare(Session(), *values))           # too late to reuse: raced again
    list(compare_events.on_compare(Session(), *controls(max_new_tokens=5)))   # other settings: another race
    assert len(timed) == 3


def test_a_race_left_by_everyone_who_asked_gives_its_decoder_back_and_starts_over(tiny_default, table, monkeypatch):
    tiny_default()
    table(limit=1)
    monkeypatch.setattr(shared_races, "RACES", shared_races.SharedRaces(8, decoder_slots.SLOTS))
    values = controls(max_new_tokens=6)
    left = compare_events.on_compare(Session(), *values)
    while "Timing each lane alone" not in next(left)[1]:
        pass
    race = next(iter(shared_races.RACES.entries.values()))
    assert decoder_slots.SLOTS.holds(race) and race.timing is not None
    left.close()                                         # its only visitor's page went away...
    computed(lambda: None)                               # ...and its loop's clean-up ran on the compute thread
    assert not decoder_slots.SLOTS.holds(race) and race.released and race.timing is None
    again = Session()
    assert "Race finished" in list(compare_events.on_compare(again, *values))[-1][1]
    assert next(iter(shared_races.RACES.entries.values())) is not race and again.race.finished
