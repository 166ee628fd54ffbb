"""The stage-1 draft model: a small Llama sharing the target's vocabulary, distilled from the
target's top-k labels (optionally after a raw-code warm-up), trained over an active output vocabulary;
the `draft` and `output-vocab` commands."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..models.locations import OUTPUT_VOCAB_FILE
from ..models.load import load_model
from .common import DATA, TARGET, log, read_json
from .data import load_label_sets


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


def cmd_draft(args) -> None:
    """Train the stage-1 draft: optional raw-code warm-up, then distillation on target labels."""
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
    path = Path(draft_dir) / OUTPUT_VOCAB_FILE
    np.save(path, active.numpy().astype(np.int32))
    return path


def cmd_output_vocab(args) -> None:
    """Write a trained draft's output_vocab.npy again: the active vocabulary is a pure function of
    the labelled sets (and the corpus, if the run had a corpus warm-up)."""
    corpus = np.load(DATA / "corpus.npy") if args.with_corpus else None
    active = active_vocabulary(load_label_sets(args.labels), corpus, args.active_vocab, args.vocab_size)
    log(f"wrote {len(active)} token ids to {save_output_vocab(Path(args.draft), active)}")
