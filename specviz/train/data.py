"""Target-labelled data: the target's top-k logits over greedy continuations (HumanEval, documented
functions) or teacher-forced windows of raw code, stored as .npz shards under data/<set>/; and the
data-* commands that build those sets and the tokenised corpus."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..models.load import load_model
from .common import DATA, TARGET, log, target_tokenizer
from .sources import documented_function_prompts, humaneval_prompts, python_source_files, read_text


@torch.no_grad()
def _topk_of_hidden(model, hidden: torch.Tensor, k: int, rows: int = 2048):
    """Top-k logits of the LM head for hidden states [N, H], computed in row chunks to save memory."""
    values, indices = [], []
    for chunk in hidden.split(rows):
        v, i = model.lm_head(chunk).topk(k, dim=-1)
        values.append(v)
        indices.append(i)
    return torch.cat(values), torch.cat(indices)


@torch.no_grad()
def greedy_with_labels(model, prompts: list[list[int]], new_tokens: int, k: int, pad_id: int,
                       eos_id: int) -> list[dict]:
    """Greedy-decode a left-padded batch; return per sequence its tokens (prompt + continuation up
    to and including EOS), the prompt length, and the target's top-k logits at every position."""
    batch, longest = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, longest), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, longest - len(p):] = torch.tensor(p)
        mask[row, longest - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    hidden = out.last_hidden_state
    v, i = _topk_of_hidden(model, hidden.reshape(-1, hidden.shape[-1]), k)
    step_values, step_indices = [v.view(batch, longest, k)], [i.view(batch, longest, k)]
    cache = out.past_key_values
    for _ in range(new_tokens):          # one step more than kept: labels after the last token
        next_ids = step_indices[-1][:, -1, :1]
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
        positions = positions[:, -1:] + 1
        out = model.model(input_ids=next_ids, attention_mask=mask, position_ids=positions,
                          past_key_values=cache, use_cache=True)
        v, i = _topk_of_hidden(model, out.last_hidden_state[:, -1], k)
        step_values.append(v[:, None])
        step_indices.append(i[:, None])
    values, indices = torch.cat(step_values, 1), torch.cat(step_indices, 1)
    results = []
    for row, p in enumerate(prompts):
        pad = longest - len(p)
        cont = indices[row, longest - 1:longest - 1 + new_tokens, 0].tolist()
        if eos_id in cont:
            cont = cont[:cont.index(eos_id) + 1]
        n = len(p) + len(cont)
        results.append({"tokens": p + cont, "prompt_len": len(p),
                        "top_idx": indices[row, pad:pad + n].numpy().astype(np.int32),
                        "top_logit": values[row, pad:pad + n].numpy().astype(np.float16)})
    return results


def batches_by_length(seqs: list[list[int]], batch_size: int, seed: int | None = None):
    """Index batches of sequences of similar length (less padding); batch order shuffled if seeded."""
    order = sorted(range(len(seqs)), key=lambda j: len(seqs[j]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    if seed is not None:
        random.Random(seed).shuffle(batches)
    return batches


def save_labelled(results: list[dict], path: Path) -> None:
    lens = np.array([len(r["tokens"]) for r in results], dtype=np.int64)
    np.savez(path, tokens=np.concatenate([np.array(r["tokens"], dtype=np.int32) for r in results]),
             lengths=lens, prompt_lens=np.array([r["prompt_len"] for r in results]),
             top_idx=np.concatenate([r["top_idx"] for r in results]),
             top_logit=np.concatenate([r["top_logit"] for r in results]))


def load_labelled(paths) -> list[dict]:
    """Inverse of save_labelled over several shards."""
    out = []
    for path in paths:
        z = np.load(path)
        starts = np.concatenate([[0], np.cumsum(z["lengths"])])
        for j, pl in enumerate(z["prompt_lens"]):
            a, b = starts[j], starts[j + 1]
            out.append({"tokens": z["tokens"][a:b].tolist(), "prompt_len": int(pl),
                        "top_idx": z["top_idx"][a:b], "top_logit": z["top_logit"][a:b]})
    return out


def label_prompts(prompts: list[list[int]], out_dir: Path, new_tokens: int, batch_size: int,
                  k: int, minutes: float, seed: int | None = None) -> None:
    """Run the target over prompts batch by batch, one shard file per batch, until time is up."""
    target = load_model(TARGET)
    tok = target.tokenizer
    out_dir.mkdir(parents=True, exist_ok=True)
    start, total = time.time(), 0
    for n, batch in enumerate(batches_by_length(prompts, batch_size, seed)):
        shard = out_dir / f"shard_{n:04d}.npz"
        if shard.exists():
            continue
        if time.time() - start > minutes * 60:
            log(f"time budget of {minutes} min used; stopping before batch {n}")
            break
        results = greedy_with_labels(target.model, [prompts[j] for j in batch], new_tokens, k,
                                     tok.pad_token_id, tok.eos_token_id)
        save_labelled(results, shard)
        total += sum(len(r["tokens"]) for r in results)
        log(f"batch {n}: {len(batch)} seqs, {total} labelled tokens, "
            f"{total / (time.time() - start):.0f} tok/s")


def summarise_labelled(name: str, command: str) -> dict:
    """Counts of a labelled data set, written next to its shards as info.json."""
    seqs = load_labelled(labelled_shards(name))
    prompt = sum(s["prompt_len"] for s in seqs)
    total = sum(len(s["tokens"]) for s in seqs)
    info = {"command": command, "sequences": len(seqs), "tokens": total, "prompt_tokens": prompt,
            "continuation_tokens": total - prompt, "shards": len(labelled_shards(name))}
    (DATA / name / "info.json").write_text(json.dumps(info, indent=1))
    log(name, info)
    return info


def cmd_data_eval(args) -> None:
    """The target's greedy continuations of all 164 HumanEval prompts (the held-out set)."""
    tok = target_tokenizer()
    prompts = [tok(p).input_ids for p in humaneval_prompts()]
    label_prompts(prompts, DATA / "humaneval", args.new_tokens, args.batch_size, args.k, 1e9)
    summarise_labelled("humaneval", args.command_line)


def cmd_data_target(args) -> None:
    """Target-labelled training sequences: prompts are documented functions from Python source."""
    tok = target_tokenizer()
    ids = documented_function_prompts(tok, args.max_prompts, args.max_prompt_tokens, args.seed)
    log(f"{len(ids)} prompts, {sum(map(len, ids))} prompt tokens")
    label_prompts(ids, DATA / "target", args.new_tokens, args.batch_size, args.k, args.minutes,
                  seed=args.seed)
    summarise_labelled("target", args.command_line)


@torch.no_grad()
def teacher_forced_labels(model, windows: np.ndarray, k: int) -> list[dict]:
    """The target's top-k logits at every position of each window (one batched forward, no
    generation: far cheaper per labelled token than greedy decoding)."""
    hidden = model.model(input_ids=torch.from_numpy(windows.astype(np.int64))).last_hidden_state
    values, indices = _topk_of_hidden(model, hidden.reshape(-1, hidden.shape[-1]), k)
    values = values.float().view(*windows.shape, k)
    indices = indices.view(*windows.shape, k)
    return [{"tokens": w.tolist(), "prompt_len": 0, "top_idx": indices[r].numpy().astype(np.int32),
             "top_logit": values[r].numpy().astype(np.float16)} for r, w in enumerate(windows)]


def cmd_data_teacher(args) -> None:
    """Target labels on random windows of the raw-code corpus, teacher-forced (data/teacher/)."""
    target = load_model(TARGET, dtype=args.dtype)
    corpus = np.load(DATA / "corpus.npy")
    rng = np.random.default_rng(args.seed)
    out_dir = DATA / "teacher"
    out_dir.mkdir(parents=True, exist_ok=True)
    start, total, n = time.time(), 0, len(labelled_shards("teacher"))
    while time.time() - start < args.minutes * 60:
        starts = rng.integers(0, len(corpus) - args.seq_len, size=args.batch_size)
        windows = np.stack([corpus[a:a + args.seq_len] for a in starts])
        save_labelled(teacher_forced_labels(target.model, windows, args.k), out_dir / f"shard_{n:04d}.npz")
        n += 1
        total += windows.size
        log(f"shard {n}: {total} labelled tokens, {total / (time.time() - start):.0f} tok/s")
    summarise_labelled("teacher", args.command_line)


def cmd_data_corpus(args) -> None:
    """Raw Python source, tokenised into one flat uint16 array (data/corpus.npy)."""
    tok = target_tokenizer()
    chunks, total = [], 0
    for path in python_source_files(seed=args.seed):
        text = read_text(path)
        if not text:
            continue
        ids = tok(text).input_ids + [tok.eos_token_id]
        chunks.append(np.array(ids, dtype=np.uint16))
        total += len(ids)
        if total >= args.max_tokens:
            break
    corpus = np.concatenate(chunks)[:args.max_tokens]
    np.save(DATA / "corpus.npy", corpus)
    (DATA / "corpus_info.json").write_text(json.dumps(
        {"command": args.command_line, "files": len(chunks), "tokens": len(corpus)}, indent=1))
    log(f"corpus: {len(chunks)} files, {len(corpus)} tokens -> {DATA / 'corpus.npy'}")


def labelled_shards(name: str) -> list[Path]:
    return sorted((DATA / name).glob("shard_*.npz"))


def load_label_sets(names: str) -> list[dict]:
    """The labelled sequences of comma-separated sets (target, teacher), in that order."""
    return [s for name in names.split(",") for s in load_labelled(labelled_shards(name))]
