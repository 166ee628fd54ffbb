"""The benchmark panel under the race: a saved run of `python -m specviz.bench` of the stack on screen, or, where none
was saved for it, one line telling how to make one (a run of another stack, or another machine's, answers nothing
about the race above it)."""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..analysis.markdown import md_table
from ..stack.presets import PRESETS
from ..stack.stack import default_drafts
from .settings import BENCHMARK_FILE


def load_benchmark(path: Path = BENCHMARK_FILE) -> dict | None:
    """The benchmark command's JSON, or None when it is absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("results"), list) else None


def benchmark_md(bench: dict | None) -> str:
    if not bench:
        return ("*No benchmark results yet.* The benchmark command (`python -m specviz.bench`) writes "
                "`docs/benchmarks/latest.json`; its results appear here.")
    def fmt(value, pattern):
        return pattern.format(value) if isinstance(value, (int, float)) else "–"

    rows = [[r.get("strategy", "?"), r.get("sampling", "?"), fmt(r.get("tokens_per_s_median"), "{:.1f}"),
             fmt(r.get("speedup_vs_hf_generate"), "{:.2f}×"), fmt(r.get("tokens_per_target_forward"), "{:.2f}"),
             fmt(r.get("bytes_relative_to_baseline"), "{:.2f}×"),
             f"{fmt(r.get('exact_match'), '{}')} / {r.get('prompts', '?')}"] for r in bench["results"]]
    table = md_table(["strategy", "sampling", "tokens/s (median)", "speed-up vs HF generate", "tokens per target pass",
                      "memory traffic vs baseline", "identical outputs"], rows, "llrrrrr")
    command = f"\n\nCommand: `{bench['command']}`" if bench.get("command") else ""
    return benchmark_label(bench) + "\n\n" + table + command


def benchmark_label(bench: dict) -> str:
    """What a saved benchmark shows: its stack, precision, machine and date, said plainly, since it ran at another
    time, and maybe on another machine, than the race above it."""
    settings = bench.get("settings") or {}
    stack = " + ".join(map(str, [settings.get("target", "?"), *settings.get("drafts", [])]))
    precision = settings.get("precision") or settings.get("dtype") or "?"
    return html.escape(f"A saved benchmark run of this stack, not the race above: {stack} in {precision}, "
                       f"{settings.get('prompts', '?')} prompts × {settings.get('max_new_tokens', '?')} new tokens, "
                       f"on {bench.get('machine', 'an unnamed machine')}, {bench.get('date', 'undated')}.")


def stack_of(preset: str) -> tuple[str, tuple[str, ...]] | None:
    """A preset's target and drafters, as the bench writes them in its settings."""
    if preset not in PRESETS:
        return None
    chosen = PRESETS[preset]
    return chosen.target, tuple(chosen.drafts if chosen.drafts is not None else default_drafts())


def benchmark_for(preset: str, bench: dict | None) -> dict | None:
    """The saved benchmark where it ran this preset's models, else None."""
    settings = (bench or {}).get("settings") or {}
    ran = (settings.get("target"), tuple(settings.get("drafts") or ()))
    return bench if bench and ran == stack_of(preset) else None


def panel_md(preset: str, bench: dict | None) -> str:
    """The panel's words for the stack on screen."""
    shown = benchmark_for(preset, bench)
    if shown is not None:
        return benchmark_md(shown)
    return (f"*No saved benchmark of this stack ({html.escape(preset)}).* `python -m specviz.bench --preset "
            f"{html.escape(preset)} --out docs/benchmarks/latest.json` makes one, and it shows here.")


def panel_update(preset: str, bench: dict | None) -> tuple:
    """The panel's words and chart after the visitor picks another preset."""
    import gradio as gr

    from ..plots import benchmark_figure
    shown = benchmark_for(preset, bench)
    figure = benchmark_figure(shown) if shown else None
    return panel_md(preset, bench), gr.update(value=figure, visible=shown is not None)
