"""Per-prompt comparisons and their summary (medians of ratios), the printed table, the JSON report
and its charts."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..peers import llama_cpp
from ..stack.strategies import STRATEGIES
from ..analysis.markdown import md_table
from ..decode.metrics import time_split
from ..decode.trace import Phase
from ..analysis.round_cost import RoundCost, analysis, read_share
from .settings import ALL_STRATEGIES


def reference_strategy(rows: list[dict]) -> str | None:
    """The fastest plain decoder this run measured: llama.cpp's where it ran, else our baseline, else none."""
    ran = {r["strategy"] for r in rows}
    return next((name for name in (llama_cpp.PLAIN, "baseline") if name in ran), None)


def compare_rows(rows: list[dict]) -> list[dict]:
    """Add per-prompt comparisons with the reference (the fastest plain decoder), our baseline, HF generate and
    HF assisted generation; drop the token lists and texts."""
    by_key = {(r["prompt"], r["sampling"], r["strategy"]): r for r in rows}
    reference = reference_strategy(rows)
    out = []
    for r in rows:
        base = by_key.get((r["prompt"], r["sampling"], "baseline"))
        hf = by_key.get((r["prompt"], r["sampling"], "hf_generate"))
        assisted = by_key.get((r["prompt"], r["sampling"], "hf_assisted"))
        ref = by_key.get((r["prompt"], r["sampling"], reference))
        speculative = by_key.get((r["prompt"], r["sampling"], "speculative"))
        n = len(r["tokens"])
        rate = n / r["wall_s"] if r["wall_s"] > 0 else 0.0
        # tokens kept: runs can be compared token for token
        row = {k: v for k, v in r.items() if not k.startswith("_")}
        row.update(new_tokens=n, tokens_per_s=rate,
                   tokens_per_target_forward=n / r["target_forwards"] if r["target_forwards"] else None,
                   baseline_bytes_per_token=base and base["bytes_per_token"],
                   bytes_relative_to_baseline=ratio(r["bytes_per_token"], base and base["bytes_per_token"]),
                   speedup_vs_baseline=ratio(rate, base and _rate(base)),
                   speedup_vs_hf_generate=ratio(rate, hf and _rate(hf)),
                   speedup_vs_hf_assisted=ratio(rate, assisted and _rate(assisted)),
                   speedup_vs_reference=ratio(rate, ref and _rate(ref)),
                   speedup_vs_speculative=ratio(rate, speculative and _rate(speculative)),
                   exact=(same_output(r, base) and r.get("repeats_agree", True)
                          if base is not None and r["sampling"] == "greedy" else None))
        out.append(row)
    return out


def same_output(row: dict, base: dict) -> bool:
    """Whether a row wrote baseline's output: the same token ids; llama.cpp's text (tokenized again by us)
    is compared as text, over the shorter of the two."""
    if row["strategy"] in llama_cpp.PEERS:
        return llama_cpp.same_text(base["_text"], row["_text"])
    return row["tokens"] == base["tokens"]


def _rate(row: dict) -> float:
    return len(row["tokens"]) / row["wall_s"] if row["wall_s"] > 0 else 0.0


def ratio(a, b):
    return a / b if a is not None and b else None


def summarise(per_prompt: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in per_prompt:
        groups[(row["sampling"], row["strategy"])].append(row)
    results = []
    plain = {sampling: _decode_token_s(rows) for (sampling, strategy), rows in groups.items() if strategy == "baseline"}
    shares = {sampling: _read_share(rows) for (sampling, strategy), rows in groups.items() if strategy == "baseline"}
    for (sampling, strategy), rows in groups.items():
        rates = [r["tokens_per_s"] for r in rows]
        tokens = sum(r["new_tokens"] for r in rows)
        forwards = sum(r["target_forwards"] for r in rows)
        engine = strategy in STRATEGIES
        results.append({
            "strategy": strategy, "sampling": sampling,
            "tokens_per_s_median": float(np.median(rates)),
            "tokens_per_s_p25": float(np.percentile(rates, 25)),
            "tokens_per_s_p75": float(np.percentile(rates, 75)),
            "speedup_vs_hf_generate": median(r["speedup_vs_hf_generate"] for r in rows),
            "speedup_vs_hf_assisted": median(r.get("speedup_vs_hf_assisted") for r in rows),
            "speedup_vs_baseline": median(r["speedup_vs_baseline"] for r in rows),
            "speedup_vs_reference": median(r.get("speedup_vs_reference") for r in rows),
            "speedup_vs_speculative": median(r.get("speedup_vs_speculative") for r in rows),
            "lowest_vs_baseline": lowest(rows),
            "tokens_per_target_forward": tokens / forwards if forwards else None,
            "mean_accepted_per_target_forward": (
                sum(r["mean_accepted_per_target_forward"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)
                if engine else None),
            "bytes_relative_to_baseline": _bytes_relative(rows) if engine else None,
            "phase_share": _phase_share(rows) if engine else None,
            "forward_share": (sum(r["forward_s"] for r in rows) / sum(r["wall_s"] for r in rows)
                              if all(r["forward_s"] is not None for r in rows) else None),
            "exact_match": sum(bool(r["exact"]) for r in rows) if rows[0]["exact"] is not None else None,
            "prompts": len(rows),
            "rounds": (_round_cost(rows, plain.get(sampling), shares.get(sampling, 0.0))
                       if engine and strategy != "baseline" else None),
            "priced": priced_summary(rows),
        })
    order = {s: i for i, s in enumerate(ALL_STRATEGIES)}
    return sorted(results, key=lambda r: (r["sampling"] != "greedy", r["sampling"], order[r["strategy"]]))


def lowest(rows: list[dict], ratio_of=lambda row: row.get("speedup_vs_baseline")) -> dict | None:
    """The prompt this strategy ran slowest on against our baseline (or by `ratio_of`): its ratio and the prompt's
    id."""
    ratios = [(ratio_of(r), r["prompt"]) for r in rows if ratio_of(r) is not None]
    if not ratios:
        return None
    worst, prompt = min(ratios)
    return {"ratio": worst, "prompt": prompt}


NO_REGRET = 0.97        # the least a speculating strategy may run at against plain decoding, on any prompt


def regret_line(results: list[dict]) -> str:
    """Whether speculative and staged ran at NO_REGRET or more of our baseline's speed on every prompt, or which
    prompts fell under it."""
    checked = [r for r in results if r["strategy"] in ("speculative", "staged") and r.get("lowest_vs_baseline")]
    if not checked:
        return ""
    under = [f"{r['strategy']} ({r['sampling']}) {r['lowest_vs_baseline']['ratio']:.2f}x on "
             f"{r['lowest_vs_baseline']['prompt']}" for r in checked if r["lowest_vs_baseline"]["ratio"] < NO_REGRET]
    if not under:
        return f"no regret: every prompt ran at {NO_REGRET:.2f}x our baseline or faster, speculative and staged alike"
    return f"regret: under {NO_REGRET:.2f}x our baseline on at least one prompt: " + "; ".join(under)


def _decode_token_s(rows: list[dict]) -> float | None:
    """Plain decoding's seconds per token over the prompts, the prompt read aside."""
    tokens = sum(r["new_tokens"] for r in rows)
    return sum(r["decode_wall_s"] for r in rows) / tokens if tokens and all(r["decode_wall_s"] for r in rows) else None


def _read_share(rows: list[dict]) -> float:
    """Plain decoding's whole time spent reading the prompt, as a share (0 where a row does not say)."""
    if not all(r["decode_wall_s"] for r in rows):
        return 0.0
    return read_share(sum(r["wall_s"] for r in rows), sum(r["decode_wall_s"] for r in rows))


def _round_cost(rows: list[dict], plain_token_s: float | None, share: float = 0.0) -> dict | None:
    """specviz/analysis/round_cost.py's analysis over all prompts' rounds: the round's parts per round, and its
    words."""
    cost = plain_token_s and RoundCost.of(sum(r["steps"] for r in rows), sum(r["new_tokens"] for r in rows),
                                          sum(r["decode_wall_s"] for r in rows), _phase_totals(rows), plain_token_s,
                                          share)
    if not cost:
        return None
    return {"round_s": cost.round_s, "tokens": cost.tokens, "draft_s": cost.draft_s, "read_s": cost.read_s,
            "verify_s": cost.verify_s, "other_s": cost.other_s, "plain_token_s": plain_token_s,
            "read_share": cost.read_share, "decode_speedup": cost.speedup, "decode_goal": cost.decode_goal(),
            "analysis": analysis(rows[0]["strategy"], cost)}


def _phase_totals(rows: list[dict]) -> dict[str, float]:
    """Seconds per engine phase, summed over the rows."""
    totals: dict[str, float] = defaultdict(float)
    for r in rows:
        for name, seconds in r["phase_s"].items():
            totals[name] += seconds
    return totals


def median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _bytes_relative(rows: list[dict]) -> float | None:
    """Bytes read over all prompts / what our baseline read for the same number of tokens."""
    rows = [r for r in rows if r["bytes_relative_to_baseline"] is not None]
    read = sum(r["bytes_per_token"] * r["new_tokens"] for r in rows)
    base = sum(r["baseline_bytes_per_token"] * r["new_tokens"] for r in rows)
    return read / base if base else None


def _phase_share(rows: list[dict]) -> dict[str, float]:
    """Shares of decode time (after prefill) per engine phase; "other" is time no phase claimed."""
    totals = _phase_totals(rows)
    wall = sum(r["decode_wall_s"] for r in rows)
    if wall <= 0:
        return {}
    def order(name: str) -> tuple:
        return Phase.stage_of(name) is None, name != "tree", name != "verify", name

    shares = {name: totals[name] / wall for name in sorted(totals, key=order)}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares



def priced_summary(rows: list[dict]) -> dict | None:
    """The rounds priced by the machine's curves (specviz/analysis/priced.py), over the prompts: the median ratio to
    plain decoding at the same prices, the lowest prompt, and the draft's prompt read's share of the price."""
    priced = [r["priced"] for r in rows if r.get("priced")]
    if not priced:
        return None
    spent = sum(p["verify_s"] + p["draft_s"] + p["read_s"] for p in priced)
    return {"median": median(p["ratio"] for p in priced),
            "lowest": lowest(rows, lambda row: row["priced"]["ratio"] if row.get("priced") else None),
            "read_share": sum(p["read_s"] for p in priced) / spent if spent > 0 else 0.0}


def format_analyses(results: list[dict]) -> str:
    """Each speculative strategy's round analysis (specviz/analysis/round_cost.py), one paragraph per strategy and
    sampling, and its rounds priced by the machine's curves."""
    return "\n".join(f"{r['sampling']}: {r['rounds']['analysis']}" + priced_sentence(r)
                     for r in results if r.get("rounds"))


def priced_sentence(result: dict) -> str:
    """The rounds at the machine's curve prices, in a sentence ('' where the run was not priced)."""
    priced = result.get("priced")
    if not priced:
        return ""
    return (f" Priced by this machine's cost curves (a projection, free of the machine's swings), its rounds ran at "
            f"{priced['median']:.2f}x plain decoding (median; lowest {priced['lowest']['ratio']:.2f}x on "
            f"{priced['lowest']['prompt']}), the draft's prompt read {priced['read_share']:.1%} of their price.")


def format_table(results: list[dict], markdown: bool = False) -> str:
    """vs ref: against the reference, the fastest plain decoder measured in the run (llama.cpp where it ran);
    vs base: against our baseline in the run's precision; lowest: the prompt it ran slowest on, against our baseline;
    vs spec: against speculative. draft/verify/rest: shares of decode time by engine
    phase (draft includes the draft models' prompt read; rest = tree building, bookkeeping and untimed); outside
    fwd: share of end-to-end time spent outside model forward calls."""
    head = ("sampling", "strategy", "tok/s med [p25-p75]", "vs ref", "vs HF", "vs assisted", "vs base", "lowest",
            "vs spec", "tok/fwd", "bytes/base",
            "draft", "verify", "rest", "outside fwd", "exact")
    lines = [head]
    for r in results:
        share = r["phase_share"] or {}
        split = time_split(share, 1.0) if share else {}
        draft = sum(v for k, v in split.items() if Phase.stage_of(k) is not None or k == Phase.PROMPT_READ)
        lines.append((
            r["sampling"], r["strategy"],
            f"{r['tokens_per_s_median']:.1f} [{r['tokens_per_s_p25']:.1f}-{r['tokens_per_s_p75']:.1f}]",
            fmt(r.get("speedup_vs_reference"), "{:.2f}x"), fmt(r["speedup_vs_hf_generate"], "{:.2f}x"),
            fmt(r.get("speedup_vs_hf_assisted"), "{:.2f}x"),
            fmt(r["speedup_vs_baseline"], "{:.2f}x"),
            fmt((r.get("lowest_vs_baseline") or {}).get("ratio"), "{:.2f}x"),
            fmt(r.get("speedup_vs_speculative") if r["strategy"] not in ("speculative", "baseline") else None,
                "{:.2f}x"),
            fmt(r["tokens_per_target_forward"], "{:.2f}"), fmt(r["bytes_relative_to_baseline"], "{:.2f}"),
            fmt(draft if split else None, "{:.0%}"), fmt(split.get("verify"), "{:.0%}"),
            fmt(split.get("overhead"), "{:.0%}"),
            fmt(None if r["forward_share"] is None else 1.0 - r["forward_share"], "{:.0%}"),
            "-" if r["exact_match"] is None else f"{r['exact_match']}/{r['prompts']}"))
    if markdown:
        return md_table(list(head), lines[1:])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def figures(report: dict) -> dict:
    """Plotly figures built from a report (no models): tokens/s, speedup, bytes read, time shares."""
    import plotly.graph_objects as go

    results = report["results"]
    samplings = list(dict.fromkeys(r["sampling"] for r in results))
    title = f"{report['settings']['prompts']} prompts, {report['settings']['max_new_tokens']} new tokens"
    figs = {}
    fig = go.Figure()
    for s in samplings:
        rows = [r for r in results if r["sampling"] == s]
        fig.add_bar(name=s, x=[r["strategy"] for r in rows], y=[r["tokens_per_s_median"] for r in rows],
                    error_y=dict(type="data", symmetric=False,
                                 array=[r["tokens_per_s_p75"] - r["tokens_per_s_median"] for r in rows],
                                 arrayminus=[r["tokens_per_s_median"] - r["tokens_per_s_p25"] for r in rows]))
    fig.update_layout(title=f"Tokens/s, median and p25-p75 over prompts ({title})", yaxis_title="tokens/s",
                      barmode="group")
    figs["tokens_per_s"] = fig
    figs["speedup"] = _bar_figure(results, samplings, "speedup_vs_hf_generate",
                                  f"Speedup against HF generate, median of per-prompt ratios ({title})", "x")
    figs["bytes"] = _bar_figure(results, samplings, "bytes_relative_to_baseline",
                                f"Bytes read per token relative to baseline (Table 1; {title})", "relative")
    fig = go.Figure()
    engine = [r for r in results if r["phase_share"]]
    labels = [f"{r['strategy']}<br>{r['sampling']}" for r in engine]
    phases = list(dict.fromkeys(k for r in engine for k in r["phase_share"]))
    for phase in phases:
        fig.add_bar(name=phase, x=labels, y=[r["phase_share"].get(phase, 0.0) for r in engine])
    fig.update_layout(title=f"Share of decode time per phase ({title})", barmode="stack",
                      yaxis=dict(title="share", tickformat=".0%"))
    figs["time_shares"] = fig
    return figs


def _bar_figure(results, samplings, key, title, axis):
    import plotly.graph_objects as go

    fig = go.Figure()
    for s in samplings:
        rows = [r for r in results if r["sampling"] == s and r[key] is not None]
        fig.add_bar(name=s, x=[r["strategy"] for r in rows], y=[r[key] for r in rows])
    fig.update_layout(title=title, yaxis_title=axis, barmode="group")
    return fig


def write_outputs(report: dict, out: Path, png: bool = True) -> list[Path]:
    """The JSON report at `out`, and next to it <stem>_<chart>.html (and .png) per chart."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    table = out.with_name(f"{out.stem}_table.md")
    analyses = format_analyses(report["results"]).replace("\n", "\n\n")
    regret = regret_line(report["results"])
    table.write_text(format_table(report["results"], markdown=True) + "\n" + (f"\n{regret}\n" if regret else "")
                     + (f"\n{analyses}\n" if analyses else ""),
                     encoding="utf-8")
    written = [out, table]
    for name, fig in figures(report).items():
        fig.update_layout(template="plotly_white", width=900, height=480)
        html = out.with_name(f"{out.stem}_{name}.html")
        fig.write_html(html, include_plotlyjs="cdn")
        written.append(html)
        if png:
            written.append(_write_png(fig, html.with_suffix(".png")))
    return [w for w in written if w is not None]


def _write_png(fig, path: Path) -> Path | None:
    from ..plots.export import ImageExportError, write_images

    try:
        return write_images({path: fig})[0]
    except ImageExportError as exc:  # kaleido needs a Chrome; the HTML charts stand on their own
        print(f"warning: PNG export failed ({exc}); HTML charts were written", file=sys.stderr)
        return None
