"""specviz: watch staged speculative decoding, one step at a time.  Run: `python app.py`.

The page: layout and wiring only. Every picture is built from the engine's step traces (specviz/plots.py);
the handlers, settings, shared models, sessions, the race and the words live in specviz/app/.
Models are loaded once per model stack and shared read-only; identical requests share one decode, and each
browser session keeps its own place in it in gr.State.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter

import gradio as gr

from specviz import plots
from specviz.profile.environment import env_number
from specviz.app import bench_panel, live, panels, regime, replay, stacks, words
from specviz.app import settings as app_settings
from specviz.app.compare_events import NOT_MEASURED, on_compare
from specviz.app.events import on_lossless, on_reset, on_run, on_step, on_stop
from specviz.app.race import SHOWN
from specviz.app.replay_events import on_live, on_open, on_save, on_start
from specviz.app.texts import CSS, HELP, MEASURED_TITLE, MORE_TITLE, TITLE
from specviz.decode.tree import SHAPES
from specviz.models.prompt_format import default_format
from specviz.recording import MAX_BYTES
from specviz.stack.strategies import AUTO_SHAPE, STAGED_LOOKUP, STRATEGIES

log = logging.getLogger("specviz.app")
# Events in progress at once: each computes on the one compute thread in turn (specviz/app/compute.py), so more of
# them interleave more finely and use no more cores; beyond them a visitor waits in Gradio's queue, which shows their
# place and an estimate, and beyond QUEUE_SIZE waiting Gradio turns new events away
CONCURRENCY = int(env_number("SPECVIZ_CONCURRENCY", 16))
QUEUE_SIZE = int(env_number("SPECVIZ_QUEUE_SIZE", 128))
EXAMPLES = app_settings.example_prompts()

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


# -- plots that download as pictures for slides ------------------------------------------------------

def download_js(elem_id: str, image_format: str) -> str:
    """A click that saves the plot as the browser draws it, through plotly's own export (gradio's plotly page puts
    `Plotly` on the window): SVG for slides that scale, PNG at twice the size on screen for slides that do not."""
    name = f"specviz-{elem_id.removesuffix('-plot')}"
    scale = 2 if image_format == "png" else 1
    return (f"() => {{ const plot = document.querySelector('#{elem_id} .js-plotly-plot'); if (plot && window.Plotly) "
            f"window.Plotly.downloadImage(plot, {{format: '{image_format}', filename: '{name}', scale: {scale}}}); }}")


def figure_plot(value, label: str, elem_id: str, **kwargs) -> gr.Plot:
    """A plot with SVG and PNG buttons in its corner. plotly's own camera button saves one format per figure (its
    `toImageButtonOptions`), and gr.Plot passes no plotly config, so the two formats are gradio buttons that run
    plotly's export in the browser (no round trip to the server)."""
    buttons = {image_format: gr.Button(image_format.upper(), size="sm", elem_id=f"{elem_id}-{image_format}")
               for image_format in ("svg", "png")}
    plot = gr.Plot(value, label=label, elem_id=elem_id, buttons=list(buttons.values()), **kwargs)
    for image_format, button in buttons.items():
        button.click(None, js=download_js(elem_id, image_format), queue=False)
    return plot


# -- the page --------------------------------------------------------------------------------------

LANE_MIN_PX = 300       # a lane's column: its text box stays 280 px or wider (3 columns at 1440x900, 2 at 1280x720)


def help_text(view: str, elem_id: str | None = None) -> None:
    """A view's help: two sentences you can see, the rest in a fold."""
    gr.Markdown(HELP[view].shown, elem_id=elem_id)
    if HELP[view].more:
        with gr.Accordion(MORE_TITLE, open=False, elem_id=f"{view}-more"):
            gr.Markdown(HELP[view].more)


def build() -> gr.Blocks:
    preset_default = stacks.default_preset()
    staged = stacks.staged_available(preset_default)
    default_strategy = "staged" if staged else "tree"
    # with a draft model, code as in the paper; with context lookup alone, text that repeats itself
    default_example = next((k for k in EXAMPLES if k.startswith("HumanEval")), None) if staged else None
    default_example = default_example or app_settings.PATTERN_EXAMPLE
    with gr.Blocks(title="specviz: staged speculative decoding") as demo:
        # no time_to_live or delete_callback: with either, the server answered new visitors seconds late
        # after each run (measured with gradio_client); specviz/app/decoder_slots.py bounds live decoders instead
        session = gr.State(None)
        gr.Markdown(TITLE)
        help_text("intro", elem_id="intro")
        status = gr.Markdown("", elem_id="status")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                live_line = gr.Markdown(live.line(), elem_id="live-status")
                example = gr.Dropdown(list(EXAMPLES), value=default_example, label="Example prompts",
                                      elem_id="examples",
                                      info="HumanEval coding tasks (as in the paper) and a few plain-language ones")
                prompt = gr.Textbox(EXAMPLES[default_example], label="Prompt", lines=7, max_lines=14,
                                    elem_id="prompt")
                prompt_format = gr.Radio(list(app_settings.PROMPT_FORMATS),
                                         value=default_format(EXAMPLES[default_example]), label="Prompt format",
                                         elem_id="prompt-format",
                                         info="chat: inside the model's chat template, as an instruct model expects "
                                              "(grey in the text) · completion: continued as written")
                strategy = gr.Radio(list(STRATEGIES), value=default_strategy, label="Strategy", elem_id="strategy",
                                    info="baseline: no guessing · speculative: one draft, a chain · tree: one draft, "
                                         "a tree · staged: a tree, with the draft itself sped up by an n-gram, plus "
                                         "a branch copied from earlier in the text")
                max_new = gr.Slider(1, app_settings.MAX_NEW_TOKENS, value=app_settings.DEFAULT_NEW_TOKENS, step=1,
                                    label="Max new tokens", elem_id="max-new-tokens")
                with gr.Accordion("Models", open=False):
                    preset = gr.Dropdown(app_settings.preset_choices(), value=preset_default,
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
                    budget = gr.Slider(1, app_settings.MAX_BUDGET, value=app_settings.DEFAULT_BUDGET, step=1,
                                       label="Tree budget (guessed tokens per step)")
                    shape = gr.Dropdown([AUTO_SHAPE, *SHAPES], value=AUTO_SHAPE, label="Tree shape",
                                        info="auto: chain for speculative, dynamic (grown where the draft is "
                                             "confident) otherwise")
                    max_depth = gr.Slider(1, 32, value=8, step=1, label="Max depth")
                    max_branch = gr.Slider(1, 8, value=4, step=1, label="Max branches per node")
                    lookup = gr.Slider(0, app_settings.MAX_LOOKUP, value=STAGED_LOOKUP, step=1,
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
                                tree_plot = figure_plot(plots.tree_figure(None), label="Speculative tree",
                                                        elem_id="tree-plot")
                                help_text("tree")
                            with gr.Column(scale=2):
                                text = gr.HTML(words.text_html("", [], None), elem_id="gen-text", js_on_load=None)
                                caption = gr.Markdown("", elem_id="caption")
                                counters = gr.Markdown("No tokens yet.", elem_id="counters")
                                help_text("text")
                        accept_plot = figure_plot(plots.acceptance_figure([]), label="Acceptance per tree position",
                                                  elem_id="accept-plot")
                        help_text("accept")
                    with gr.Tab("Compare", id="compare"):
                        help_text("compare", elem_id="compare-help")
                        with gr.Row():
                            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                            stop2_btn = gr.Button("Stop", variant="stop", elem_id="stop2-btn")
                            save2_btn = gr.Button("Save run", elem_id="save2-btn")
                        gr.HTML(words.legend_html(None), js_on_load=None)
                        racers = []
                        with gr.Row(equal_height=False, elem_id="lanes"):
                            for name in SHOWN:
                                with gr.Column(min_width=LANE_MIN_PX):
                                    racers.append(gr.HTML(f'<div class="race-col"><b>{name}</b></div>', js_on_load=None,
                                                          elem_id=f"race-{name}"))
                        with gr.Accordion(MEASURED_TITLE, open=False, elem_id="measured-box"):
                            measured = gr.Markdown(NOT_MEASURED, elem_id="measured-md")
                        table = gr.Markdown("", elem_id="compare-table")
                        help_text("charts")
                        latency_plot = figure_plot(plots.latency_figure({}), label="Latency", elem_id="latency-plot")
                        with gr.Row():
                            forwards_plot = figure_plot(plots.forwards_figure({}), label="Tokens per target pass",
                                                        elem_id="forwards-plot")
                            memory_plot = figure_plot(plots.memory_figure({}), label="Memory traffic",
                                                      elem_id="memory-plot")
                        with gr.Accordion("Why it is fast, in numbers", open=True, elem_id="speed-box"):
                            speed_plot = figure_plot(panels.speed_figure(None), label="Why it is fast",
                                                     elem_id="speed-plot")
                            speed_md = gr.Markdown(panels.speed_md(None), elem_id="speed-md")
                            regime_plot = figure_plot(regime.regime_figure(None), label="The regime",
                                                      elem_id="regime-plot")
                            regime_md = gr.Markdown(regime.regime_md(None), elem_id="regime-md")
                        with gr.Accordion("Is it lossless? Sample the next token many times", open=False,
                                          elem_id="lossless-box"):
                            help_text("lossless")
                            with gr.Row():
                                samples = gr.Slider(10, app_settings.MAX_LOSSLESS_SAMPLES, value=100, step=10,
                                                    label="Samples per lane", elem_id="lossless-n")
                                lossless_btn = gr.Button("Sample", elem_id="lossless-btn")
                            lossless_plot = figure_plot(
                                panels.lossless_figure(None, Counter(), Counter(), "staged", str),
                                label="Next-token distribution", elem_id="lossless-plot")
                            lossless_md = gr.Markdown("", elem_id="lossless-md")
                        benchmark = bench_panel.load_benchmark()
                        shown = bench_panel.benchmark_for(preset_default, benchmark)
                        with gr.Accordion("Benchmark results (python -m specviz.bench)", open=shown is not None):
                            bench_md = gr.Markdown(bench_panel.panel_md(preset_default, benchmark),
                                                   elem_id="bench-table")
                            bench_plot = figure_plot(plots.benchmark_figure(shown) if shown else None,
                                                     label="Benchmark", elem_id="bench-plot",
                                                     visible=shown is not None)

        controls = dict(prompt=prompt, strategy=strategy, preset=preset, target=target, drafts=drafts,
                        sampling_mode=mode, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                        budget=budget, shape=shape, max_depth=max_depth, max_branch=max_branch, lookup=lookup,
                        max_new_tokens=max_new, prompt_format=prompt_format)
        settings = [controls[name] for name in app_settings.SETTING_NAMES]      # every control, by name
        for control in (temperature, top_k, top_p, seed, budget, max_depth, max_branch, lookup, max_new, samples):
            numbers_only(control)
        step_outputs = [session, status, tree_plot, text, caption, counters, accept_plot]
        engine = dict(concurrency_id="engine", concurrency_limit=CONCURRENCY)
        step_btn.click(on_step, [session, *settings], step_outputs, show_progress="minimal", **engine)
        run_btn.click(on_run, [session, *settings], step_outputs, show_progress="hidden", **engine)
        reset_btn.click(on_reset, [session], step_outputs, show_progress="hidden")
        compare_outputs = [session, status, *racers, measured, table, latency_plot, forwards_plot, memory_plot,
                           speed_plot, speed_md, regime_plot, regime_md]
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
        example.change(lambda name: (EXAMPLES[name], default_format(EXAMPLES[name])) if name in EXAMPLES else
                       (gr.skip(), gr.skip()), [example], [prompt, prompt_format], queue=False)
        preset.change(lambda p: [gr.update(visible=p == app_settings.CUSTOM)] * 2, [preset], [target, drafts],
                      queue=False)
        preset.change(lambda p: bench_panel.panel_update(p, benchmark), [preset], [bench_md, bench_plot], queue=False)
        mode.change(lambda m: [gr.update(visible=m == "sample")] * 4, [mode], [temperature, top_k, top_p, seed],
                    queue=False)
        timer = gr.Timer(2.0, active=not live.ready())       # the live-mode line, while the models get ready
        timer.tick(lambda: (live.line(), gr.Timer(active=not live.ready())), None, [live_line, timer], queue=False,
                   show_progress="hidden", api_name="live_line")
        start_outputs = [*open_outputs, *compare_outputs[2:]]
        # named, as the live line's tick is, so a script (tests/test_space.py) sees what a new page shows
        demo.load(lambda: on_start(len(start_outputs)), None, start_outputs, queue=False, api_name="on_start")
    return demo


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    try:
        log.info("default model stack for this machine: %s", stacks.default_preset())   # measured before any load
    except ValueError as exc:        # SPECVIZ_PRESET names no preset
        raise SystemExit(f"specviz: {exc}") from None
    if os.environ.get("SPECVIZ_PRELOAD", "1") != "0":        # the default stack loads while the page answers
        threading.Thread(target=live.get_ready, daemon=True).start()
    else:
        live.skip()
    demo = build()
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                theme=gr.themes.Soft(), css=CSS, show_error=False, max_file_size=MAX_BYTES,
                max_threads=max(40, 2 * CONCURRENCY + 8),      # an event in progress waits on a thread of these
                footer_links=["api", "gradio"])


if __name__ == "__main__":
    main()
