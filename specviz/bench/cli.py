"""`python -m specviz.bench`: the paper's Tables 1 and 2 with our models, next to what a user has today
(the command line: run, --render a saved report, or --cost-curve)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter

from ..peers.llama_cpp import LlamaCppMissing
from ..cpu.machine import describe
from ..models.load import ModelLoadError, load_model
from ..models.precision import AUTO_DTYPE, DTYPES, PRECISION_HELP, PRECISIONS
from ..stack.presets import PRESETS, get_preset, load_preset
from ..models.prompt_format import PROMPT_FORMATS
from .prompts import HUMANEVAL, PromptError, load_prompts
from ..decode.engine import MAX_NEW_TOKENS
from ..stack.strategies import STAGED_LOOKUP
from .projection import PROJECTION_SIZES, format_projection, project, recorded_rows
from .report import format_analyses, format_table, regret_line, write_outputs
from .run import run_bench
from .settings import ALL_STRATEGIES, DEFAULT_SAMPLINGS, BenchError, parse_sampling
from ..decode import costs as tree_plan
from ..cpu import prompt_reader

DEFAULT_OUT = Path("docs/benchmarks/latest.json")
DESCRIPTION = "`python -m specviz.bench`: the paper's Tables 1 and 2 with our models, next to what a user has today."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.bench", description=DESCRIPTION)
    parser.add_argument("--prompts", default=HUMANEVAL,
                        help="'humaneval' (164 prompts) or a JSONL file with a \"prompt\" field")
    parser.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                        help="chat: each prompt as a user's turn of the model's chat template; completion: as written "
                             "(default, as in the app: completion for Python source such as HumanEval, chat for "
                             "plain language)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--strategies", default=",".join(ALL_STRATEGIES),
                        help=f"comma-separated, from {', '.join(ALL_STRATEGIES)}")
    parser.add_argument("--sampling", default=",".join(DEFAULT_SAMPLINGS),
                        help="comma-separated: greedy, topk50, or parts like temp0.7-topk40-topp0.9")
    parser.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="run every strategy N times on each prompt, in a rotated order each time, and keep each "
                             "one's median time: a shared VM's speed swings by tens of percent from minute to minute, "
                             "and one run per prompt cannot tell a 3%% loss from that")
    parser.add_argument("--preset", default="offline", help=f"a named model stack: {', '.join(PRESETS)}")
    parser.add_argument("--target", default=None, help="replaces the preset's target")
    parser.add_argument("--draft", action="append", default=None, metavar="MODEL",
                        help="a drafter, top stage first; repeat for a cascade (default: the preset's)")
    parser.add_argument("--tree-budget", type=int, default=None, help="drafted nodes per round")
    parser.add_argument("--lookup", type=int, default=None, metavar="N",
                        help=f"context-lookup tokens verified per round (default: {STAGED_LOOKUP} for staged, else 0; "
                             "0 = the paper's staged)")
    parser.add_argument("--min-score", type=float, default=None, metavar="P",
                        help="tree and staged: grow only paths the draft gives at least this probability (default: "
                             "staged plans per guess from this machine's cost curves, tree 0.2)")
    parser.add_argument("--dtype", choices=PRECISIONS, default=AUTO_DTYPE,
                        help=PRECISION_HELP)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true",
                        help="our strategies run torch.compile'd target and draft models over static KV caches "
                             "(CUDA graphs on a GPU); the HF peers stay eager. Compiling takes minutes before the run")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON report; charts are written next to it")
    parser.add_argument("--no-png", action="store_true", help="HTML charts only")
    parser.add_argument("--projection", nargs="?", const="paper", choices=list(PROJECTION_SIZES), default=None,
                        help="also replay our runs' decisions on random models of other sizes (default: the paper's "
                             "GPT-2-L target and 40M draft; qwen-coder: the Qwen2.5-Coder pair's shapes; 'tiny' for a "
                             "quick check) and report projected tokens/s")
    parser.add_argument("--replay", nargs="+", metavar="RECORDING", default=None,
                        help="with --projection: load no model and run nothing; project the lanes of these recordings "
                             "(python -m specviz.app.record) instead")
    parser.add_argument("--cost-curve", action="store_true",
                        help="no run: time one target forward by the number of tokens it verifies, print the "
                             "curve and write it as JSON (--out)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--render", metavar="JSON",
                        help="no run: print the table and redraw the charts of a saved report")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return bench(args, argv)
    except (BenchError, PromptError, ValueError, ModelLoadError, LlamaCppMissing, OSError) as exc:
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
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise BenchError(f"--max-new-tokens must be in [1, {MAX_NEW_TOKENS}], got {args.max_new_tokens}")
    if args.repeats < 1:
        raise BenchError(f"--repeats must be at least 1, got {args.repeats}")
    if args.limit is not None and args.limit < 1:
        raise BenchError(f"--limit must be at least 1, got {args.limit}")
    return strategies, samplings


def render(path: str, png: bool = True) -> int:
    file = Path(path)
    if not file.is_file():
        raise BenchError(f"report not found: {path}")
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
        print_results(report["results"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BenchError(f"{path} is not a benchmark report ({type(exc).__name__}: {exc})") from None
    if "projection" in report:
        print("\n" + format_projection(report["projection"]))
    written = write_outputs(report, file, png)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def print_results(results: list[dict]) -> None:
    """The table, then what each speculative strategy's rounds cost and would need."""
    print(format_table(results))
    regret = regret_line(results)
    if regret:
        print(regret)
    analyses = format_analyses(results)
    if analyses:
        print("\n" + analyses)


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
    if args.replay:
        return write_replay_projection(args, argv)
    strategies, samplings = check_args(args)
    prompts = load_prompts(args.prompts, args.limit)
    stack = load_preset(args.preset, args.dtype, args.device, target=args.target, drafts=args.draft)
    report = report_header(argv)
    started = perf_counter()
    tree = {"budget": args.tree_budget, "lookup": args.lookup, "min_score": args.min_score}
    report.update(run_bench(stack, prompts, strategies, samplings, args.max_new_tokens, args.seed, tree,
                            progress=not args.no_progress, projection=args.projection,
                            device=args.device, dtype=stack.dtype, compile=args.compile,
                            prompt_format=args.prompt_format, repeats=args.repeats))
    report["duration_s"] = perf_counter() - started
    for note in [*report["settings"]["notes"], report["settings"]["length"]]:
        print(f"note: {note}", file=sys.stderr)
    print(f"models: {stack.target.name} with {', '.join(stack.drafts) or 'no drafter'}, {stack.precision()}"
          + (f" ({stack.precision_reason})" if stack.precision_reason else ""), file=sys.stderr)
    if report["settings"]["tree_plan"]:
        plan = tree_plan.TreePlan.from_dict(report["settings"]["tree_plan"])
        print(f"staged's tree: {tree_plan.describe(plan)}", file=sys.stderr)
    for spec, choice in report["settings"]["prompt_reads"].items():
        print(f"{spec}: {prompt_reader.describe(choice)}", file=sys.stderr)
    print_results(report["results"])
    if "projection" in report:
        print("\n" + format_projection(report["projection"]))
    written = write_outputs(report, Path(args.out), png=not args.no_png)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def write_replay_projection(args, argv: list[str]) -> int:
    """`--replay R... --projection S`: recorded decisions timed on random models of S, no model loaded (a GPU
    machine without the weights, issue 33)."""
    if args.projection is None:
        raise BenchError("--replay needs --projection SIZES (e.g. --projection qwen-coder)")
    if args.dtype not in DTYPES and args.dtype != AUTO_DTYPE:
        raise BenchError(f"--replay runs random models in {', '.join(DTYPES)}, not {args.dtype}")
    dtype = "float32" if args.dtype == AUTO_DTYPE else args.dtype
    report = {**report_header(argv), "projection": project(recorded_rows(args.replay), args.projection, args.device,
                                                            dtype, args.compile)}
    print(format_projection(report["projection"]))
    write_json(report, Path(args.out))
    return 0


def write_json(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def write_cost_curve(args, argv: list[str]) -> int:
    from ..profile.cost_curve import cost_curve, format_curve

    target = load_model(args.target or get_preset(args.preset).target, args.dtype, args.device)
    curve = cost_curve(target.model)
    print(format_curve(curve))
    report = {**report_header(argv), "target": target.name, "dtype": target.dtype, "device": args.device,
              "seconds_per_forward": curve}
    write_json(report, Path(args.out))
    return 0
