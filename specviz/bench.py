"""`python -m specviz.bench`: the paper's Tables 1 and 2 with our models, next to what a user has today.

One run times, on the same prompts and settings, transformers' `generate()` (plain, with the same
draft as `assistant_model=`, and with `prompt_lookup_num_tokens=`) and our baseline, speculative,
tree and staged decoders. The loop is prompt-major (every strategy runs on a prompt before the next
prompt), so machine noise hits all strategies alike. Every run generates exactly --max-new-tokens
tokens (end-of-sequence does not stop it), so tokens/s compare like with like.

Per strategy and sampling setting it reports tokens/s (median, p25, p75 over prompts; end to end,
prefill included, as a user would time it), the speedup against HF generate and against our baseline
(medians of per-prompt ratios), tokens per target forward, bytes read per token relative to our
baseline on the same prompt (Table 1), time shares, and, under greedy decoding, on how many prompts
the output is token-for-token identical to our baseline's. Output: a printed table, a JSON file
and plotly charts (HTML and PNG). Bad input gets one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter

import numpy as np
import torch

from .engine import STRATEGIES
from .machine import describe
from .hf_peers import PEERS, PROMPT_LOOKUP_TOKENS, hf_generate
from .models import AUTO_DTYPE, DTYPES, ModelLoadError, load_model
from .presets import PRESETS, get_preset, load_preset
from .prompts import HUMANEVAL, Prompt, PromptError, load_prompts
from .sampling import Sampling
from .stack import STAGED_LOOKUP

ALL_STRATEGIES = PEERS + STRATEGIES
DEFAULT_SAMPLINGS = ("greedy", "topk50")
DEFAULT_OUT = Path("docs/benchmarks/latest.json")
WARMUP_TOKENS = 8


class BenchError(ValueError):
    """Bad benchmark settings; the message is one line meant for the user."""


# -- settings -------------------------------------------------------------------------------------
def parse_sampling(name: str, seed: int = 0) -> Sampling:
    """"greedy", or '-'-joined parts "tempT", "topkK", "toppP" (T defaults to 1), e.g. "topk50", "temp0.7-topp0.9"."""
    if name == "greedy":
        return Sampling(0.0, seed=seed)
    values = {"temp": 1.0, "topk": 0, "topp": 1.0}
    for part in name.split("-"):
        match = re.fullmatch(r"(temp|topk|topp)([0-9.]+)", part)
        if not match:
            raise BenchError(f"unknown sampling {name!r}: use greedy or parts like topk50, temp0.7, topp0.9")
        key, value = match.groups()
        try:
            values[key] = int(value) if key == "topk" else float(value)
        except ValueError:
            raise BenchError(f"unknown sampling {name!r}: {value!r} is not a number") from None
    sampling = Sampling(values["temp"], values["topk"], values["topp"], seed)
    if sampling.greedy:
        raise BenchError(f"sampling {name!r} has temperature 0: call it greedy")
    sampling.validate()
    return sampling


def with_seed(sampling: Sampling, seed: int) -> Sampling:
    return Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)


def usable_strategies(stack, wanted: list[str]) -> tuple[list[str], list[str]]:
    """The strategies this stack can run, and one note per strategy it cannot."""
    usable, notes = [], []
    for strategy in wanted:
        if strategy == "hf_assisted" and stack.assistant()[0] is None:
            notes.append("hf_assisted skipped: the stack has no neural draft model (pass --draft MODEL)")
            continue
        if strategy in STRATEGIES:
            try:
                stack.drafter_for(strategy)
            except ValueError as exc:
                notes.append(f"{strategy} skipped: {exc}")
                continue
            if strategy != "baseline" and not stack.drafts:
                notes.append(f"{strategy} skipped: the stack has no drafter")
                continue
        usable.append(strategy)
    return usable, notes


# -- one generation -------------------------------------------------------------------------------
class ForwardClock:
    """Wall time spent inside the forward passes of the given models (forward hooks)."""

    def __init__(self, models):
        self.seconds = 0.0
        self._started: list[float] = []
        self._handles = []
        for model in models:
            self._handles.append(model.register_forward_pre_hook(self._pre))
            self._handles.append(model.register_forward_hook(self._post))

    @torch.compiler.disable
    def _pre(self, module, args):
        self._started.append(perf_counter())

    @torch.compiler.disable
    def _post(self, module, args, output):
        started = self._started.pop()
        if not self._started:           # count nested model calls once
            self.seconds += perf_counter() - started

    def close(self):
        for handle in self._handles:
            handle.remove()


def run_engine(stack, strategy, prompt_ids, sampling, max_new_tokens, tree=None) -> dict:
    """tree: overrides of the strategy's default tree (budget, lookup, min_score)."""
    from .stack import default_tree

    models = [stack.target.model] + [m.model for m in stack.draft_models().values()]
    clock = ForwardClock(models)
    try:
        started = perf_counter()
        # no stop at end-of-sequence: every strategy makes the same number of tokens
        decoder = stack.decoder(prompt_ids, strategy, default_tree(strategy, **(tree or {})), sampling,
                                max_new_tokens, stop_at_eos=False)
        run = decoder.generate()
        wall = perf_counter() - started
    finally:
        clock.close()
    s = run.stats
    return {"tokens": run.tokens, "wall_s": wall, "target_forwards": s["target_forwards"],
            "draft_forwards": sum(s["draft_forwards"].values()),
            "mean_accepted_per_target_forward": s["mean_accepted_per_target_forward"],
            "steps": s["steps"], "bytes_per_token": s["bytes_per_token"],
            "decode_wall_s": s["wall_s"], "phase_s": s["phase_s"], "forward_s": clock.seconds,
            "_decisions": decisions(run)}


def decisions(run) -> dict:
    """What a projection replays: per round the tree, the accepted path and each model's forward sizes."""
    first = run.steps[0] if run.steps else None
    return {"stages": [vars(st) for st in first.stages] if first else [],
            "steps": [{"tokens": [n.token for n in st.nodes], "parents": [n.parent for n in st.nodes],
                       "path": list(st.accepted_path), "forwards": st.forwards,
                       "committed": len(st.committed_tokens)} for st in run.steps]}


def run_peer(stack, strategy, prompt_ids, sampling, max_new_tokens) -> dict:
    assistant = stack.assistant()[1] if strategy == "hf_assisted" else None
    lookup = PROMPT_LOOKUP_TOKENS if strategy == "hf_prompt_lookup" else None
    clock = ForwardClock([m for m in (stack.target.model, assistant) if m is not None])
    try:
        run = hf_generate(stack.target.model, prompt_ids, sampling, max_new_tokens, assistant, lookup)
    finally:
        clock.close()
    return {"tokens": run.tokens, "wall_s": run.wall_s, "target_forwards": run.target_forwards,
            "draft_forwards": run.draft_forwards, "mean_accepted_per_target_forward": None, "steps": None,
            "bytes_per_token": None, "decode_wall_s": None, "phase_s": None, "forward_s": clock.seconds}


def run_strategy(stack, strategy, prompt_ids, sampling, max_new_tokens, tree=None) -> dict:
    if strategy in PEERS:
        return run_peer(stack, strategy, prompt_ids, sampling, max_new_tokens)
    return run_engine(stack, strategy, prompt_ids, sampling, max_new_tokens, tree)


# -- the benchmark --------------------------------------------------------------------------------
def run_bench(stack, prompts: list[Prompt], strategies: list[str], samplings: list[str],
              max_new_tokens: int, seed: int = 0, tree: dict | None = None,
              progress: bool = True, warmup: bool = True, projection: str | None = None,
              device: str = "cpu", dtype: str = "float32", compile: bool = False) -> dict:
    """Run every strategy on every prompt under every sampling.

    Returns {"settings", "results" (one row per sampling and strategy), "per_prompt"} and, with
    `projection` ("paper" or "tiny"), "projection". compile: our strategies run the compiled target
    over one static cache length, compiled for every bucket before anything is timed."""
    strategies, notes = usable_strategies(stack, strategies)
    if not strategies:
        raise BenchError("no strategy can run: " + "; ".join(notes))
    settings = {name: parse_sampling(name, seed) for name in samplings}
    encoded = [(p, stack.encode(p.text)) for p in prompts]
    if compile:
        from .engine import static_length
        from .stack import default_tree
        trees = [default_tree(s, **(tree or {})) for s in strategies if s not in PEERS]
        stack.compile(max(static_length(len(ids), max_new_tokens, t) for _, ids in encoded for t in trees))
    if warmup:
        for name, sampling in settings.items():
            for strategy in strategies:
                run_strategy(stack, strategy, encoded[0][1], sampling, min(WARMUP_TOKENS, max_new_tokens), tree)
    bar = _progress(len(prompts) * len(settings) * len(strategies), progress)
    rows = []
    for index, (prompt, ids) in enumerate(encoded):
        for name, sampling in settings.items():
            sampling = with_seed(sampling, seed + index)
            for strategy in strategies:
                bar.set_description(f"{prompt.id} {name} {strategy}", refresh=False)
                run = run_strategy(stack, strategy, ids, sampling, max_new_tokens, tree)
                rows.append({"prompt": prompt.id, "prompt_tokens": len(ids), "sampling": name,
                             "strategy": strategy, **run})
                bar.update()
    bar.close()
    per_prompt = compare_rows(rows)
    report = {"settings": {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "strategies": strategies,
                           "samplings": {n: vars(s) for n, s in settings.items()}, "seed": seed,
                           "tree": tree or {}, "compiled": compile,
                           "static_cache_entries": stack.static_len if compile else None,
                           "target": stack.target.name, "drafts": list(stack.drafts), "dtype": stack.dtype,
                           "precision": stack.precision(),
                           "assistant": stack.assistant()[0], "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
                           "notes": notes},
              "results": summarise(per_prompt), "per_prompt": per_prompt}
    if projection:
        report["projection"] = project(rows, projection, device, dtype)
    return report


def compare_rows(rows: list[dict]) -> list[dict]:
    """Add per-prompt comparisons with our baseline and HF generate; drop the token lists."""
    by_key = {(r["prompt"], r["sampling"], r["strategy"]): r for r in rows}
    out = []
    for r in rows:
        base = by_key.get((r["prompt"], r["sampling"], "baseline"))
        hf = by_key.get((r["prompt"], r["sampling"], "hf_generate"))
        n = len(r["tokens"])
        rate = n / r["wall_s"] if r["wall_s"] > 0 else 0.0
        row = {k: v for k, v in r.items() if k != "tokens" and not k.startswith("_")}
        row.update(new_tokens=n, tokens_per_s=rate,
                   tokens_per_target_forward=n / r["target_forwards"] if r["target_forwards"] else None,
                   baseline_bytes_per_token=base and base["bytes_per_token"],
                   bytes_relative_to_baseline=_ratio(r["bytes_per_token"], base and base["bytes_per_token"]),
                   speedup_vs_baseline=_ratio(rate, base and _rate(base)),
                   speedup_vs_hf_generate=_ratio(rate, hf and _rate(hf)),
                   exact=(r["tokens"] == base["tokens"]) if base is not None and r["sampling"] == "greedy" else None)
        out.append(row)
    return out


def _rate(row: dict) -> float:
    return len(row["tokens"]) / row["wall_s"] if row["wall_s"] > 0 else 0.0


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarise(per_prompt: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in per_prompt:
        groups[(row["sampling"], row["strategy"])].append(row)
    results = []
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
            "speedup_vs_hf_generate": _median(r["speedup_vs_hf_generate"] for r in rows),
            "speedup_vs_baseline": _median(r["speedup_vs_baseline"] for r in rows),
            "tokens_per_target_forward": tokens / forwards if forwards else None,
            "mean_accepted_per_target_forward": (
                sum(r["mean_accepted_per_target_forward"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)
                if engine else None),
            "bytes_relative_to_baseline": _bytes_relative(rows) if engine else None,
            "phase_share": _phase_share(rows) if engine else None,
            "forward_share": sum(r["forward_s"] for r in rows) / sum(r["wall_s"] for r in rows),
            "exact_match": sum(bool(r["exact"]) for r in rows) if rows[0]["exact"] is not None else None,
            "prompts": len(rows),
        })
    order = {s: i for i, s in enumerate(ALL_STRATEGIES)}
    return sorted(results, key=lambda r: (r["sampling"] != "greedy", r["sampling"], order[r["strategy"]]))


def _median(values):
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
    totals: dict[str, float] = defaultdict(float)
    for r in rows:
        for name, seconds in r["phase_s"].items():
            totals[name] += seconds
    wall = sum(r["decode_wall_s"] for r in rows)
    if wall <= 0:
        return {}
    order = lambda name: (not name.endswith("_draft"), name != "tree", name != "verify", name)
    shares = {name: totals[name] / wall for name in sorted(totals, key=order)}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, disable=not enabled, file=sys.stderr, unit="run", dynamic_ncols=True)


# -- projection -----------------------------------------------------------------------------------
PROJECTION_SIZES = {   # GPT-2 configs: the paper's GPT-2-L target and 40M GPT-2 draft; "tiny" for tests
    "paper": {"vocab": 50257, "target": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
              "draft": {"n_layer": 4, "n_embd": 512, "n_head": 8}},
    "tiny": {"vocab": 256, "target": {"n_layer": 2, "n_embd": 64, "n_head": 4},
             "draft": {"n_layer": 1, "n_embd": 32, "n_head": 4}},
}
PROJECTION_NOTE = ("PROJECTION, not a measurement: randomly initialised GPT-2 models of the given sizes replay "
                   "the token trees, accepted paths and draft forward sizes recorded from the real runs of this "
                   "benchmark. Only model forwards and KV-cache commits are timed (decode only, prefill excluded); "
                   "tree building, n-gram/lookup stages, sampling and verification logic are not.")


def random_gpt2(sizes: dict, vocab: int, device: str, dtype: str, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=4096, bos_token_id=None, eos_token_id=None, **sizes)
    with torch.device(device):
        model = GPT2LMHeadModel(config)
    return model.to(DTYPES[dtype]).eval().requires_grad_(False)


def replay(target, drafts: dict, recorded: dict, prompt_tokens: int, vocab: int) -> tuple[float, int, int]:
    """Re-run a recorded generation's forwards on other models; return (seconds, new tokens, target forwards)."""
    from .tree import ancestor_matrix

    def tokens(n):
        return torch.randint(0, vocab, (n,)).tolist()

    models = [target] + [drafts[name] for name in drafts]
    for kv in models:
        kv.reset()
        if prompt_tokens > 1:
            kv.feed_committed(tokens(prompt_tokens - 1))
    _sync(target)
    started = perf_counter()
    new = forwards = 0
    for step in recorded["steps"]:
        parents = step["parents"]
        depths = [0] * len(parents)
        for i, parent in enumerate(parents):
            depths[i] = depths[parent] + 1 if parent >= 0 else 0
        target.forward([t % vocab for t in step["tokens"]], [target.committed + d for d in depths],
                       ancestor_matrix(parents))
        target.commit(step["path"])
        for name, kv in drafts.items():
            for n in step["forwards"].get(name, []):
                visible = torch.cat([torch.zeros(n, kv.pending, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)
                kv.forward(tokens(n), list(range(kv.length, kv.length + n)), visible)
            kv.commit(list(range(min(kv.pending, step["committed"]))))
        new += step["committed"]
        forwards += 1
    _sync(target)
    return perf_counter() - started, new, forwards


def _sync(kv) -> None:
    if kv.device.type == "cuda":
        torch.cuda.synchronize(kv.device)


@torch.inference_mode()
def project(rows: list[dict], sizes: str = "paper", device: str = "cpu", dtype: str = "float32") -> dict:
    """Replay every engine run in `rows` (with recorded decisions) on random models of `sizes`."""
    from .cache import KVModel

    spec = PROJECTION_SIZES[sizes]
    target = KVModel(random_gpt2(spec["target"], spec["vocab"], device, dtype, 0), "target")
    draft_model = random_gpt2(spec["draft"], spec["vocab"], device, dtype, 1)
    out = []
    for row in rows:
        recorded = row.get("_decisions")
        if not recorded:
            continue
        names = [st["name"] for st in recorded["stages"][1:] if st["kind"] == "model"]
        drafts = {name: KVModel(draft_model, name) for name in names}
        seconds, new, forwards = replay(target, drafts, recorded, row["prompt_tokens"], spec["vocab"])
        out.append({"prompt": row["prompt"], "sampling": row["sampling"], "strategy": row["strategy"],
                    "new_tokens": new, "target_forwards": forwards, "wall_s": seconds,
                    "tokens_per_s": new / seconds if seconds > 0 else 0.0})
    base = {(r["prompt"], r["sampling"]): r["tokens_per_s"] for r in out if r["strategy"] == "baseline"}
    for r in out:
        r["speedup_vs_baseline"] = _ratio(r["tokens_per_s"], base.get((r["prompt"], r["sampling"])))
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in out:
        groups[(r["sampling"], r["strategy"])].append(r)
    results = [{"strategy": strategy, "sampling": sampling,
                "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in rs])),
                "tokens_per_s_p25": float(np.percentile([r["tokens_per_s"] for r in rs], 25)),
                "tokens_per_s_p75": float(np.percentile([r["tokens_per_s"] for r in rs], 75)),
                "speedup_vs_baseline": _median(r["speedup_vs_baseline"] for r in rs),
                "tokens_per_target_forward": sum(r["new_tokens"] for r in rs) / sum(r["target_forwards"] for r in rs),
                "prompts": len(rs)} for (sampling, strategy), rs in groups.items()]
    return {"note": PROJECTION_NOTE, "sizes": sizes, "configs": spec, "device": device, "dtype": dtype,
            "target_params": sum(p.numel() for p in target.model.parameters()),
            "draft_params": sum(p.numel() for p in draft_model.parameters()),
            "results": results, "per_prompt": out}


def format_projection(projection: dict) -> str:
    lines = [f"*** {projection['note']}",
             f"*** target {projection['target_params'] / 1e6:.0f}M, draft {projection['draft_params'] / 1e6:.0f}M "
             f"parameters, {projection['device']} {projection['dtype']}",
             "sampling  strategy     projected tok/s med [p25-p75]  vs base  tok/fwd"]
    for r in projection["results"]:
        lines.append(f"{r['sampling']:<9} {r['strategy']:<12} {r['tokens_per_s_median']:8.1f} "
                     f"[{r['tokens_per_s_p25']:.1f}-{r['tokens_per_s_p75']:.1f}]"
                     f"{'':8}{_fmt(r['speedup_vs_baseline'], '{:.2f}x'):>7}  {r['tokens_per_target_forward']:.2f}")
    return "\n".join(lines)


# -- output ---------------------------------------------------------------------------------------
def format_table(results: list[dict], markdown: bool = False) -> str:
    """draft/verify/rest: shares of decode time by engine phase (rest = tree building, bookkeeping and
    untimed); outside fwd: share of end-to-end time spent outside model forward calls."""
    head = ("sampling", "strategy", "tok/s med [p25-p75]", "vs HF", "vs base", "tok/fwd", "bytes/base",
            "draft", "verify", "rest", "outside fwd", "exact")
    lines = [head]
    for r in results:
        share = r["phase_share"] or {}
        draft = sum(v for k, v in share.items() if k.endswith("_draft"))
        lines.append((
            r["sampling"], r["strategy"],
            f"{r['tokens_per_s_median']:.1f} [{r['tokens_per_s_p25']:.1f}-{r['tokens_per_s_p75']:.1f}]",
            _fmt(r["speedup_vs_hf_generate"], "{:.2f}x"), _fmt(r["speedup_vs_baseline"], "{:.2f}x"),
            _fmt(r["tokens_per_target_forward"], "{:.2f}"), _fmt(r["bytes_relative_to_baseline"], "{:.2f}"),
            _fmt(draft if share else None, "{:.0%}"), _fmt(share.get("verify"), "{:.0%}"),
            _fmt(1.0 - draft - share.get("verify", 0.0) if share else None, "{:.0%}"),
            _fmt(1.0 - r["forward_share"], "{:.0%}"),
            "-" if r["exact_match"] is None else f"{r['exact_match']}/{r['prompts']}"))
    if markdown:
        text = ["| " + " | ".join(row) + " |" for row in lines]
        text.insert(1, "|" + "---|" * len(head))
        return "\n".join(text)
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def _fmt(value, pattern: str) -> str:
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
    table.write_text(format_table(report["results"], markdown=True) + "\n", encoding="utf-8")
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
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")
    try:
        fig.write_image(path)
        return path
    except Exception as exc:  # kaleido needs a Chrome; the HTML charts stand on their own
        print(f"warning: PNG export failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
              "HTML charts were written", file=sys.stderr)
        return None


# -- command line ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default=HUMANEVAL, help="'humaneval' (164 prompts) or a JSONL file with a \"prompt\" field")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--strategies", default=",".join(ALL_STRATEGIES),
                        help=f"comma-separated, from {', '.join(ALL_STRATEGIES)}")
    parser.add_argument("--sampling", default=",".join(DEFAULT_SAMPLINGS),
                        help="comma-separated: greedy, topk50, or parts like temp0.7-topk40-topp0.9")
    parser.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    parser.add_argument("--preset", default="offline", help=f"a named model stack: {', '.join(PRESETS)}")
    parser.add_argument("--target", default=None, help="replaces the preset's target")
    parser.add_argument("--draft", action="append", default=None, metavar="MODEL",
                        help="a drafter, top stage first; repeat for a cascade (default: the preset's)")
    parser.add_argument("--tree-budget", type=int, default=None, help="drafted nodes per round")
    parser.add_argument("--lookup", type=int, default=None, metavar="N",
                        help=f"context-lookup tokens verified per round (default: {STAGED_LOOKUP} for staged, else 0; "
                             "0 = the paper's staged)")
    parser.add_argument("--min-score", type=float, default=None, metavar="P",
                        help="tree and staged: grow only paths the draft gives at least this probability (default 0.2)")
    parser.add_argument("--dtype", choices=[AUTO_DTYPE, *DTYPES], default=AUTO_DTYPE,
                        help="auto: bfloat16 where a probe shows it faster here, else float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true",
                        help="our strategies run a torch.compile'd target over a static KV cache (CUDA graphs on "
                             "a GPU); the HF peers stay eager. Compiling takes minutes before the run")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON report; charts are written next to it")
    parser.add_argument("--no-png", action="store_true", help="HTML charts only")
    parser.add_argument("--projection", nargs="?", const="paper", choices=list(PROJECTION_SIZES), default=None,
                        help="also replay our runs' decisions on random GPT-2 models of the paper's sizes "
                             "(GPT-2-L target, 40M draft; 'tiny' for a quick check) and report projected tokens/s")
    parser.add_argument("--cost-curve", action="store_true",
                        help="no run: time one target forward by the number of tokens it verifies, print the "
                             "curve and write it as JSON (--out)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--render", metavar="JSON", help="no run: print the table and redraw the charts of a saved report")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return bench(args, argv)
    except (BenchError, PromptError, ValueError, ModelLoadError, OSError) as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def check_args(args) -> tuple[list[str], list[str]]:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in ALL_STRATEGIES]
    if unknown or not strategies:
        raise BenchError(f"unknown strategy {', '.join(unknown) or '(none)'}; choose from {', '.join(ALL_STRATEGIES)}")
    samplings = list(dict.fromkeys(s.strip() for s in args.sampling.split(",") if s.strip()))
    if not samplings:
        raise BenchError("--sampling is empty")
    for name in samplings:
        parse_sampling(name)
    if not 1 <= args.max_new_tokens <= 4096:
        raise BenchError(f"--max-new-tokens must be in [1, 4096], got {args.max_new_tokens}")
    if args.limit is not None and args.limit < 1:
        raise BenchError(f"--limit must be at least 1, got {args.limit}")
    return strategies, samplings


def render(path: str, png: bool = True) -> int:
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"report not found: {path}")
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
        print(format_table(report["results"]))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BenchError(f"{path} is not a benchmark report ({type(exc).__name__}: {exc})") from None
    if "projection" in report:
        print("\n" + format_projection(report["projection"]))
    written = write_outputs(report, file, png)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def report_header(argv: list[str]) -> dict:
    """Where, when and how a report was made."""
    return {"machine": describe(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m specviz.bench " + shlex.join(argv),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def bench(args, argv: list[str]) -> int:
    if args.render:
        return render(args.render, png=not args.no_png)
    if args.cost_curve:
        return write_cost_curve(args, argv)
    strategies, samplings = check_args(args)
    prompts = load_prompts(args.prompts, args.limit)
    stack = load_preset(args.preset, args.dtype, args.device, target=args.target, drafts=args.draft)
    report = report_header(argv)
    started = perf_counter()
    tree = {"budget": args.tree_budget, "lookup": args.lookup, "min_score": args.min_score}
    report.update(run_bench(stack, prompts, strategies, samplings, args.max_new_tokens, args.seed, tree,
                            progress=not args.no_progress, projection=args.projection,
                            device=args.device, dtype=stack.dtype, compile=args.compile))
    report["duration_s"] = perf_counter() - started
    for note in report["settings"]["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(format_table(report["results"]))
    if "projection" in report:
        print("\n" + format_projection(report["projection"]))
    written = write_outputs(report, Path(args.out), png=not args.no_png)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def write_cost_curve(args, argv: list[str]) -> int:
    from .cost_curve import cost_curve, format_curve

    target = load_model(args.target or get_preset(args.preset).target, args.dtype, args.device)
    curve = cost_curve(target.model)
    print(format_curve(curve))
    report = {**report_header(argv), "target": target.name, "dtype": target.dtype, "device": args.device,
              "seconds_per_forward": curve}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
