"""The regime panel (under the race): what verifying k tokens costs on this machine, against one token, for the
target on screen, for llama.cpp on the same GGUF file, and for each precision this CPU runs (one Qwen2-1.5B-
shaped layer). Speculation pays where verifying many tokens costs little more than one (memory-bound: a GPU,
bf16 or AMX units); where it costs nearly k times one (compute-bound: 4-bit products on 2 cores), only cheap
guesses accepted often can beat plain decoding. The analysis it prints is computed from these curves, and so is
staged's tree (specviz/decode/costs.py): the panel shows the curve the plan used and the minimum scores it gives."""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from ..peers import llama_cpp
from ..profile.cost_curve import cost_curve
from ..analysis.markdown import md_table
from ..models.precision import cpu_precisions, probe_seconds, runs_file_blocks
from ..cpu import prompt_reader
from ..cpu.blocks import GGUF
from ..plots import base_layout, empty_figure
from ..decode.costs import TreePlan, describe

SIZES = (1, 2, 4, 8, 16)


_MEASURED: dict[tuple[str, str], dict] = {}      # per target and precision, once per process


def measured(stack) -> bool:
    return (stack.target.name, stack.precision()) in _MEASURED


def regime_view(stack) -> dict:
    """The cost curves for this stack, measured once per target and precision (about 10 s for the 1.5B)."""
    key = (stack.target.name, stack.precision())
    if not measured(stack):
        _MEASURED[key] = _measure(stack)
    return _MEASURED[key]


def _measure(stack) -> dict:
    plan = stack.plans.tree_plan()     # the curve staged's tree is planned from, where the profile has one
    reads = stack.prompt_reads.read(stack.draft_models(), stack.profile)     # how its draft reads prompts, as stored
    if plan is not None:
        ours = {k: plan.target[k] for k in SIZES}
    else:
        with torch.inference_mode():
            ours = cost_curve(stack.target.model, sizes=SIZES, context=128, reps=3)
    gguf, llama, why = llama_cpp.gguf_file(stack.target.name), None, "the target is no GGUF file"
    if gguf is not None:
        try:
            llama, why = llama_cpp.cost_curve(gguf, torch.get_num_threads(), SIZES), ""
        except llama_cpp.LlamaCppMissing as exc:
            why = str(exc)
    on_cpu = stack.target.model.device.type == "cpu"
    probes = {name: curve for name in (probed_precisions() if on_cpu else ())     # what the profile holds
              if (curve := probe_seconds(name, stack.profile)) is not None}
    return {"ours": ours, "llama": llama, "why_no_llama": why, "probes": probes,
            "target": stack.target_name, "precision": stack.precision(),
            "plan": None if plan is None else plan.to_dict(), "prompt_reads": reads}


def probed_precisions() -> tuple[str, ...]:
    """The precisions whose probe layer the panel draws: every one a CPU runs any model in, and a GGUF file's blocks."""
    return cpu_precisions() + ((GGUF,) if runs_file_blocks() else ())


def break_even(ours: dict[int, float], reference_s: float) -> dict[int, float]:
    """Tokens a round verifying k tokens must yield, guesses free, to match a plain decoder at `reference_s` a token."""
    return {k: seconds / reference_s for k, seconds in ours.items()}


def regime_md(view: dict | None) -> str:
    if view is None:
        return "*The cost curves are measured with live models: run **Compare** (not a recording).*"
    ours, llama = view["ours"], view["llama"]
    curves = {f"{view['target']} ({view['precision']}), ours": ours} | ({"llama.cpp on the same GGUF file": llama}
                                                                       if llama else {})
    rows = [[label, *(f"{c[k] * 1e3:.0f} ms ({c[k] / c[1]:.1f}×)" for k in SIZES)] for label, c in curves.items()]
    text = [md_table(["one forward of k tokens", *(f"k = {k}" for k in SIZES)], rows, "l" + "r" * len(SIZES))]
    reference = llama[1] if llama else ours[1]
    who = "llama.cpp's plain decoding" if llama else "our plain decoding"
    need = break_even(ours, reference)
    text.append(f"**Analysis (from these curves, not a measurement of speculation).** To match {who} "
                f"({reference * 1e3:.0f} ms a token), a round that verifies k tokens must yield "
                + ", ".join(f"{need[k]:.1f} tokens at k = {k}" for k in SIZES[1:])
                + ", before any draft model's cost. A round yields at most k tokens (k − 1 guesses and the target's "
                "own): where the need is close to k or above it, only guesses that cost nothing and are nearly always "
                "accepted (context lookup, an n-gram) can pay, and a draft model's forwards cannot.")
    if view.get("plan"):
        plan = TreePlan.from_dict(view["plan"])
        text.append(f"**Staged's tree here is planned from this curve**: {describe(plan)}. Cheaper verification, "
                    f"bigger trees. *Curves {plan.source}.*")
    for spec, choice in (view.get("prompt_reads") or {}).items():
        text.append(f"**{spec}**: {prompt_reader.describe(choice)}.")
    if not llama:
        text.append(f"*llama.cpp's curve is missing: {view['why_no_llama']}.*")
    if view["probes"]:
        fast = min(view["probes"], key=lambda p: view["probes"][p][1])
        text.append("Per precision (one Qwen2-1.5B-shaped layer): verifying 16 tokens costs "
                    + ", ".join(f"{p} {c[16] / c[1]:.1f}×" for p, c in view["probes"].items())
                    + f" one token; {fast} reads one token fastest. What would change the regime: more cores, bf16 or "
                    "AMX units (bfloat16 batches cheaply where the CPU has them), a GPU.")
    return "\n\n".join(text)


def regime_figure(view: dict | None) -> go.Figure:
    title = "The regime: one forward of k tokens, against one token"
    if view is None:
        return empty_figure("Run Compare with live models to measure the cost curves.", title)
    fig = go.Figure()
    ks = list(SIZES)
    fig.add_trace(go.Scatter(x=ks, y=ks, mode="lines", name="k× (compute-bound: speculation cannot pay)",
                             line=dict(color="#999999", dash="dot")))
    fig.add_trace(go.Scatter(x=ks, y=[1.0] * len(ks), mode="lines", name="1× (memory-bound: the paper's regime)",
                             line=dict(color="#999999", dash="dash")))
    curves = {f"{view['target']} ({view['precision']}), ours": view["ours"]}
    if view["llama"]:
        curves["llama.cpp, same GGUF file"] = view["llama"]
    curves |= {f"{name}, one 1.5B layer": curve for name, curve in view["probes"].items()}
    for label, curve in curves.items():
        fig.add_trace(go.Scatter(x=ks, y=[curve[k] / curve[1] for k in ks], mode="lines+markers", name=label))
    base_layout(fig, title, 480)
    fig.update_layout(xaxis_title="tokens fed to one forward (k)", yaxis_title="cost relative to one token",
                      legend=dict(y=-0.2))            # below the axis title
    return fig
