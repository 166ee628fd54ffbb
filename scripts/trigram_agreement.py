"""How well trigrams built with and without a draft's own text guess that draft: top-1 agreement with the
draft's greedy 64-token continuations of the HumanEval prompts, teacher-forced. Even-numbered prompts
chose the weight (specviz.auto_trigram.DRAFT_TEXT_WEIGHT); odd-numbered ones are held out.

    PYTHONPATH=. python scripts/trigram_agreement.py qwen2.5-coder-0.5b assets/draft_text/qwen2.5-coder-0.5b.jsonl.gz

Prints one JSON line per trigram. Takes about 10 minutes on 2 cores (the draft's continuations: 7).
"""
import json
import sys

import torch

from specviz.auto_trigram import python_source_files, read_draft_text
from specviz.drafters.katz import KatzTrigram
from specviz.models import load_model
from specviz.prompts import load_prompts
from specviz.train.evaluate import agreement
from specviz.train.trigram import sample_continuations


def main(draft_spec: str, text_path: str) -> None:
    torch.set_num_threads(2)
    draft = load_model(draft_spec, "float32")
    tok = draft.tokenizer
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]    # noqa: E731
    prompts = [encode(p.text) for p in load_prompts()]
    by_prompt = {tuple(p): c for p, c in sample_continuations(draft.model, prompts, 64, 41, 0.0,
                                                               tok.pad_token_id, minutes=1e9)}
    continuations = [by_prompt[tuple(p)] for p in prompts]
    source = [encode(p.read_text(encoding="utf-8", errors="replace")) for p in python_source_files()]
    written = [encode(t) for t in read_draft_text(text_path)]
    print(json.dumps({"source_tokens": sum(map(len, source)), "draft_text_tokens": sum(map(len, written))}))
    for name, source_weight, text_weight in (("stdlib", 1, 0), ("stdlib + text", 1, 1), ("stdlib + text x4", 1, 4),
                                             ("stdlib + text x16", 1, 16), ("text only", 0, 1)):
        trigram = KatzTrigram.build(source * source_weight + written * text_weight, len(tok))
        row = {"trigram": name}
        for half, parity in (("even prompts (chose the weight)", 0), ("odd prompts (held out)", 1)):
            guesses, truth = [], []
            for j, (p, c) in enumerate(zip(prompts, continuations)):
                if j % 2 == parity:
                    t = p + c
                    guesses.append([(trigram.top(t[:i], 1) or [(-1, 0.0)])[0][0] for i in range(len(p), len(t))])
                    truth.append(c)
            row[half] = agreement(guesses, truth)["pooled_over_tokens"]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
