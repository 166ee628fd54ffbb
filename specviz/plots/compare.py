"""Comparing strategies: latency split by phase, tokens per target pass, memory traffic against plain
decoding (the paper's Table 1), and saved benchmark results."""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..decode.metrics import time_split
from .palette import KIND_COLOURS, LINE_COLOUR, OVERHEAD_COLOUR, PROMPT_READ_COLOUR, STRATEGY_COLOURS
from ..decode.trace import Phase, StageInfo
from .common import KIND_WORDS, base_layout, empty_figure, stage_colours

# -- comparing strategies ----------------------------------------------------------------------

def phase_split(stats: dict) -> dict[str, float]:
    """Seconds spent per phase: drafting per stage, verification, and overhead (metrics.time_split)."""
    return time_split(stats.get("phase_s", {}), stats.get("wall_s", 0.0))


def _phase_name(key: str, kinds: dict[int, str]) -> str:
    stage = Phase.stage_of(key)
    if stage is not None:
        return f"drafting: {KIND_WORDS.get(kinds.get(stage), 'stage')} (stage {stage})"
    return {"verify": "verification (target forward)", "overhead": "overhead (bookkeeping, Python)",
            Phase.PROMPT_READ: "the draft model reading the prompt (once)"}[key]


def _phase_colour(key: str, colours: dict[int, str]) -> str:
    stage = Phase.stage_of(key)
    if stage is not None:
        return colours.get(stage, "#000000")
    return {"verify": KIND_COLOURS["target"], "overhead": OVERHEAD_COLOUR, Phase.PROMPT_READ: PROMPT_READ_COLOUR}[key]


def _stage_kinds(stages: dict[str, list[StageInfo]]) -> tuple[dict[int, str], dict[int, str]]:
    """Per stage index: its kind and colour, from the first strategy that has that stage."""
    kinds, colours = {}, {}
    for lane in stages.values():
        for index, (stage, colour) in enumerate(zip(lane, stage_colours(lane))):
            kinds.setdefault(index, stage.kind)
            colours.setdefault(index, colour)
    return kinds, colours


def latency_figure(stats: dict[str, dict], stages: dict[str, list[StageInfo]] | None = None) -> go.Figure:
    """Stacked bars per strategy: time per generated token and in total, split by phase (drafting
    coloured by the stage's kind, as in the tree)."""
    title = "Latency, split into drafting, verification and overhead"
    stats = {k: v for k, v in stats.items() if v}
    if not stats:
        return empty_figure("Press Compare to race the strategies.", title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per generated token (ms)", "whole generation (s)"))
    splits = {s: phase_split(v) for s, v in stats.items()}
    keys = sorted({k for split in splits.values() for k in split},
                  key=lambda k: (k == "overhead", k == "verify", k))
    names = list(stats)
    kinds, colours = _stage_kinds(stages or {})
    for key in keys:
        per_token = [1000 * splits[s].get(key, 0.0) / max(stats[s]["new_tokens"], 1) for s in names]
        total = [splits[s].get(key, 0.0) for s in names]
        label = _phase_name(key, kinds)
        common = dict(name=label, legendgroup=key, marker_color=_phase_colour(key, colours), x=names)
        fig.add_trace(go.Bar(y=per_token, hovertemplate="%{x}: %{y:.1f} ms per token<extra>" + label
                             + "</extra>", **common), row=1, col=1)
        fig.add_trace(go.Bar(y=total, showlegend=False, hovertemplate="%{x}: %{y:.2f} s<extra>"
                             + label + "</extra>", **common), row=1, col=2)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="ms per token", row=1, col=1)
    fig.update_yaxes(title="seconds", row=1, col=2)
    return base_layout(fig, title, 420)


def forwards_figure(stats: dict[str, dict]) -> go.Figure:
    """Tokens produced per target forward pass, one bar per strategy."""
    title = "Tokens per target pass (higher is better)"
    stats = {k: v for k, v in stats.items() if v}
    if not stats:
        return empty_figure("Press Compare to race the strategies.", title)
    fig = go.Figure()
    for name, s in stats.items():
        value = s.get("tokens_per_target_forward", 0.0)
        fig.add_trace(go.Bar(x=[name], y=[value], name=name, marker_color=STRATEGY_COLOURS.get(name, "#000000"),
                             text=[f"{value:.2f}"], textposition="outside",
                             hovertemplate=f"{name}: {value:.2f} tokens per target forward "
                                           f"({s.get('target_forwards', 0)} forwards for {s.get('new_tokens', 0)} "
                                           "tokens)<extra></extra>"))
    top = max(s.get("tokens_per_target_forward", 0.0) for s in stats.values())
    fig.update_yaxes(title="tokens per target forward", range=[0, 1.2 * max(top, 1.0)])
    return base_layout(fig, title, 380)


def memory_figure(stats: dict[str, dict], stages: dict[str, list[StageInfo]] | None = None) -> go.Figure:
    """Bytes read per generated token relative to plain decoding, stacked by model (paper's Table 1),
    each model in its stage's colour."""
    title = "Memory traffic per token vs baseline (lower is better)"
    stats = {k: v for k, v in stats.items() if v and v.get("bytes_relative_to_baseline")}
    if not stats:
        return empty_figure("Press Compare to race the strategies.", title)
    models: list[str] = []
    for s in stats.values():
        models += [m for m in s.get("bytes_read", {}) if m not in models]
    fig = go.Figure()
    names = list(stats)
    by_name = {st.name: c for lane in (stages or {}).values() for st, c in zip(lane, stage_colours(lane))}
    for i, model in enumerate(models):
        shares = []
        for s in stats.values():
            total = sum(s["bytes_read"].values())
            baseline = total / s["bytes_relative_to_baseline"]
            shares.append(s["bytes_read"].get(model, 0.0) / baseline)
        colour = KIND_COLOURS["target"] if i == 0 else by_name.get(model, KIND_COLOURS["model"])
        role = "target" if i == 0 else "draft"
        fig.add_trace(go.Bar(x=names, y=shares, name=f"{role}: {model}", marker_color=colour,
                             hovertemplate="%{x}: %{y:.2f}× baseline bytes per token<extra>" + model + "</extra>"))
    totals = [s["bytes_relative_to_baseline"] for s in stats.values()]
    fig.add_trace(go.Scatter(x=names, y=totals, mode="text", text=[f"{t:.2f}×" for t in totals],
                             textposition="top center", showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=names, y=[1.0] * len(names), mode="lines", name="plain decoding = 1.0",
                             line=dict(color=LINE_COLOUR, dash="dash", width=2), hoverinfo="skip"))
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_yaxes(title="bytes read per token ÷ baseline", range=[0, 1.2 * max(*totals, 1.0)])
    return base_layout(fig, title, 400)


def benchmark_figure(bench: dict | None) -> go.Figure:
    """Grouped bars from the benchmark command's JSON: median tokens/s per strategy and sampling."""
    title = "Benchmark: median tokens per second (labels: speed-up vs HF generate)"
    results = (bench or {}).get("results") or []
    if not results:
        return empty_figure("No benchmark results yet.", title, 300)
    fig = go.Figure()
    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    for sampling, colour in zip(dict.fromkeys(r["sampling"] for r in results), ["#0072B2", "#E69F00", "#009E73",
                                                                                 "#CC79A7"]):
        rows = {r["strategy"]: r for r in results if r["sampling"] == sampling}
        ys = [rows[s]["tokens_per_s_median"] if s in rows else None for s in strategies]
        text = [f"{rows[s]['speedup_vs_hf_generate']:.2f}×" if s in rows and rows[s].get("speedup_vs_hf_generate")
                else "" for s in strategies]
        fig.add_trace(go.Bar(x=strategies, y=ys, name=sampling, marker_color=colour, text=text,
                             textposition="outside",
                             hovertemplate="%{x}: %{y:.1f} tokens/s (speed-up vs HF generate %{text})<extra>"
                                           + sampling + "</extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="tokens per second (median)", rangemode="tozero")
    subtitle = " · ".join(str(bench.get(k)) for k in ("machine", "date") if bench.get(k))
    return base_layout(fig, title + (f"<br><sup>{html.escape(subtitle)}</sup>" if subtitle else ""), 400)
