"""Greedy exactness over many prompts in a precision where a full bench would take hours: each prompt is
read once by the target (engine.prefill) and baseline and every other strategy decode from copies of
that cache, so the prompt's rows are computed once instead of once per strategy. Every decoder would
compute the same rows itself (same call, same shapes), so the tokens are those of separate runs.
One JSON line per prompt is appended to OUT; a rerun skips the prompts OUT already holds.
    PYTHONPATH=. python scripts/greedy_mismatches.py qwen-coder bfloat16 out.jsonl \
        [--draft-dtype int8] [--strategies staged,tree] [--new-tokens 16] [--limit N]
--draft-dtype loads the draft models in another precision (it moves acceptance only, never the output:
a bfloat16 0.5B costs 3x an int8 one per batch of guesses on an AVX2 CPU) and cuts their vocabulary as
`auto` does. Prints the mismatch count per strategy at the end.
"""
import argparse
import json
from pathlib import Path
from time import perf_counter

from specviz.engine import prefill
from specviz.models import load_model
from specviz.presets import load_preset
from specviz.prompts import HUMANEVAL, load_prompts
from specviz.strategies import default_tree


def load_stack(preset: str, dtype: str, draft_dtype: str | None):
    stack = load_preset(preset, dtype)
    if draft_dtype:
        for spec, source in stack.loaded.items():
            if hasattr(source, "model"):
                stack.loaded[spec] = load_model(spec, draft_dtype)
        stack.restrict_draft_vocabulary()
    return stack


def decode(stack, ids, strategy, new_tokens, prefilled) -> dict:
    started = perf_counter()
    run = stack.decoder(ids, strategy, default_tree(strategy), max_new_tokens=new_tokens, stop_at_eos=False,
                        prefilled=prefilled).generate()
    return {"tokens": run.tokens, "seconds": perf_counter() - started,
            "target_forwards": run.stats["target_forwards"]}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset")
    parser.add_argument("dtype")
    parser.add_argument("out")
    parser.add_argument("--draft-dtype", default=None)
    parser.add_argument("--strategies", default="staged")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--prompts", default=HUMANEVAL)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    out = Path(args.out)
    done = {json.loads(line)["prompt"] for line in out.read_text().splitlines()} if out.exists() else set()
    stack = load_stack(args.preset, args.dtype, args.draft_dtype)
    strategies = args.strategies.split(",")
    for prompt in load_prompts(args.prompts)[:args.limit]:
        if prompt.id in done:
            continue
        ids = stack.encode(prompt.text)
        started = perf_counter()
        shared = prefill(stack.target.model, ids)
        row = {"prompt": prompt.id, "prompt_tokens": len(ids), "dtype": args.dtype, "precision": stack.precision(),
               "prefill_s": perf_counter() - started,
               "baseline": decode(stack, ids, "baseline", args.new_tokens, shared)}
        for strategy in strategies:
            run = decode(stack, ids, strategy, args.new_tokens, shared)
            run["first_difference"] = first_difference(run["tokens"], row["baseline"]["tokens"])
            row[strategy] = run
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(prompt.id, " ".join(f"{s}={'same' if row[s]['first_difference'] is None else 'DIFFERS'}"
                                  for s in strategies), f"{perf_counter() - started:.0f} s", flush=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for strategy in strategies:
        differ = [r["prompt"] for r in rows if r[strategy]["first_difference"] is not None]
        print(f"{strategy}: {len(rows) - len(differ)}/{len(rows)} identical to baseline; differ: {differ or 'none'}")


if __name__ == "__main__":
    main()
