"""The app's event handlers for Step, Run, Reset, Stop and the lossless check (Compare's: compare_events.py). Each
returns (session, status, ...) for its outputs; `guarded` turns any failure into a one-line message. A handler that
needs a live decoder while every one is held waits in line (specviz/app/decoder_slots.py), its page told its place."""
from __future__ import annotations

import logging
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from functools import wraps
from inspect import isgeneratorfunction
from time import perf_counter

import gradio as gr

from ..analysis import lossless
from .. import plots
from . import captions, decoder_slots, panels, replay, stacks, words
from . import settings as app_settings
from .compute import Wait, computed, computed_steps
from .decoder_slots import InLine
from .sessions import Session
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
            " ".join(filter(None, (captions.step_caption(last, dec.sampling.greedy),
                                   captions.prompt_read_note(dec.steps, len(dec.prompt))))),
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
    if dec.finish_reason == "released":
        return (f"This generation was idle, so the server gave its memory back after {len(dec.new_tokens)} tokens. "
                "Press **Step** to start it again.")
    reason = "it wrote the end-of-text token" if dec.finish_reason == "eos" else "it reached max new tokens"
    return f"Finished: {reason}. Press **Reset** (or change a setting) to start again."


def in_line(session, n_outputs: int, ask):
    """ask() until it stops raising InLine, the page told its place and estimate meanwhile; then ask()'s value.
    The wait is a `Wait` (off the compute thread): those ahead in line compute meanwhile."""
    while True:
        try:
            return ask()
        except InLine as line:
            yield (session, line.message(), *[gr.skip()] * (n_outputs - 2))
            yield Wait(decoder_slots.ASK_EVERY_S)


@guarded(STEP_OUTPUTS)
def on_step(session: Session, *values):
    settings = app_settings.settings_of_values(values)
    dec, note = yield from in_line(session, STEP_OUTPUTS, lambda: session.decoder_for(settings))
    if dec.finished:
        yield render_step(session, _finished_note(dec))
        return
    _step_once(session, dec)
    status = note or f"Step {len(dec.steps)} done."
    yield render_step(session, _finished_note(dec) if dec.finished else status)


@guarded(STEP_OUTPUTS)
def on_run(session: Session, *values):
    settings = app_settings.settings_of_values(values)
    loaded = session.recording is not None or stacks.stack_loaded(settings.stack_key())
    yield render_step(session, "Starting…" if loaded else "Loading the models (first time only)…")
    dec, note = yield from in_line(session, STEP_OUTPUTS, lambda: session.decoder_for(settings))
    yield from session.loop(lambda run_id: _run_loop(session, dec, note, run_id))


MAX_PACE_S = 0.4    # a round read from a trace (shared or recorded) shows for the time it took to compute, at most this


class FrameBudget:
    """How often a Run redraws its page. A frame costs the compute thread tens of ms (its figures), so the Runs in
    progress share `per_s` frames a second, each at most one every FRAME_S: a class's Runs then leave most of the
    compute thread to decoding instead of drawing."""
    FRAME_S = 0.25

    def __init__(self, per_s: float):
        self.per_s, self.running, self.lock = per_s, 0, threading.Lock()

    @contextmanager
    def drawing(self):
        """Count a Run in progress for as long as the block lasts."""
        with self.lock:
            self.running += 1
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1

    def interval(self) -> float:
        return max(self.FRAME_S, self.running / self.per_s)


FRAMES = FrameBudget(per_s=8)


def _run_loop(session: Session, dec, note: str, run_id: int):
    with FRAMES.drawing():
        yield from _run_rounds(session, dec, note, run_id)


def _run_rounds(session: Session, dec, note: str, run_id: int):
    started = drawn = perf_counter()
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
        began = perf_counter()
        if not _step_once(session, dec):
            if dec is not session.decoder:
                yield render_step(session, "This run ended: Reset or new settings started a new generation.")
            break
        # a round computed here took its time already; one read shows as long as it took to compute (capped), so a
        # shared decode or a recording unfolds as it ran instead of all at once. The Wait also lets other visitors'
        # work onto the compute thread between two rounds of this one.
        yield Wait(min(dec.steps[-1].wall_s, MAX_PACE_S) - (perf_counter() - began))
        if not dec.finished and perf_counter() - drawn >= FRAMES.interval():
            drawn = perf_counter()
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
    claim, slots = decoder_slots.Claim(), decoder_slots.SLOTS      # its decoders live in its loop: they count as one
    yield from in_line(session, LOSSLESS_OUTPUTS, lambda: slots.take(claim))
    try:
        yield from session.loop(lambda run_id: _lossless_loop(session, settings, n, run_id, claim))
    finally:
        slots.give_back(claim)


def _greedy_diff_md(race) -> str:
    if race is None or "baseline" not in race.decoders:
        return ("Greedy: run **Compare**, then press Sample again for a token-by-token comparison of the lanes; "
                "choose *sample* under Sampling to test the distribution.")
    diff = lossless.greedy_diff({name: lane.new_tokens for name, lane in race.lanes().items()})
    return "Greedy, against baseline's tokens in the last race:\n" + "\n".join(
        f"- **{name}**: {words}" for name, words in diff.items())


def _lossless_loop(session: Session, settings, n: int, run_id: int, claim: decoder_slots.Claim):
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
        claim.done = sum(spec.values()) / n
        decoder_slots.SLOTS.touch(claim)
        if session.run_id != run_id or claim.released:
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
