"""The Compare tab's two explaining panels, drawn from trace records and sample counts alone:
*why it is fast* (specviz.analysis.speed_model: the chain formula, tokens per pass and speed, predicted vs
measured, and the tree shape the cost model would pick) and *is it lossless* (specviz.analysis.lossless:
next-token counts of plain and speculative sampling beside the target's exact distribution)."""
from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis.lossless import ChiSquare
from ..analysis.markdown import md_table
from ..plots.palette import KIND_COLOURS, STRATEGY_COLOURS
from ..plots import base_layout, empty_figure, token_label
from ..analysis.speed_model import best_chain, chain_curve, explain, fit_costs, seconds_per_token
from ..decode.trace import StepRecord

EXPLAINED = ("speculative", "tree", "staged")
CHAIN_LENGTHS = range(0, 11)


def speed_view(lanes: dict[str, list[StepRecord]]) -> dict | None:
    """Everything the panel shows, from the race lanes' steps; None until baseline and a
    speculating lane have run."""
    baseline_s = seconds_per_token(lanes.get("baseline") or [])
    explained = {name: explain(lanes[name], baseline_s) for name in EXPLAINED if lanes.get(name)}
    explained = {name: e for name, e in explained.items() if e is not None}
    if not baseline_s or not explained:
        return None
    chain = "speculative" if "speculative" in explained else next(iter(explained))
    others = [s for name, steps in lanes.items() if name != chain for s in steps]
    costs = fit_costs(lanes[chain], others)
    alpha = explained[chain].alpha
    curve = chain_curve(alpha, costs, baseline_s, CHAIN_LENGTHS)
    return {"explained": explained, "alpha": alpha, "chain_lane": chain, "costs": costs, "curve": curve,
            "best_chain": best_chain(curve)}


def speed_md(view: dict | None) -> str:
    if view is None:
        return "*Run **Compare** (baseline and at least one speculating lane) to fill this panel.*"

    def fmt(x, unit=""):
        return "–" if x is None else f"{x:.2f}{unit}"

    rows = [[name, f"{e.tree_size:.1f}", f"{e.alpha:.2f}", f"{e.tokens_measured:.2f}", f"{e.tokens_predicted:.2f}",
             fmt(e.speedup_measured, "×"), fmt(e.speedup_predicted, "×")] for name, e in view["explained"].items()]
    c = view["costs"]
    text = [md_table(["strategy", "guesses per round", "α", "tokens per pass", "predicted", "speed-up", "predicted"],
                     rows, "lrrrrrr"),
            "Speed-up is against baseline's tokens per second; α is the chance the draft's first "
            "choice is accepted once its parent was.",
            f"**A chain** of k guesses, each accepted with chance α = {view['alpha']:.2f} once the one before it was, "
            f"gives (1 − α^(k+1)) / (1 − α) tokens per target pass. **A tree** gives 1 + the sum over its boxes of "
            "the chance that the whole path to the box is accepted (from the acceptance per child rank measured in "
            "this race). *Predicted* speed = predicted tokens per pass ÷ this race's seconds per round.",
            f"Costs fitted to this race's clocks: a verification pass takes {c.verify_fixed * 1e3:.0f} ms + "
            f"{c.verify_per_token * 1e3:.1f} ms per token verified; one {view['chain_lane']} draft forward "
            f"{c.draft_per_forward * 1e3:.1f} ms."]
    best = view["best_chain"]
    if best:
        text.append(f"**Best chain length (a prediction):** for α = {view['alpha']:.2f} and these costs, a chain of "
                    f"{best['k']} guess{'es' if best['k'] != 1 else ''}: {best['tokens']:.2f} tokens per pass, "
                    f"{best['speedup']:.2f}× baseline. Longer chains add verification and drafting time faster than "
                    "they add accepted tokens once α^k is small.")
    return "\n\n".join(text)


def speed_figure(view: dict | None) -> go.Figure:
    title = "Why it is fast: tokens per target pass and speed, by draft length"
    if view is None:
        return empty_figure("Run Compare to see the chain formula against this race.", title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per target pass", "speed-up vs baseline (predicted)"))
    ks = [p["k"] for p in view["curve"]]
    label = f"chain, α = {view['alpha']:.2f} (formula)"
    fig.add_trace(go.Scatter(x=ks, y=[p["tokens"] for p in view["curve"]], mode="lines", name=label,
                             line=dict(color="#555555")), 1, 1)
    if all(p["speedup"] is not None for p in view["curve"]):
        fig.add_trace(go.Scatter(x=ks, y=[p["speedup"] for p in view["curve"]], mode="lines", showlegend=False,
                                 name=label, line=dict(color="#555555", dash="dash")), 1, 2)
    for name, e in view["explained"].items():
        colour = STRATEGY_COLOURS.get(name, "#000000")
        point = dict(mode="markers", marker=dict(size=13, color=colour, symbol="diamond"))
        hover = f"{name}: %{{y:.2f}} tokens per pass with %{{x:.1f}} guesses<extra></extra>"
        fig.add_trace(go.Scatter(x=[e.tree_size], y=[e.tokens_measured], name=f"{name} (measured)", **point,
                                 hovertemplate=hover), 1, 1)
        if e.speedup_measured is not None:
            fig.add_trace(go.Scatter(x=[e.tree_size], y=[e.speedup_measured], showlegend=False, name=name, **point,
                                     hovertemplate=f"{name}: %{{y:.2f}}× measured<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="guesses per round (k)")
    base_layout(fig, title, 440)
    fig.update_layout(legend=dict(y=-0.25), margin=dict(b=90))
    return fig


def lossless_figure(exact: torch.Tensor | None, plain: Counter, spec: Counter, strategy: str,
                    text_of, top: int = 12) -> go.Figure:
    """Shares of the most likely tokens: the target's exact probability beside both sample sets."""
    title = f"Is it lossless? The next token: plain sampling vs {strategy}"
    if exact is None:
        return empty_figure("Press Sample to draw the next token many times.", title)
    tokens = torch.topk(exact, min(top, int((exact > 0).sum()))).indices.tolist()
    labels = [token_label(text_of(t)) for t in tokens]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[float(exact[t]) for t in tokens], name="target's exact probability",
                         marker_color=KIND_COLOURS["target"]))
    for name, counts, colour in (("plain sampling", plain, STRATEGY_COLOURS["baseline"]),
                                 (strategy, spec, STRATEGY_COLOURS.get(strategy, "#0072B2"))):
        n = max(1, sum(counts.values()))
        fig.add_trace(go.Bar(x=labels, y=[counts.get(t, 0) / n for t in tokens], marker_color=colour,
                             name=f"{name}: share of {sum(counts.values())} samples"))
    fig.update_layout(barmode="group", yaxis_title="probability / share")
    return base_layout(fig, title, 380)


def lossless_md(strategy: str, tests: dict[str, ChiSquare], done: tuple[int, int], wanted: int) -> str:
    lines = [f"Samples: plain {done[0]}/{wanted}, {strategy} {done[1]}/{wanted}."]
    for name, test in tests.items():
        lines.append(f"- **{name}**: {test.describe()}")
    if tests:
        worst = min(t.p_value for t in tests.values())
        lines.append("\nA p-value below 0.001 would mean the samples do not follow one distribution: for "
                     f"speculation that would be a bug. Smallest here: **{worst:.3g}** "
                     + ("(consistent with lossless)." if worst >= 1e-3 else "(**not** consistent: please report it)."))
    return "\n".join(lines)
