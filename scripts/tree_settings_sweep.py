"""Tree settings side by side in one process: each prompt runs every setting before the next prompt
(prompt-major, so machine noise hits all alike), greedy, no stop at end-of-sequence. Prints a table
of per-prompt medians and writes JSON. Each setting is
NAME=STRATEGY[:budget=N][:max_depth=N][:min_score=P][:lookup=N][:vocab=full][:rounds=fixed] (vocab=full: draft
models predict over the whole vocabulary, not the stack's draft vocabulary; rounds=fixed: no round planner, the tree
grown by the plan's minimum scores alone, specviz/decode/planner.py); `--new-tokens N` (default 64) comes first. Ratios
are per-prompt medians against the first setting, of the whole time and of decoding alone
(the prompt read aside).
    python scripts/tree_settings_sweep.py qwen-coder specviz/bench/data/tuning_humaneval_20_25.jsonl out.json \
        base=baseline spec=speculative tree=tree tree8=tree:budget=8 staged=staged staged8=staged:budget=8
The first setting is the reference of the ratios.

`--modelled` (before the preset) adds a ratio without the clock's noise: each run's forwards (its trace's, the same
on every run of one CPU) priced by the target's and the top draft's cost curves, measured in this process before
anything else, plus its other phases' own clocks (the draft's prompt read, building trees, lower stages). "modelled"
is the first setting's priced seconds over each one's (per-prompt median); "vs plain" is new tokens times one
one-token forward over them. With `--modelled`, staged's plan is made from the same curves (a sweep on a busy machine
would otherwise find none stored and grow the fixed rule).

`--sampling NAME` (bench names: greedy, topk50, temp0.7-topp0.9) samples instead of greedy decoding, prompt i with
seed i, as the bench does.
"""
import json
import statistics
import sys

import torch

from specviz.bench.run import run_strategy
from specviz.bench.settings import parse_sampling, with_seed
from specviz.profile.cost_curve import cost_curves
from specviz.stack.presets import load_preset
from specviz.bench.prompts import load_prompts
from specviz.stack.stack import drafter_name
from specviz.decode.costs import CONTEXT, REPS, SIZES, TreePlan, interpolate

NEW_TOKENS = 64
NUMBERS = {"budget": int, "max_depth": int, "min_score": float, "lookup": int}
CLOCKED = ("prompt_read", "tree", "bookkeeping")      # phases priced by their own clocks, with every lower stage's


def curves_of(stack) -> dict[str, dict[int, float]]:
    """The target's and the top draft model's cost curves, by their names in traces: staged's plan's sizes and
    context, the draft over its vocabulary, the faster of two interleaved measurements at each size (a busy machine
    gives a worse model, not no model)."""
    draft = stack.loaded[stack.drafts[0]]
    models, vocabs = [stack.target.model, draft.model], [None, stack.vocabulary.for_draft(draft, [])]
    with torch.inference_mode():
        first, second = (cost_curves(models, SIZES, CONTEXT, REPS, vocabs) for _ in range(2))
    return {name: {n: min(a[n], b[n]) for n in SIZES}
            for name, a, b in zip((stack.target_name, drafter_name(stack.drafts[0])), first, second)}


def priced_seconds(run: dict, curves: dict[str, dict[int, float]], draft_name: str) -> float:
    """A run's forwards priced by the curves (a model without a curve of its own by the draft's); the draft's read of
    the prompt (its first feed) and the phases without a model's forward by their own clocks."""
    seconds = sum(s for phase, s in run["phase_s"].items()
                  if phase in CLOCKED or (phase.endswith("_draft") and phase != "stage1_draft"))
    for index, step in enumerate(run["_decisions"]["steps"]):
        for name, feeds in step["forwards"].items():
            if index == 0 and name == draft_name and "prompt_read" in run["phase_s"]:
                feeds = feeds[1:]
            seconds += sum(interpolate(curves.get(name, curves[draft_name]), n) for n in feeds)
    return seconds


def parse_setting(text: str) -> tuple[str, str, dict, bool]:
    name, _, spec = text.partition("=")
    strategy, *options = spec.split(":")
    options = dict(option.split("=") for option in options)
    full_vocab = options.pop("vocab", "") == "full"
    fixed = options.pop("rounds", "") == "fixed"
    tree = {key: NUMBERS[key](value) for key, value in options.items()}
    return name, strategy, tree, (full_vocab, fixed)


def main(preset: str, prompt_file: str, out: str, *settings: str, new_tokens: int = NEW_TOKENS,
         modelled: bool = False, sampling: str = "greedy") -> None:
    settings = [parse_setting(s) for s in settings]
    stack = load_preset(preset)
    curves = curves_of(stack) if modelled else None
    draft_name = drafter_name(stack.drafts[0]) if modelled else None
    if curves:
        stack.plans.pin(TreePlan(curves[stack.target_name], curves[draft_name], "this sweep's curves"))
    chosen = parse_sampling(sampling, 0)
    prompts = [(p.id, stack.encode(p.text)) for p in load_prompts(prompt_file)]
    vocabulary = stack.vocabulary.tokens

    def run_setting(strategy, ids, tokens, tree, options, seed=0):
        full_vocab, fixed = options
        stack.vocabulary.tokens = None if full_vocab else vocabulary
        if fixed:
            stack.plans.round_planner = lambda *args: None    # this run only: the tree grown without a round planner
        try:
            return run_strategy(stack, strategy, ids, with_seed(chosen, seed), tokens, tree)
        finally:
            vars(stack.plans).pop("round_planner", None)

    for _, strategy, tree, full_vocab in settings:          # warm-up
        run_setting(strategy, prompts[0][1], 8, tree, full_vocab)
    runs = {name: [] for name, *_ in settings}
    for index, (prompt_id, ids) in enumerate(prompts):
        for name, strategy, tree, full_vocab in settings:
            run = run_setting(strategy, ids, new_tokens, tree, full_vocab, index)
            runs[name].append({key: run[key] for key in ("tokens", "wall_s", "decode_wall_s", "target_forwards",
                                                                  "draft_forwards", "rounds_by_plan")})
            runs[name][-1]["prompt"] = prompt_id
            if curves:      # with each round's forwards and the clocked phases, to price the run by other curves
                priced, one = priced_seconds(run, curves, draft_name), curves[stack.target_name][1]
                runs[name][-1].update(priced_s=priced, vs_plain=len(run["tokens"]) * one / priced,
                                      forwards=[step["forwards"] for step in run["_decisions"]["steps"]],
                                      clocked_s={k: v for k, v in run["phase_s"].items() if k != "verify"})
            print(prompt_id, name, f"{len(run['tokens']) / run['wall_s']:.2f} tok/s", flush=True)
    reference = runs[settings[0][0]]
    summary = {}
    extra = " modelled | vs plain |" if curves else ""
    print("| setting | tok/s | vs " + settings[0][0] + " | in decoding |" + extra
          + " tok/fwd | draft forwards | same tokens |")
    print("| --- | ---: | ---: | ---: |" + " ---: | ---: |" * bool(curves) + " ---: | ---: | ---: |")
    for name, rows in runs.items():
        summary[name] = {
            "tok_s": statistics.median(len(r["tokens"]) / r["wall_s"] for r in rows),
            "ratio": statistics.median(ref["wall_s"] / r["wall_s"] for ref, r in zip(reference, rows)),
            "decode_ratio": statistics.median(ref["decode_wall_s"] / r["decode_wall_s"]
                                              for ref, r in zip(reference, rows)),
            "tok_per_fwd": statistics.median(len(r["tokens"]) / r["target_forwards"] for r in rows),
            "draft_forwards": sum(r["draft_forwards"] for r in rows),
            "same_tokens": sum(r["tokens"] == ref["tokens"] for ref, r in zip(reference, rows))}
        s = summary[name]
        if curves:
            one = curves[stack.target_name][1]
            s["modelled"] = statistics.median(ref["priced_s"] / r["priced_s"] for ref, r in zip(reference, rows))
            s["vs_plain"] = statistics.median(len(r["tokens"]) * one / r["priced_s"] for r in rows)
        priced = f"{s['modelled']:.3f}x | {s['vs_plain']:.3f}x | " if curves else ""
        print(f"| {name} | {s['tok_s']:.2f} | {s['ratio']:.2f}x | {s['decode_ratio']:.2f}x | "
              f"{priced}{s['tok_per_fwd']:.2f} "
              f"| {s['draft_forwards']} "
              f"| {s['same_tokens']}/{len(rows)} |")
    with open(out, "w") as f:
        json.dump({"preset": preset, "prompts": [p for p, _ in prompts], "new_tokens": new_tokens, "sampling": sampling,
                   "settings": [s[0] for s in settings], "summary": summary, "curves": curves,
                   "runs": {name: [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
                            for name, rows in runs.items()}}, f, indent=1)


if __name__ == "__main__":
    args, options = sys.argv[1:], {}
    while args and args[0].startswith("--"):
        if args[0] == "--modelled":
            options["modelled"], args = True, args[1:]
        elif args[0] == "--sampling":
            options["sampling"], args = args[1], args[2:]
        else:
            options["new_tokens"], args = int(args[1]), args[2:]
    main(*args, **options)
