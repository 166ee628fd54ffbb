"""specviz: watch staged speculative decoding, one step at a time.  Run: `python app.py`.

A thin Gradio UI over the engine: every picture is built from the engine's step traces
(specviz/plots.py); settings, sessions, captions and the race live in specviz/app_support.py.
Models are loaded once per model stack and shared read-only; each browser session has its own
decoder in gr.State.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import replace
from functools import wraps
from inspect import isgeneratorfunction
from time import perf_counter

import gradio as gr

from specviz import app_replay as replay
from specviz import lossless
from specviz import app_support as support
from specviz import panels, plots
from specviz.app_support import UserError
from specviz.race import COMPARED, Race
from specviz.recording import MAX_BYTES
from specviz.sessions import LIVE, Session
from specviz.drafting import SHAPES
from specviz.strategies import AUTO_SHAPE, STAGED_LOOKUP, STRATEGIES

log = logging.getLogger("specviz.app")
CONCURRENCY = int(os.environ.get("SPECVIZ_CONCURRENCY", "2"))
EXAMPLES = support.example_prompts()

INTRO = """
# specviz: watch speculative decoding at work
A language model writes one token (a word piece) at a time, and every token means reading **all** of the
model's weights from memory, which is slow. **Speculative decoding** lets cheap helpers *guess* several
tokens ahead; the big model (the **target**) then checks all the guesses in **one** pass and keeps the
ones it agrees with. The text comes out exactly as the target alone would write it, only faster.
**Staged** speculation (Spector & Ré, 2023) guesses a whole *tree* of alternatives, and speeds up the guesser
itself with an even cheaper one (an n-gram model). Press **Step** to watch one round, **Run** to play to the end,
and open **Compare** to race the strategies.
"""

TREE_HELP = """
**The speculative tree.** The grey box on the left is the last token written so far (the *root*). Every
box to its right is a guess: **blue** = the small draft model, **green** = the n-gram model, **purple** =
copying from earlier in the text (lookup). Branches are alternative guesses for the same position. The
target checks every box in one pass: the **bold line** is the path it accepted, faded boxes were rejected
(or never checked because a box before them was wrong). The **red** box at the end is the target's own next
token, which the same pass gives for free. Hover over a box for its probabilities: *q* (how likely the guesser
thought it), *p* (how likely the target thinks it) and the chance it was accepted.
"""

TEXT_HELP = """
**The text so far.** Each generated token is tinted by who proposed it. Grey is your prompt; tokens from the
latest step are outlined. Many blue/green tokens mean the guessers are doing the work and the target only checks.
"""

ACCEPT_HELP = """
**Where the tree wastes its budget.** Each cell is one position in the tree: columns are how far ahead of
the root (depth), rows are the guesser's 1st, 2nd, 3rd… choice at that spot. The number is the share of guesses
there that the target accepted, over all steps so far, and *n* how often a guess stood there. Dark cells with a
large *n* are budget spent in vain: a smaller or narrower tree would do as well.
"""

COMPARE_HELP = """
**The race.** The same prompt and settings run with plain decoding (*baseline*: one target pass per token),
single-stage *speculative* decoding (one draft proposes a chain) and *staged* decoding (a tree, drafted by a
model that is itself sped up by an n-gram model, plus a branch copied from earlier in the text), next to
*hf_assisted*: what you would run instead, transformers' `generate()` with the same draft model
(`assistant_model=`), timed once as it streams its tokens and replayed at the times they arrived. The lanes
take turns on the processor; at any moment each column shows how far its strategy got in the same amount of
its own compute time (reading the prompt included). Under greedy decoding every lane writes the same text.
"""

CHARTS_HELP = """
**What it cost.** *Latency*: time per generated token and in total, split into drafting, the target's verification
passes and overhead. *Tokens per target pass*: how many tokens each expensive pass produced (baseline is 1).
*Memory traffic*: bytes read from memory per generated token compared with plain decoding, as in the paper's
Table 1. On a big GPU decoding is limited by memory traffic, so fewer bytes per token means more speed.
"""

LOSSLESS_HELP = """
**Is it lossless?** Speculation promises text *distributed exactly* as the target alone would write it. Press
**Sample** to start many generations with different seeds (the prompt and settings on the left, *sample* under
Sampling), with plain decoding and with the chosen strategy, and keep the first token each one writes. The bars show
how often each token came out, beside the target's exact probability. A chi-square test then asks whether the
samples could come from one distribution: a p-value below 0.001 would mean a bug. Under greedy decoding it compares
the race's lanes token by token instead.
"""

CSS = """
.gen-text {font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 17px; line-height: 1.75;
           white-space: pre-wrap; word-break: break-word; max-height: 430px; overflow-y: auto;
           padding: 10px; border: 1px solid #ddd; border-radius: 6px; background: #fff; color: #111;}
.prompt-text {color: #6b6b6b; font-size: 14px;}
.tok {border-radius: 3px; padding: 0 1px;}
.tok-legend {font-size: 15px; margin-bottom: 6px; line-height: 2; color: #111;}
.tok-legend .tok {padding: 2px 6px; margin-right: 4px;}
.race-col {border: 1px solid #ddd; border-radius: 8px; padding: 8px; background: #fafafa; color: #111;}
.race-head {font-size: 16px; margin-bottom: 4px;}
.race-bar {height: 8px; background: #e6e6e6; border-radius: 4px; margin-bottom: 8px;}
.race-bar > div {height: 8px; background: #0072B2; border-radius: 4px;}
.race-col .gen-text {max-height: 300px; font-size: 15px;}
#status {min-height: 1.5em; font-size: 17px;}
#status .status-warn {background: #FBE3D6; border-left: 6px solid #D55E00; padding: 8px 12px; border-radius: 4px;
                      color: #111; font-weight: 600;}
"""


def warning(message: str) -> str:
    return f'<div class="status-warn">⚠ {message}</div>'


# -- numeric controls that refuse a wrong type with one line ------------------------------------------

def numbers_only(component):
    """The API may send anything: Gradio's own bounds check fails on text with a TypeError, which the
    visitor sees as a bare 'Error'. Refuse it by name instead. (Wrapping the instance's preprocess,
    not subclassing: Gradio writes a .pyi stub next to any module that defines a component class.)"""
    check = component.preprocess

    def preprocess(payload):
        if payload is not None and (isinstance(payload, bool) or not isinstance(payload, (int, float))):
            raise gr.Error(f"{component.label} must be a number, got {str(payload)[:40]!r}.")
        return check(payload)
    component.preprocess = preprocess
    return component


# -- error handling: every handler returns (session, status, ...); failures become a message -------

def guarded(n_outputs: int):
    """Turn UserError into a visible message and any other exception into a one-line one (the full
    traceback goes to the server log); the other outputs stay as they are."""
    def wrap(fn):
        def failure(session, exc):
            if isinstance(exc, UserError):
                message = str(exc)
            else:
                log.exception("handler %s failed", fn.__name__)
                message = f"Something went wrong: {support.one_line(exc)}"
            gr.Warning(message)
            return (session, warning(message), *[gr.skip()] * (n_outputs - 2))

        if isgeneratorfunction(fn):
            @wraps(fn)
            def gen(session, *args):
                session = session or Session()
                try:
                    yield from fn(session, *args)
                except Exception as exc:  # noqa: BLE001 - the UI must survive anything
                    yield failure(session, exc)
            return gen

        @wraps(fn)
        def plain(session, *args):
            session = session or Session()
            try:
                return fn(session, *args)
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
        return (session, status, plots.tree_figure(None), support.text_html(session.settings.prompt if dec else "",
                [], stages), "", "No tokens yet.", plots.acceptance_figure([]))
    last = dec.steps[-1]
    stats = support.stats_of(dec)
    if session.recording is not None:
        precision = f"{session.recording.recorded['precision']} · {replay.label(session.recording)}"
    else:
        precision = support.get_stack(session.settings.stack_key()).precision()
    return (session, status, plots.tree_figure(last), support.text_html(session.settings.prompt, dec.steps, dec.stages),
            support.step_caption(last, dec.sampling.greedy),
            support.counters_md(stats, dec.max_new_tokens, dec.finished, precision),
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
    settings = support.parse_settings(*values)
    dec, note = session.decoder_for(settings)
    if dec.finished:
        return render_step(session, _finished_note(dec))
    _step_once(session, dec)
    status = note or f"Step {len(dec.steps)} done."
    return render_step(session, _finished_note(dec) if dec.finished else status)


@guarded(STEP_OUTPUTS)
def on_run(session: Session, *values):
    settings = support.parse_settings(*values)
    loaded = session.recording is not None or support.stack_loaded(settings.stack_key())
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
        if perf_counter() - started > support.RUN_TIME_LIMIT_S:
            yield render_step(session, f"Stopped: runs are limited to {support.RUN_TIME_LIMIT_S:.0f} s. "
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

COMPARE_OUTPUTS = 2 + len(COMPARED) + 6


def render_race(session: Session, status: str, charts: bool = True):
    race = session.race
    columns = []
    table = race.table_stats() if race is not None else {}
    for name in COMPARED:
        if race is not None and name in race.decoders:
            columns.append(support.race_column_html(name, race.decoders[name], table.get(name, {})))
        elif race is not None and name in race.peers:
            peer = race.peers[name]
            columns.append(support.race_column_html(name, peer, table.get(name, {}), body=peer.text()))
        elif race is not None and name in race.skipped:
            columns.append(f'<div class="race-col" data-strategy="{name}"><b>{name}</b>: not in this race. '
                           f"{race.skipped[name]}</div>")
        else:
            columns.append(f'<div class="race-col" data-strategy="{name}"><b>{name}</b></div>')
    stats = race.stats() if race is not None else {}
    if not charts:
        return (session, status, *columns, *[gr.skip()] * 6)
    caption = f"\n\n*Replay: {replay.label(session.recording)}; timings as recorded.*" if session.recording else ""
    speed = panels.speed_view({name: lane.steps for name, lane in race.decoders.items()}) if race else None
    stages = {name: lane.stages for name, lane in race.decoders.items()} if race else {}
    return (session, status, *columns, support.compare_table_md(table) + caption, plots.latency_figure(stats, stages),
            plots.forwards_figure(stats), plots.memory_figure(stats, stages), panels.speed_figure(speed),
            panels.speed_md(speed))


@guarded(COMPARE_OUTPUTS)
def on_compare(session: Session, *values):
    settings = support.parse_settings(*values)
    yield render_race(session, "Replaying the recorded race…" if session.recording else
                      "Loading models and preparing the race…", charts=False)
    yield from session.loop(lambda run_id: _race_loop(session, settings, run_id))


def _race_loop(session: Session, settings, run_id: int):
    if session.recording is not None:
        session.race = race = session.recording.race_replay()
        if race is None:
            raise UserError("This recording holds no race: open one saved from Compare, or go back to live.")
    else:
        if not support.stack_loaded(settings.stack_key()):
            yield render_race(session, "Loading the models (first time only)…", charts=False)
        yield render_race(session, "Timing HF assisted generation (transformers' generate with the same draft)…",
                          charts=False)
        LIVE.admit(session)
        session.race = race = Race.start(settings)
    skipped = " ".join(race.skipped.values())
    started = perf_counter()
    yield render_race(session, "Racing…")
    while not race.finished:
        if session.run_id != run_id or session.race is not race:
            if session.stopped_run == run_id:
                yield render_race(session, "Race stopped; the charts show the steps so far.")
            return
        if perf_counter() - started > support.RUN_TIME_LIMIT_S:
            yield render_race(session, f"Stopped: races are limited to {support.RUN_TIME_LIMIT_S:.0f} s.")
            return
        replay.pace(race.lanes()[race.step()])
        yield render_race(session, "Racing… press Stop to end early.")
    outcome = "Race finished. " + support.sameness_note(race.differing(), settings.sampling.greedy)
    yield render_race(session, outcome + (f" Not in the race: {skipped}" if skipped else ""))


# -- Is it lossless? --------------------------------------------------------------------------------

LOSSLESS_OUTPUTS = 4     # session, status, figure, summary


@guarded(LOSSLESS_OUTPUTS)
def on_lossless(session: Session, samples, *values):
    settings = support.parse_settings(*values)
    n = support.parse_number(samples, "samples", 10, support.MAX_LOSSLESS_SAMPLES)
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
    stack = support.get_stack(settings.stack_key())
    strategy = settings.strategy if settings.strategy != "baseline" else "staged"
    decoders = {lane: lambda seed, lane=lane: support.new_decoder(
        stack, replace(settings, sampling=replace(settings.sampling, seed=seed)), lane) for lane in ("baseline", strategy)}
    exact = lossless.next_token_distribution(stack.target.model, stack.encode(settings.prompt), settings.sampling)
    plain, spec = Counter(), Counter()
    text_of = lambda token: stack.tokenizer.decode([token])

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
    pairs = zip(lossless.first_tokens(decoders["baseline"], n, seed), lossless.first_tokens(decoders[strategy], n, seed + n))
    for a, b in pairs:
        plain[a] += 1
        spec[b] += 1
        if session.run_id != run_id:
            yield render("Sampling stopped; the test uses the samples so far.")
            return
        if perf_counter() - started > support.RUN_TIME_LIMIT_S:
            yield render(f"Stopped: sampling is limited to {support.RUN_TIME_LIMIT_S:.0f} s; the test uses the samples so far.")
            return
        if perf_counter() - shown > 1.0:
            shown = perf_counter()
            yield render(f"Sampling… {sum(spec.values())}/{n} per lane. Press Stop to end early.")
    yield render(f"Sampled {n} next tokens per lane.")


# -- recordings ------------------------------------------------------------------------------------

N_CONTROLS = 16      # the settings controls, in parse_settings' order
OPEN_OUTPUTS = STEP_OUTPUTS + N_CONTROLS


@guarded(OPEN_OUTPUTS)
def on_open(session: Session, source):
    """Open a shipped recording (its name) or an uploaded file (bytes) for replay."""
    if source is None or source == "":
        raise UserError("Pick a recording or upload a file first.")
    recording = replay.open_into(session, source)
    step = render_step(session, f"Opened a recording ({replay.label(recording)}). Step, Run and Compare replay "
                                "it with no model loaded; the times shown are the recorded ones.")
    return (*step[:2], *replay.control_values(recording), *step[2:])


@guarded(STEP_OUTPUTS)
def on_live(session: Session):
    replay.close(session)
    return render_step(session, "Back to live decoding: the next Step runs the models.")


@guarded(3)
def on_save(session: Session):
    path = replay.save(session)
    return session, f"Saved: {path.name} (open it under **Recordings** to replay it).", str(path)


# -- a page that opens on a recording (a Space shows one before any model loads) -------------------

SPACE_RECORDING = "cpu-offline-humaneval0-greedy"
START_RECORDING = os.environ.get("SPECVIZ_OPEN_RECORDING", SPACE_RECORDING if os.environ.get("SPACE_ID") else "")


def on_start(n_outputs: int):
    """A new visitor's session; with START_RECORDING, already showing that recording's first step and
    its finished race, so the page has something to show while (or instead of) loading models."""
    session = Session()
    if not START_RECORDING:
        return session, *[gr.skip()] * (n_outputs - 1)
    try:
        recording = replay.open_into(session, START_RECORDING)
    except UserError as exc:
        log.warning("cannot open %s at start: %s", START_RECORDING, exc)
        return session, *[gr.skip()] * (n_outputs - 1)
    session.decoder.step()
    session.race = race = recording.race_replay()
    while race is not None and not race.finished:
        race.step()
    step = render_step(session, f"Showing a recorded run ({replay.label(recording)}): press **Step**, **Run** or "
                                "**Compare** to replay it, or **Back to live decoding** (under Recordings) to run "
                                "the models yourself.")
    return (*step[:2], *replay.control_values(recording), *step[2:], *render_race(session, "")[2:])


# -- the page --------------------------------------------------------------------------------------

def build() -> gr.Blocks:
    preset_default = support.default_preset()
    staged = support.staged_available(preset_default)
    default_strategy = "staged" if staged else "tree"
    # with a draft model, code as in the paper; with context lookup alone, text that repeats itself
    default_example = next((k for k in EXAMPLES if k.startswith("HumanEval")), None) if staged else None
    default_example = default_example or support.PATTERN_EXAMPLE
    with gr.Blocks(title="specviz: staged speculative decoding") as demo:
        # no time_to_live or delete_callback: with either, the server answered new visitors seconds late
        # after each run (measured with gradio_client); specviz.sessions bounds live sessions instead
        session = gr.State(None)
        gr.Markdown(INTRO)
        status = gr.Markdown("", elem_id="status")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                example = gr.Dropdown(list(EXAMPLES), value=default_example, label="Example prompts", elem_id="examples",
                                      info="HumanEval coding tasks (as in the paper) and a few plain-language ones")
                prompt = gr.Textbox(EXAMPLES[default_example], label="Prompt", lines=7, max_lines=14,
                                    elem_id="prompt")
                strategy = gr.Radio(list(STRATEGIES), value=default_strategy, label="Strategy", elem_id="strategy",
                                    info="baseline: no guessing · speculative: one draft, a chain · tree: one draft, "
                                         "a tree · staged: a tree, with the draft itself sped up by an n-gram, plus "
                                         "a branch copied from earlier in the text")
                max_new = gr.Slider(1, support.MAX_NEW_TOKENS, value=32, step=1, label="Max new tokens",
                                    elem_id="max-new-tokens")
                with gr.Accordion("Models", open=False):
                    preset = gr.Dropdown(support.preset_choices(), value=preset_default,
                                         label="Model preset", elem_id="preset",
                                         info="offline and qwen-coder work without a network (the page opens "
                                              "with the one this machine runs best); the others download from "
                                              "the Hugging Face Hub on first use")
                    target = gr.Textbox("", label="Target model id", visible=False, elem_id="target-id",
                                        placeholder="hub id, local directory or .gguf file")
                    drafts = gr.Textbox("", label="Drafters, top stage first (comma-separated)", visible=False,
                                        placeholder="e.g. HuggingFaceTB/SmolLM2-135M, trigram")
                with gr.Accordion("Sampling", open=False):
                    mode = gr.Radio(["greedy", "sample"], value="greedy", label="Decoding", elem_id="mode",
                                    info="greedy: always the most likely token · sample: draw at random")
                    temperature = gr.Slider(0.05, 2.0, value=1.0, step=0.05, label="Temperature", visible=False)
                    top_k = gr.Slider(0, 200, value=50, step=1, label="Top-k (0 = off)", visible=False)
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p (1 = off)", visible=False)
                    seed = gr.Number(0, label="Seed", precision=0, visible=False)
                with gr.Accordion("Tree", open=False):
                    budget = gr.Slider(1, support.MAX_BUDGET, value=support.DEFAULT_BUDGET, step=1, label="Tree budget (guessed tokens per step)")
                    shape = gr.Dropdown([AUTO_SHAPE, *SHAPES], value=AUTO_SHAPE, label="Tree shape",
                                        info="auto: chain for speculative, dynamic (grown where the draft is "
                                             "confident) otherwise")
                    max_depth = gr.Slider(1, 32, value=8, step=1, label="Max depth")
                    max_branch = gr.Slider(1, 8, value=4, step=1, label="Max branches per node")
                    lookup = gr.Slider(0, support.MAX_LOOKUP, value=STAGED_LOOKUP, step=1,
                                       label="Context lookup (staged): tokens copied from the text so far",
                                       info="staged also verifies what followed the last repeat of the latest "
                                            "tokens; 0 = the paper's staged")
                with gr.Accordion("Recordings: replay a saved run, no model needed", open=False,
                                  elem_id="recordings-box"):
                    shipped = gr.Dropdown(replay.shipped_choices(), value=None, label="Shipped recordings",
                                          elem_id="recordings")
                    open_btn = gr.Button("Open", elem_id="open-btn")
                    upload = gr.File(label="Or open a saved run (.json)", file_types=[".json", ".gz"], type="binary",
                                     elem_id="upload-recording")
                    live_btn = gr.Button("Back to live decoding", elem_id="live-btn")
                    saved = gr.File(label="Saved run (Save in Step or Compare)", interactive=False, elem_id="saved-run")
            with gr.Column(scale=3):
                with gr.Tabs():
                    with gr.Tab("Step through", id="step"):
                        with gr.Row():
                            step_btn = gr.Button("Step", variant="primary", elem_id="step-btn")
                            run_btn = gr.Button("Run", variant="secondary", elem_id="run-btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                            reset_btn = gr.Button("Reset", elem_id="reset-btn")
                            save_btn = gr.Button("Save run", elem_id="save-btn")
                        with gr.Row():
                            with gr.Column(scale=3):
                                tree_plot = gr.Plot(plots.tree_figure(None), label="Speculative tree",
                                                    elem_id="tree-plot")
                                gr.Markdown(TREE_HELP)
                            with gr.Column(scale=2):
                                text = gr.HTML(support.text_html("", [], None), elem_id="gen-text", js_on_load=None)
                                caption = gr.Markdown("", elem_id="caption")
                                counters = gr.Markdown("No tokens yet.", elem_id="counters")
                                gr.Markdown(TEXT_HELP)
                        accept_plot = gr.Plot(plots.acceptance_figure([]), label="Acceptance per tree position",
                                              elem_id="accept-plot")
                        gr.Markdown(ACCEPT_HELP)
                    with gr.Tab("Compare", id="compare"):
                        gr.Markdown(COMPARE_HELP)
                        with gr.Row():
                            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                            stop2_btn = gr.Button("Stop", variant="stop", elem_id="stop2-btn")
                            save2_btn = gr.Button("Save run", elem_id="save2-btn")
                        gr.HTML(support.legend_html(None), js_on_load=None)
                        with gr.Row(equal_height=False):
                            racers = [gr.HTML(f'<div class="race-col"><b>{name}</b></div>', js_on_load=None,
                                              elem_id=f"race-{name}") for name in COMPARED]
                        table = gr.Markdown("", elem_id="compare-table")
                        gr.Markdown(CHARTS_HELP)
                        latency_plot = gr.Plot(plots.latency_figure({}), label="Latency", elem_id="latency-plot")
                        with gr.Row():
                            forwards_plot = gr.Plot(plots.forwards_figure({}), label="Tokens per target pass",
                                                    elem_id="forwards-plot")
                            memory_plot = gr.Plot(plots.memory_figure({}), label="Memory traffic",
                                                  elem_id="memory-plot")
                        with gr.Accordion("Why it is fast, in numbers", open=True, elem_id="speed-box"):
                            speed_plot = gr.Plot(panels.speed_figure(None), label="Why it is fast", elem_id="speed-plot")
                            speed_md = gr.Markdown(panels.speed_md(None), elem_id="speed-md")
                        with gr.Accordion("Is it lossless? Sample the next token many times", open=False,
                                          elem_id="lossless-box"):
                            gr.Markdown(LOSSLESS_HELP)
                            with gr.Row():
                                samples = gr.Slider(10, support.MAX_LOSSLESS_SAMPLES, value=100, step=10,
                                                    label="Samples per lane", elem_id="lossless-n")
                                lossless_btn = gr.Button("Sample", elem_id="lossless-btn")
                            lossless_plot = gr.Plot(panels.lossless_figure(None, Counter(), Counter(), "staged", str),
                                                    label="Next-token distribution", elem_id="lossless-plot")
                            lossless_md = gr.Markdown("", elem_id="lossless-md")
                        bench = support.load_benchmark()
                        with gr.Accordion("Benchmark results (python -m specviz.bench)", open=bench is not None):
                            gr.Markdown(support.benchmark_md(bench), elem_id="bench-table")
                            if bench:
                                gr.Plot(plots.benchmark_figure(bench), label="Benchmark", elem_id="bench-plot")

        settings = [prompt, strategy, preset, target, drafts, mode, temperature, top_k, top_p, seed,
                    budget, shape, max_depth, max_branch, lookup, max_new]
        for control in (temperature, top_k, top_p, seed, budget, max_depth, max_branch, lookup, max_new, samples):
            numbers_only(control)
        step_outputs = [session, status, tree_plot, text, caption, counters, accept_plot]
        engine = dict(concurrency_id="engine", concurrency_limit=CONCURRENCY)
        step_btn.click(on_step, [session, *settings], step_outputs, show_progress="minimal", **engine)
        run_btn.click(on_run, [session, *settings], step_outputs, show_progress="hidden", **engine)
        reset_btn.click(on_reset, [session], step_outputs, show_progress="hidden")
        compare_outputs = [session, status, *racers, table, latency_plot, forwards_plot, memory_plot, speed_plot,
                           speed_md]
        compare_btn.click(on_compare, [session, *settings], compare_outputs, show_progress="hidden",
                                        **engine)
        lossless_btn.click(on_lossless, [session, samples, *settings], [session, status, lossless_plot, lossless_md],
                           show_progress="hidden", **engine)
        for button in (stop_btn, stop2_btn):
            # no `cancels`: a cancelled loop could not report; the loop sees Stop and ends after its step
            button.click(on_stop, [session], [session, status], queue=False)
        open_outputs = [session, status, *settings, *step_outputs[2:]]
        open_btn.click(on_open, [session, shipped], open_outputs, show_progress="hidden")
        upload.upload(on_open, [session, upload], open_outputs, show_progress="hidden")
        live_btn.click(on_live, [session], step_outputs, show_progress="hidden")
        for button in (save_btn, save2_btn):
            button.click(on_save, [session], [session, status, saved], show_progress="hidden")
        example.change(lambda name: EXAMPLES.get(name, gr.skip()), [example], [prompt], queue=False)
        preset.change(lambda p: [gr.update(visible=p == support.CUSTOM)] * 2, [preset], [target, drafts], queue=False)
        mode.change(lambda m: [gr.update(visible=m == "sample")] * 4, [mode], [temperature, top_k, top_p, seed],
                    queue=False)
        start_outputs = [*open_outputs, *compare_outputs[2:]]
        demo.load(lambda: on_start(len(start_outputs)), None, start_outputs, queue=False)
    return demo


def warm_up() -> None:
    """Load the default stack in the background so the first Step is quick."""
    try:
        support.get_stack((support.default_preset(),))
    except Exception as exc:  # noqa: BLE001 - the Step that needs it will show the message
        log.warning("could not preload the offline default models: %s", support.one_line(exc))


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    log.info("default model stack for this machine: %s", support.default_preset())   # measured before any load
    if os.environ.get("SPECVIZ_PRELOAD", "1") != "0":
        threading.Thread(target=warm_up, daemon=True).start()
    demo = build()
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=64)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                theme=gr.themes.Soft(), css=CSS, show_error=False, max_file_size=MAX_BYTES, footer_links=["api", "gradio"])


if __name__ == "__main__":
    main()
