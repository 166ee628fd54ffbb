"""Staged with its planned tree, one path a level against up to four nodes a level (siblings join where they clear
their minimum score), alternating twice in one process on the same prompts: baseline and staged each time, greedy,
64 tokens, medians of per-prompt ratios (docs/BENCHMARKS.md, "Staged's tree planned from the machine's cost curves").
    .venv/bin/python scripts/staged_level_width.py docs/benchmarks/heldout_humaneval_136_143.jsonl
"""
import sys

from specviz import strategies
from specviz.bench.run import run_bench
from specviz.presets import load_preset
from specviz.prompts import load_prompts

stack = load_preset("qwen-coder", "auto")
prompts = load_prompts(sys.argv[1])
ratios = {}
for width in (1, 4, 1, 4):
    strategies.STAGED_LEVEL_WIDTH = width          # what default_tree("staged") reads
    report = run_bench(stack, prompts, ["baseline", "staged"], ["greedy"], 64, progress=False, warmup=not ratios)
    rows = {r["strategy"]: r for r in report["results"]}
    print(f"level width {width}: staged {rows['staged']['tokens_per_s_median']:.2f} tok/s, "
          f"{rows['staged']['speedup_vs_baseline']:.3f}x baseline ({rows['baseline']['tokens_per_s_median']:.2f} tok/s)",
          flush=True)
    ratios.setdefault(width, []).append(round(rows["staged"]["speedup_vs_baseline"], 3))
print(ratios)
