"""Staged with the draft's int4 groups 32 or 64 wide (specviz/cpu/int4.py, WIDE_GROUP), greedy 64 tokens on the given
prompts, twice per process: rounds, draft forwards, and the seconds of drafting and verifying, summed over the prompts
(docs/BENCHMARKS.md, "A draft's groups 64 wide"). Run the widths alternately, in separate processes:
    for g in 32 64 32 64; do .venv/bin/python scripts/draft_groups.py /tmp/val_57_65.jsonl $g [PRESET]; done
"""
import sys
import time
from collections import Counter

import specviz.models as models
from specviz.presets import load_preset
from specviz.prompts import load_prompts

models.WIDE_GROUP = int(sys.argv[2])        # what quantize_in_place gives a draft's 4-bit layers
stack = load_preset(sys.argv[3] if len(sys.argv) > 3 else "qwen-coder", "auto")
prompts = load_prompts(sys.argv[1])
draft = stack.drafter_for("staged").kv_models()[0].name
for _ in range(2):
    total, started = Counter(), time.perf_counter()
    for prompt in prompts:
        for step in stack.decoder(stack.encode(prompt.text), "staged", max_new_tokens=64).generate().steps:
            total.update(rounds=1, forwards=len(step.forwards.get(draft, [])),
                         drafting=step.phase_s.get("stage1_draft", 0.0) + step.phase_s.get("stage2_draft", 0.0),
                         verifying=step.phase_s.get("verify", 0.0))
    print(f"groups of {sys.argv[2]}: {time.perf_counter() - started:.2f} s, {total['rounds']} rounds, {total['forwards']} "
          f"draft forwards, drafting {total['drafting']:.2f} s, verifying {total['verifying']:.2f} s", flush=True)
