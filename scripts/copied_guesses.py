"""Staged with the n-gram stage's copied guesses (specviz/drafters/lookup.py, COPIED_RUN) against its trigram token
alone, alternating twice in one process on the same prompts (greedy, 64 tokens): the draft's forwards, the tokens
fed to them, and the seconds of drafting and verifying, summed over the prompts (docs/BENCHMARKS.md, "Copied guesses").
The trees, and so the tokens, are the same either way; only the draft's forwards differ.
    .venv/bin/python scripts/copied_guesses.py /tmp/val_57_65.jsonl
"""
import sys
from collections import Counter

from specviz.drafters.lookup import COPIED_RUN
from specviz.drafters.ngram import NgramDrafter
from specviz.presets import load_preset
from specviz.prompts import load_prompts

stack = load_preset("qwen-coder", "auto")
prompts = load_prompts(sys.argv[1])
draft = stack.drafter_for("staged").kv_models()[0].name
for copies in (False, True, False, True):
    NgramDrafter.copies, NgramDrafter.guess_run = copies, (COPIED_RUN if copies else 1)    # what the drafters read
    total = Counter()
    for prompt in prompts:
        for step in stack.decoder(stack.encode(prompt.text), "staged", max_new_tokens=64).generate().steps:
            fed = step.forwards.get(draft, [])
            total.update(rounds=1, tokens=len(step.committed_tokens), forwards=len(fed), fed=sum(fed),
                         drafting=step.phase_s.get("stage1_draft", 0.0) + step.phase_s.get("stage2_draft", 0.0),
                         verifying=step.phase_s.get("verify", 0.0))
    print(f"copied guesses {'up to ' + str(COPIED_RUN) if copies else 'off'}: {total['rounds']} rounds, "
          f"{total['tokens']} tokens, {total['forwards']} draft forwards of {total['fed']} tokens, drafting "
          f"{total['drafting']:.2f} s, verifying {total['verifying']:.2f} s", flush=True)
