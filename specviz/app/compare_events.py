"""The Compare tab's handler: a race timed once for everyone who asks for it (specviz/app/shared_races.py), then
replayed on one clock for each visitor, or a recording's race replayed."""
from __future__ import annotations

from time import perf_counter

import gradio as gr

from .. import plots
from . import panels, regime, replay, shared_races, stacks, words
from . import settings as app_settings
from .compute import Wait
from .events import guarded, in_line
from .race import SHOWN
from .sessions import Session
from .settings import UserError

COMPARE_OUTPUTS = 2 + len(SHOWN) + 9
NOT_MEASURED = "*Run **Compare** to time the lanes; how they were timed, and where their time went, is told here.*"


def render_race(session: Session, status: str, charts: bool = True, measured: str = NOT_MEASURED):
    """The Compare tab's outputs: the status, a column per lane (in SHOWN's order), "how this was measured", the
    table and the charts (all but the status and the columns skipped while the lanes are timed and replayed)."""
    race = session.race
    columns = []
    table = race.table_stats() if race is not None else {}
    for name in SHOWN:
        if race is not None and name in race.decoders:
            columns.append(words.race_column_html(name, race.decoders[name], table.get(name, {})))
        elif race is not None and name in race.peers:
            peer = race.peers[name]
            columns.append(words.race_column_html(name, peer, table.get(name, {}), body=peer.text()))
        elif race is not None and name in race.skipped:
            columns.append(f'<div class="race-col" data-strategy="{name}"><b>{name}</b>: not in this race. '
                           f"{race.skipped[name]}</div>")
        elif race is not None and session.recording is not None:
            columns.append(f'<div class="race-col" data-strategy="{name}"><b>{name}</b>: not in this recording.</div>')
        else:
            columns.append(f'<div class="race-col" data-strategy="{name}"><b>{name}</b></div>')
    stats = race.stats() if race is not None else {}
    if not charts:
        return (session, status, *columns, *[gr.skip()] * 9)
    caption = f"\n\n*Replay: {replay.label(session.recording)}; timings as recorded.*" if session.recording else ""
    speed = panels.speed_view({name: lane.steps for name, lane in race.decoders.items()}) if race else None
    stages = {name: lane.stages for name, lane in race.decoders.items()} if race else {}
    table_md = words.compare_table_md(table, race.precision if race else "") + caption
    return (session, status, *columns, measured, table_md, plots.latency_figure(stats, stages),
            plots.forwards_figure(stats), plots.memory_figure(stats, stages), panels.speed_figure(speed),
            panels.speed_md(speed), regime.regime_figure(session.regime), regime.regime_md(session.regime))


@guarded(COMPARE_OUTPUTS)
def on_compare(session: Session, *values):
    settings = app_settings.settings_of_values(values)
    yield render_race(session, "Replaying the recorded race…" if session.recording else
                      "Loading models and preparing the race…", charts=False)
    yield from session.loop(lambda run_id: _race_loop(session, settings, run_id))


PROGRESS_EVERY_S = 4.0      # while lanes are timed, the page hears how far they got at most this often (a few words)
SETTLE_S = 0.2              # ...and then the browser gets this long to draw it before the next timed step
FRAME_S = 0.25              # the replay redraws the lanes' columns this often (charts at the end only)
REPLAY_SHARE = 0.08         # the replay takes at most this share of the lanes' summed times (faster if need be): the
                            # verdict then comes within 1.5x their sum, llama.cpp's model loads (off its clock) included


def _race_loop(session: Session, settings, run_id: int):
    started, shared_note = perf_counter(), ""
    if session.recording is not None:
        race = replay.race_of(session.recording)
        if race is None:
            raise UserError("This recording holds no race: open one saved from Compare, or go back to live.")
        how, timing_s = "Replaying the recorded race", None
    else:
        if not stacks.stack_loaded(settings.stack_key()):
            yield render_race(session, "Loading the models (first time only)…", charts=False)
        stack = stacks.get_stack(settings.stack_key())
        if not regime.measured(stack):      # before the race, so that its verdict ends the event (clicks count again)
            yield render_race(session, "Measuring what verifying k tokens costs here (first race of these models "
                              "only)…", charts=False)
        session.regime = regime.regime_view(stack)
        shared = shared_races.RACES.get(settings, stack)
        mine, joined_while_timed = shared.timing is None and shared.result is None, shared.timing is not None
        shown, started = 0.0, perf_counter()
        with shared.watched():
            while (progress := (yield from in_line(session, COMPARE_OUTPUTS, shared.advance))) is not None:
                if session.run_id != run_id:
                    if session.stopped_run == run_id:
                        yield render_race(session, "Race stopped while its lanes were timed.", charts=False)
                    return
                if progress.tokens == 0 or perf_counter() - shown >= PROGRESS_EVERY_S:
                    # the status alone (the page redraws nothing else), and a pause for the browser to draw it before
                    # the next timed step: on the same cores its drawing slowed the lane being timed by up to 20%
                    yield (session, words.timing_status(progress, perf_counter() - shared.began),
                           *[gr.skip()] * (COMPARE_OUTPUTS - 2))
                    yield Wait(SETTLE_S)
                    shown = perf_counter()
        race, timing_s = shared.replay(), shared.timing_s
        how = f"All lanes timed alone in {timing_s:.0f} s. Racing them at their own times"
        shared_note = "" if mine else shared.note(joined_while_timed)
    session.race = race
    lanes_s = sum(race.own_times().values())
    speed = max(1.0, race.duration() / (REPLAY_SHARE * lanes_s)) if lanes_s > 0 else 1.0
    how += f" ({speed:.1f}x faster than they ran)" if speed > 1.05 else ""
    clock = perf_counter()
    while not race.finished:
        if session.run_id != run_id or session.race is not race:
            if session.stopped_run == run_id:
                yield render_race(session, "Race stopped; the charts show the steps so far.")
            return
        yield Wait(FRAME_S - (perf_counter() - clock) % FRAME_S)
        race.advance_to(speed * (perf_counter() - clock))
        yield render_race(session, f"{how}… press Stop to end early.", charts=False)
    if session.recording is None:
        timed_how = words.TIMED_ALONE + " " + words.race_time_note(perf_counter() - started, lanes_s, timing_s,
                                                                    perf_counter() - clock)
        timed_how += "\n\n" + words.profile_note(stack.profile.said(), stack.profile.missing_line())
        timed_how = "\n\n".join(part for part in (shared_note, timed_how) if part)
    else:
        timed_how = words.recorded_timing(session.recording.recorded)
    answer, measured = words.outcome(race, settings.sampling.greedy, timed_how)
    yield render_race(session, " ".join(part for part in ("Race finished.", shared_note, answer) if part),
                      measured=measured)
