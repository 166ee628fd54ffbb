"""The app's event handlers for Step, Run, Reset, Stop, Compare and the lossless check. Each returns
(session, status, ...) for its outputs; `guarded` turns any failure into a one-line message."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from functools import wraps
from inspect import isgeneratorfunction
from time import perf_counter, sleep

import gradio as gr

from .. import auto_choice, lossless, plots
from . import panels, regime, replay, stacks, words
from . import settings as app_settings
from .compute import computed, computed_steps
from .race import SHOWN, time_lanes
from .sessions import LIVE, Session
from .settings import UserError

log = logging.getLogger("specviz.app")


def warning(message: str) -> str:
    return f'<div class="status-warn">⚠ {message}</div>'




# -- error handling: every handler returns (session, status, ...); failures become a message -------

def guarded(n_outputs: int):
    """Turn UserError into a visible message and any other exception into a one-line one (the full
    traceback goes to the server log); the other outputs stay as they are. The handler runs on the compute thread."""
    def wrap(fn):
        def failure(session, exc):
            if isinstance(exc, UserError):
                message = str(exc)
            else:
                log.exception("handler %s failed", fn.__name__)
                message = f"Something went wrong: {app_settings.one_line(exc)}"
            gr.Warning(message)
            return (session, warning(message), *[gr.skip()] * (n_outputs - 2))

        if isgeneratorfunction(fn):
            @wraps(fn)
            def gen(session, *args):
                session = session or Session()
                try:
                    yield from computed_steps(fn(session, *args))
                except Exception as exc:  # noqa: BLE001 - the UI must survive anything
                    yield failure(session, exc)
            return gen

        @wraps(fn)
        def plain(session, *args):
            session = session or Session()
            try:
                return computed(fn, session, *args)
            except Exception as exc:  # noqa: BLE001
                return failure(session, exc)
        return plain
    return wrap


# -- Step / Run / Reset --------------------------------------------------------------------------

STEP_OUTPUTS = 7   # session, status, tree, text, caption, counters, acceptance


def render_step(session: Session, status: str):
    dec = session.decoder
    if dec is None or not dec.steps:
        stages = dec.stages if dec is not None else None
        return (session, status, plots.tree_figure(None), words.text_html(stacks.shown_prompt(dec, session.settings)
                                                                          if dec else "", [], stages),
                "", "No tokens yet.", plots.acceptance_figure([]))
    last = dec.steps[-1]
    stats = stacks.stats_of(dec)
    if session.recording is not None:
        precision = f"{session.recording.recorded['precision']} · {replay.label(session.recording)}"
    else:
        stack = stacks.get_stack(session.settings.stack_key())
        precision = stack.precision() + (f" ({stack.precision_reason})" if stack.precision_reason else "")
    return (session, status, plots.tree_figure(last), words.text_html(stacks.shown_prompt(dec, session.settings),
                                                                       dec.steps, dec.stages),
            words.step_caption(last, dec.sampling.greedy),
            words.counters_md(stats, dec.max_new_tokens, dec.finished, precision),
            plots.acceptance_figure(dec.steps))


def _step_once(session: Session, dec) -> bool:
    """One step under the session's lock; False when Reset or new settings replaced `dec` meanwhile."""
    if not session.lock.acquire(timeout=60):
        raise UserError("This session is busy with another step; try again in a moment.")
    try:
        if dec is not session.decoder or dec.finished:
            return False
        dec.step()
        return True
    finally:
        session.lock.release()


def _finished_note(dec) -> str:
    reason = "it wrote the end-of-text token" if dec.finish_reason == "eos" else "it reached max new tokens"
    return f"Finished: {reason}. Press **Reset** (or change a setting) to start again."


@guarded(STEP_OUTPUTS)
def on_step(session: Session, *values):
    settings = app_settings.settings_of_values(values)
    dec, note = session.decoder_for(settings)
    if dec.finished:
        return render_step(session, _finished_note(dec))
    _step_once(session, dec)
    status = note or f"Step {len(dec.steps)} done."
    return render_step(session, _finished_note(dec) if dec.finished else status)


@guarded(STEP_OUTPUTS)
def on_run(session: Session, *values):
    settings = app_settings.settings_of_values(values)
    loaded = session.recording is not None or stacks.stack_loaded(settings.stack_key())
    yield render_step(session, "Starting…" if loaded else "Loading the models (first time only)…")
    dec, note = session.decoder_for(settings)
    yield from session.loop(lambda run_id: _run_loop(session, dec, note, run_id))


def _run_loop(session: Session, dec, note: str, run_id: int):
    started = perf_counter()
    while not dec.finished:
        if session.run_id != run_id:
            if session.stopped_run == run_id:
                yield render_step(session, f"Stopped after {len(dec.new_tokens)} tokens. Press Run to continue "
                                           "or Reset to start over.")
            return
        if perf_counter() - started > app_settings.RUN_TIME_LIMIT_S:
            yield render_step(session, f"Stopped: runs are limited to {app_settings.RUN_TIME_LIMIT_S:.0f} s. "
                                       "Press Run again to continue.")
            return
        if not _step_once(session, dec):
            if dec is not session.decoder:
                yield render_step(session, "This run ended: Reset or new settings started a new generation.")
            break
        replay.pace(dec)
        yield render_step(session, f"Running… {len(dec.new_tokens)}/{dec.max_new_tokens} tokens. "
                                   "Press Stop to pause.")
    if dec.finished and dec is session.decoder:
        yield render_step(session, (note + " " if note else "") + _finished_note(dec))


@guarded(STEP_OUTPUTS)
def on_reset(session: Session):
    session.reset()
    return render_step(session, "Reset: the next Step starts a new generation.")


def on_stop(session: Session | None):
    if session is None or session.looping != session.run_id:
        return session, "Nothing is running."
    session.stop()
    # The loop ends after its current step and reports "Stopped after …" itself; a status from here
    # could reach the page after that report and hide it.
    return session, gr.skip()


# -- Compare ---------------------------------------------------------------------------------------

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
    started = perf_counter()
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
        LIVE.admit(session)
        timing, shown, started = time_lanes(settings), 0.0, perf_counter()
        while True:
            try:
                progress = next(timing)
            except StopIteration as done:
                timed = done.value
                break
            if session.run_id != run_id:
                if session.stopped_run == run_id:
                    yield render_race(session, "Race stopped while its lanes were timed.", charts=False)
                return
            if progress.tokens == 0 or perf_counter() - shown >= PROGRESS_EVERY_S:
                # the status alone (the page redraws nothing else), and a pause for the browser to draw it before the
                # next timed step: on the same cores its drawing slowed the lane being timed by up to 20%
                yield (session, words.timing_status(progress, perf_counter() - started),
                       *[gr.skip()] * (COMPARE_OUTPUTS - 2))
                sleep(SETTLE_S)
                shown = perf_counter()
        race, timing_s = timed.replay(), perf_counter() - started
        how = f"All lanes timed alone in {timing_s:.0f} s. Racing them at their own times"
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
        sleep(max(0.0, FRAME_S - (perf_counter() - clock) % FRAME_S))
        race.advance_to(speed * (perf_counter() - clock))
        yield render_race(session, f"{how}… press Stop to end early.", charts=False)
    if session.recording is None:
        timed_how = words.TIMED_ALONE + " " + words.race_time_note(perf_counter() - started, lanes_s, timing_s,
                                                                    perf_counter() - clock)
        timed_how += "\n\n" + words.profile_note(auto_choice.said(), auto_choice.missing_line())
    else:
        timed_how = words.recorded_timing(session.recording.recorded)
    answer, measured = words.outcome(race, settings.sampling.greedy, timed_how)
    yield render_race(session, f"Race finished. {answer}", measured=measured)


# -- Is it lossless? --------------------------------------------------------------------------------

LOSSLESS_OUTPUTS = 4     # session, status, figure, summary


@guarded(LOSSLESS_OUTPUTS)
def on_lossless(session: Session, samples, *values):
    settings = app_settings.settings_of_values(values)
    n = app_settings.parse_number(samples, "samples", 10, app_settings.MAX_LOSSLESS_SAMPLES)
    if session.recording is not None:
        raise UserError("The lossless check samples with the models: press Back to live decoding first.")
    if settings.sampling.greedy:
        yield session, "Greedy decoding is deterministic: the check is that every lane writes baseline's tokens.", \
            gr.skip(), _greedy_diff_md(session.race)
        return
    LIVE.admit(session)
    yield from session.loop(lambda run_id: _lossless_loop(session, settings, n, run_id))


def _greedy_diff_md(race) -> str:
    if race is None or "baseline" not in race.decoders:
        return ("Greedy: run **Compare**, then press Sample again for a token-by-token comparison of the lanes; "
                "choose *sample* under Sampling to test the distribution.")
    diff = lossless.greedy_diff({name: lane.new_tokens for name, lane in race.lanes().items()})
    return "Greedy, against baseline's tokens in the last race:\n" + "\n".join(
        f"- **{name}**: {words}" for name, words in diff.items())


def _lossless_loop(session: Session, settings, n: int, run_id: int):
    stack = stacks.get_stack(settings.stack_key())
    strategy = settings.strategy if settings.strategy != "baseline" else "staged"
    prompt_ids = stacks.prompt_ids(stack, settings)
    read_once = stack.prefill(prompt_ids)      # every sample copies the models' reads of the prompt
    decoders = {lane: lambda seed, lane=lane: stacks.new_decoder(
        stack, replace(settings, sampling=replace(settings.sampling, seed=seed)), lane, read_once)
        for lane in ("baseline", strategy)}
    exact = lossless.next_token_distribution(stack.target.model, prompt_ids, settings.sampling)
    plain, spec = Counter(), Counter()

    def text_of(token: int) -> str:
        return stack.tokenizer.decode([token])

    def render(status: str):
        tests = {} if len(plain) + len(spec) == 0 else {
            f"plain vs {strategy} (one distribution?)": lossless.homogeneity(plain, spec),
            f"{strategy} vs the target's exact probabilities": lossless.goodness_of_fit(spec, exact),
            "plain vs the target's exact probabilities": lossless.goodness_of_fit(plain, exact)}
        done = (sum(plain.values()), sum(spec.values()))
        return (session, status, panels.lossless_figure(exact, plain, spec, strategy, text_of),
                panels.lossless_md(strategy, tests, done, n))

    seed = settings.sampling.seed
    started = shown = perf_counter()
    yield render("Sampling the next token…")
    pairs = zip(lossless.first_tokens(decoders["baseline"], n, seed),
                lossless.first_tokens(decoders[strategy], n, seed + n))
    for a, b in pairs:
        plain[a] += 1
        spec[b] += 1
        if session.run_id != run_id:
            yield render("Sampling stopped; the test uses the samples so far.")
            return
        if perf_counter() - started > app_settings.RUN_TIME_LIMIT_S:
            yield render(f"Stopped: sampling is limited to {app_settings.RUN_TIME_LIMIT_S:.0f} s; "
                         "the test uses the samples so far.")
            return
        if perf_counter() - shown > 1.0:
            shown = perf_counter()
            yield render(f"Sampling… {sum(spec.values())}/{n} per lane. Press Stop to end early.")
    yield render(f"Sampled {n} next tokens per lane.")
