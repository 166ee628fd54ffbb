"""The stage-2 Katz-backoff trigram, built from text the draft samples from documented-function prompts
plus the raw corpus (and optionally the target's labelled text): the `trigram` command."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from ..decode.drafters.ngram import KatzTrigram
from .common import DATA, log, target_tokenizer
from .data import batches_by_length, labelled_shards, load_labelled
from .sources import documented_function_prompts


@torch.no_grad()
def sample_continuations(model, prompts: list[list[int]], new_tokens: int, batch_size: int,
                         temperature: float, pad_id: int, minutes: float,
                         seed: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt, continuation) pairs from left-padded batches of prompts of similar length, in the order
    sampled (batches shuffled when seeded), until the minutes run out. Temperature 0 decodes greedily."""
    out, start = [], time.time()
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
        else dict(do_sample=False)
    for batch in batches_by_length(prompts, batch_size, seed):
        if time.time() - start > minutes * 60:
            break
        rows = [prompts[j] for j in batch]
        longest = max(map(len, rows))
        ids = torch.tensor([[pad_id] * (longest - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             pad_token_id=pad_id, **sampling)
        out += [(r, [t for t in g[longest:].tolist() if t != pad_id]) for r, g in zip(rows, gen)]
        log(f"sampled {len(out)} continuations, {sum(len(c) for _, c in out)} tokens")
    return out


def cmd_trigram(args) -> None:
    """Build the Katz trigram from draft-sampled text plus the raw corpus; save assets/trigram.npz."""
    from transformers import AutoModelForCausalLM
    tok = target_tokenizer()
    samples_path = DATA / f"draft_samples_{Path(args.draft).name}.npz"     # kept per draft: resumable
    if args.sample_minutes > 0 and not samples_path.exists():
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        prompts = documented_function_prompts(tok, args.max_prompts, 192, args.seed + 1)
        pairs = sample_continuations(draft, prompts, args.new_tokens, args.batch_size,
                                     args.temperature, tok.pad_token_id, args.sample_minutes)
        samples = [p + c for p, c in pairs]
        np.savez(samples_path, tokens=np.concatenate(samples).astype(np.int32),
                 lengths=np.array(list(map(len, samples))),
                 continuation_tokens=np.array(sum(len(c) for _, c in pairs)))
    sequences = []
    if samples_path.exists() and args.sample_minutes > 0:
        z = np.load(samples_path)
        sequences += np.split(z["tokens"], np.cumsum(z["lengths"])[:-1])
    drafted = sum(map(len, sequences))            # prompts (from source files) + sampled text
    target_text = [np.array(x["tokens"]) for x in load_labelled(labelled_shards("target"))] \
        if args.target_text else []
    sequences += target_text
    corpus = np.load(DATA / "corpus.npy")[:args.corpus_tokens] if args.corpus_tokens else []
    if len(corpus):
        eos = np.flatnonzero(corpus == tok.eos_token_id)
        sequences += np.split(corpus, eos + 1)
    log(f"building from {drafted} draft-sampled + {sum(map(len, target_text))} target-generated "
        f"+ {len(corpus)} corpus tokens")
    model = KatzTrigram.build(sequences, vocab_size=len(tok), min_bigram_count=args.min_bigram,
                              min_trigram_count=args.min_trigram)
    model.save(args.out)
    info = {"command": args.command_line, "draft_sample_tokens_with_prompts": drafted,
            "target_text_tokens": sum(map(len, target_text)), "corpus_tokens": len(corpus),
            "bigrams": model.num_bigrams, "trigrams": model.num_trigrams,
            "bytes": os.path.getsize(args.out), "d2": model.d2, "d3": model.d3}
    (DATA / f"trigram_build_{Path(args.out).stem}.json").write_text(json.dumps(info, indent=1))
    log("saved", args.out, info)
