"""Measuring drafters: top-1 agreement of the draft and the trigram with the target's greedy HumanEval
continuations, teacher-forced: the `agreement` command."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..decode.drafters.ngram import KatzTrigram
from .common import target_tokenizer
from .data import labelled_shards, load_labelled
from .sources import humaneval_prompts


def eval_sequences(limit: int | None) -> list[dict]:
    """The target's HumanEval continuations, in HumanEval task order."""
    tok = target_tokenizer()
    order = {tuple(tok(p).input_ids): j for j, p in enumerate(humaneval_prompts())}
    seqs = load_labelled(labelled_shards("humaneval"))
    seqs.sort(key=lambda s: order[tuple(s["tokens"][:s["prompt_len"]])])
    return seqs[:limit]


@torch.no_grad()
def draft_predictions(draft, seq: dict) -> tuple[list[int], list[float]]:
    """Draft argmax and its probability at each continuation position, teacher-forced on prompt +
    target continuation."""
    tokens = torch.tensor([seq["tokens"][:-1]])
    logits = draft(input_ids=tokens, logits_to_keep=len(seq["tokens"]) - seq["prompt_len"]).logits
    top = logits[0].float().softmax(-1).max(-1)
    return top.indices.tolist(), top.values.tolist()


def trigram_predictions(trigram, seq: dict) -> list[int]:
    t = seq["tokens"]
    return [trigram.top(t[:i], 1)[0][0] for i in range(seq["prompt_len"], len(t))]


def agreement(predictions: list[list[int]], references: list[list[int]]) -> dict:
    """Top-1 agreement: the mean over prompts of each prompt's fraction, and pooled over tokens."""
    per_prompt = [float(np.mean(np.array(p) == np.array(r))) for p, r in zip(predictions, references)]
    pooled = np.concatenate([np.array(p) == np.array(r) for p, r in zip(predictions, references)])
    return {"mean_over_prompts": round(float(np.mean(per_prompt)), 4),
            "pooled_over_tokens": round(float(pooled.mean()), 4),
            "prompts": len(per_prompt), "positions": int(len(pooled))}


def cmd_agreement(args) -> None:
    """Top-1 agreement on the target's greedy HumanEval continuations (teacher-forced)."""
    from transformers import AutoModelForCausalLM
    seqs = eval_sequences(args.limit)
    target_next = [s["tokens"][s["prompt_len"]:] for s in seqs]
    result = {}
    draft_next = None
    if args.draft:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        draft_next, draft_confidence = zip(*(draft_predictions(draft, s) for s in seqs))
        result["draft_vs_target"] = agreement(draft_next, target_next)
        # Calibration: a draft whose top-1 probability is far below its agreement makes
        # score-driven trees too small (see train_steps' negatives).
        result["draft_mean_top1_probability"] = round(float(np.mean(np.concatenate(draft_confidence))), 4)
    if args.trigram:
        start = time.time()
        trigram = KatzTrigram.load(args.trigram)
        result["trigram_load_seconds"] = round(time.time() - start, 3)
        tri_next = [trigram_predictions(trigram, s) for s in seqs]
        result["trigram_vs_target"] = agreement(tri_next, target_next)
        if draft_next is not None:
            result["trigram_vs_draft"] = agreement(tri_next, draft_next)
    result["command"] = args.command_line
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
