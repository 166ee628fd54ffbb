"""Command line: `python -m specviz generate ...`. Bad input gets one line on stderr, exit code 2."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from .profile.store import Profile
from .peers import reference
from .cpu import prompt_reader
from .bench.report import ratio

from .decode.tree import SHAPES
from .models.locations import DEFAULT_TARGET
from .models.load import ModelLoadError
from .models.precision import AUTO_DTYPE, PRECISION_HELP, PRECISIONS
from .stack.presets import PRESETS, default_choice, load_preset
from .models.prompt_format import PROMPT_FORMATS, NoChatTemplate, default_format, encode_prompt
from .decode.sampling import Sampling
from .stack.compiled import compile_models
from .stack.plans import keep_learnt
from .decode.engine import MAX_NEW_TOKENS
from .stack.strategies import STAGED_LOOKUP, STAGED_MIN_SCORE, STRATEGIES, default_tree
from .decode.costs import describe
from .decode.reasons import reason


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz", description="Staged speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with one strategy")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file whose text is the prompt")
    gen.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                     help="chat: the prompt as a user's turn of the model's chat template; completion: as written "
                          "(default, as in the app: completion for Python source such as the HumanEval tasks, chat "
                          "for plain language where the model has a chat template)")
    gen.add_argument("--strategy", choices=STRATEGIES, default="staged")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--preset", default=None,
                     help=f"a named model stack: {', '.join(PRESETS)} (default: $SPECVIZ_PRESET, else "
                          "qwen-coder where this machine runs it fast, else offline)")
    gen.add_argument("--target", default=None, help=f"hub id, local directory or GGUF file (default: {DEFAULT_TARGET})")
    gen.add_argument("--draft", action="append", default=None, metavar="MODEL",
                     help="a drafter, top stage first; repeat for a cascade. MODEL is a hub id, local "
                          "directory or GGUF file, or 'trigram' / 'lookup' (default: the shipped stack)")
    gen.add_argument("--tree-budget", type=int, default=None, help="drafted nodes per round")
    gen.add_argument("--tree-shape", choices=SHAPES, default=None)
    gen.add_argument("--lookup", type=int, default=None, metavar="N",
                     help=f"also verify up to N tokens copied from the context "
                          f"(default: {STAGED_LOOKUP} for staged, else 0)")
    gen.add_argument("--min-score", type=float, default=None, metavar="P",
                     help="dynamic trees: grow only paths the draft gives at least this probability (default: "
                          "staged plans per guess from this machine's cost curves, tree 0.2)")
    gen.add_argument("--device", default="cpu", help="cpu or cuda")
    gen.add_argument("--dtype", choices=PRECISIONS, default=AUTO_DTYPE,
                     help=PRECISION_HELP)
    gen.add_argument("--compile", action="store_true",
                     help="torch.compile the target and draft models over static KV caches (CUDA graphs on a GPU); "
                          "the first rounds compile, for minutes on a CPU")
    gen.add_argument("--no-reference", action="store_true",
                     help="skip measuring the reference: llama.cpp's plain decoding of the same prompt, which the "
                          "speed is also given against (a few seconds)")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return generate(args)
    except (ValueError, ModelLoadError, OSError) as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def generate(args) -> int:
    prompt = args.prompt if args.prompt is not None else _read(args.prompt_file)
    if not prompt.strip():
        raise ValueError("the prompt is empty")
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    sampling.validate()
    tree = default_tree(args.strategy, args.tree_budget, args.lookup, args.min_score)
    if args.tree_shape:
        tree = replace(tree, shape=args.tree_shape)
    tree.validate()
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--max-new-tokens must be in [1, {MAX_NEW_TOKENS}], got {args.max_new_tokens}")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    drafts = [] if args.strategy == "baseline" else args.draft
    profile = Profile()         # this machine's measurements, read for this command
    preset, preset_reason = ((args.preset, "asked for (--preset)") if args.preset else
                             ("offline", "the stack of --target") if args.target else
                             default_choice(args.device, profile))
    stack = load_preset(preset, args.dtype, args.device, target=args.target, drafts=drafts, profile=profile)
    if args.compile:
        stack.compiled = compile_models(stack.target, stack.draft_models(), stack.vocabulary)
    prompt_format = args.prompt_format or default_format(prompt, stack.tokenizer)
    try:
        prompt_ids = encode_prompt(stack.tokenizer, prompt, prompt_format)
    except NoChatTemplate as exc:
        raise ValueError(f"{exc}: pass --prompt-format completion") from None
    started = perf_counter()
    decoder = stack.decoder(prompt_ids, args.strategy, tree, sampling, args.max_new_tokens)
    run = decoder.generate()
    speed = run.stats["new_tokens"] / (perf_counter() - started)       # the prompt's read included, as the reference's
    keep_learnt(decoder, profile)
    ref = None if args.no_reference else reference.measure(stack, prompt_ids, sampling, args.max_new_tokens)
    lacking = profile.missing_line()
    if lacking:
        print(lacking, file=sys.stderr)
    if args.json:
        print(json.dumps({**cli_json(run, decoder, stack.dtype, stack.precision()), "tokens_per_s_with_prompt": speed,
                          "prompt_format": prompt_format,
                          "preset": preset, "target": stack.target.name, "drafts": stack.drafts,
                          "precision_reason": stack.precision_reason,
                          "preset_reason": preset_reason, "profile": profile.said(),
                          "reference": ref, "speedup_vs_reference": ref and ratio(speed, ref["tokens_per_s"])}))
    else:
        print(run.text)
        s = run.stats
        print(f"\n[{run.strategy}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s ({s['tokens_per_s']:.1f} tok/s; "
              f"{speed:.1f} with the prompt's read), {s['tokens_per_target_forward']:.2f} tokens per target forward, "
              f"bytes read {s.get('bytes_relative_to_baseline', 1.0):.2f}x baseline, {stack.target.name} ({preset}), "
              f"{stack.precision()}", file=sys.stderr)
        if stack.precision_reason:
            print(stack.precision_reason, file=sys.stderr)
        print(f"prompt format: {prompt_format}" + ("" if args.prompt_format else " (this prompt's default; "
              "--prompt-format chooses)"), file=sys.stderr)
        if run.stats.get("rounds_by_plan"):
            rounds, lookup = run.stats["rounds_by_plan"], run.stats["lookup_joined_by_plan"]
            print(f"rounds planned from this run's acceptance and the cost curves: {rounds['speculate']} guessed, "
                  f"{rounds['plain']} plain steps, {rounds['probe']} probes (context lookup joined "
                  f"{lookup['speculate']}, {lookup['plain']} and {lookup['probe']} of them); "
                  f"last: {reason(run.steps[-1].plan)}", file=sys.stderr)
        if decoder.spec.planned and decoder.strategy == "staged":
            plan = stack.plans.tree_plan()
            print(f"staged's tree: {describe(plan)}" if plan else f"staged's tree: the fixed rule (one path while the "
                  f"draft gives at least {STAGED_MIN_SCORE}): no plan is stored for this pair here yet "
                  "(python -m specviz.prepare stores the presets', the bench and the app any pair's)", file=sys.stderr)
        if decoder.drafter is not None:
            for spec, choice in stack.prompt_reads.choices.items():
                print(f"{spec}: {prompt_reader.describe(choice)}", file=sys.stderr)
        if ref is not None:
            print(reference_line(speed, ref), file=sys.stderr)
    return 0


def reference_line(speed: float, ref: dict) -> str:
    """One line: this run against the reference, or why there is none."""
    if ref["tokens_per_s"] is None:
        return f"reference: none ({ref['how']})"
    return (f"reference: {ref['what']}, {ref['tokens_per_s']:.1f} tok/s ({ref['how']}); "
            f"this run is {speed / ref['tokens_per_s']:.2f}x the reference")


def cli_json(run, decoder, dtype: str, precision: str) -> dict:
    s = run.stats
    return {
        "strategy": run.strategy,
        "stages": [vars(st) for st in decoder.stages],
        "prompt_tokens": run.prompt_tokens,
        "tokens": run.tokens,
        "text": run.text,
        "new_tokens": s["new_tokens"],
        "target_forwards": s["target_forwards"],
        "draft_forwards": s["draft_forwards"],
        "wall_s": s["wall_s"],
        "tokens_per_s": s["tokens_per_s"],
        "bytes_read": s["bytes_read"],
        "bytes_per_token": s["bytes_per_token"],
        "bytes_relative_to_baseline": s.get("bytes_relative_to_baseline"),
        "accept_by_depth": s["accept_by_depth"],
        "mean_accepted_per_target_forward": s["mean_accepted_per_target_forward"],
        "tokens_per_target_forward": s["tokens_per_target_forward"],
        "phase_share": s["phase_share"],
        "finish_reason": decoder.finish_reason,
        "rounds_by_plan": s.get("rounds_by_plan"),
        "lookup_joined_by_plan": s.get("lookup_joined_by_plan"),
        "dtype": dtype,
        "precision": precision,
        "settings": run.settings,
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")     # pipes like <(...) work too
    except FileNotFoundError:
        raise ValueError(f"prompt file not found: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
