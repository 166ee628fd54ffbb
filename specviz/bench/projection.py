"""Projection (`--projection`): replay the recorded decisions of real runs on randomly initialised
GPT-2 models of the paper's sizes. A projection, never a measurement, and labelled as one."""
from __future__ import annotations

from time import perf_counter

from collections import defaultdict

import numpy as np
import torch

from ..models import DTYPES
from .report import fmt, median, ratio

PROJECTION_SIZES = {   # GPT-2 configs: the paper's GPT-2-L target and 40M GPT-2 draft; "tiny" for tests
    "paper": {"vocab": 50257, "target": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
              "draft": {"n_layer": 4, "n_embd": 512, "n_head": 8}},
    "tiny": {"vocab": 256, "target": {"n_layer": 2, "n_embd": 64, "n_head": 4},
             "draft": {"n_layer": 1, "n_embd": 32, "n_head": 4}},
}
PROJECTION_NOTE = ("PROJECTION, not a measurement: randomly initialised GPT-2 models of the given sizes replay "
                   "the token trees, accepted paths and draft forward sizes recorded from the real runs of this "
                   "benchmark. Only model forwards and KV-cache commits are timed (decode only, prefill excluded); "
                   "tree building, n-gram/lookup stages, sampling and verification logic are not.")


def random_gpt2(sizes: dict, vocab: int, device: str, dtype: str, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=4096, bos_token_id=None, eos_token_id=None, **sizes)
    with torch.device(device):
        model = GPT2LMHeadModel(config)
    return model.to(DTYPES[dtype]).eval().requires_grad_(False)


def replay(target, drafts: dict, recorded: dict, prompt_tokens: int, vocab: int) -> tuple[float, int, int]:
    """Re-run a recorded generation's forwards on other models; return (seconds, new tokens, target forwards)."""
    from ..tree import ancestor_matrix

    def tokens(n):
        return torch.randint(0, vocab, (n,)).tolist()

    models = [target] + [drafts[name] for name in drafts]
    for kv in models:
        kv.reset()
        if prompt_tokens > 1:
            kv.feed_committed(tokens(prompt_tokens - 1), keep=1)
    _sync(target)
    started = perf_counter()
    new = forwards = 0
    for step in recorded["steps"]:
        parents = step["parents"]
        depths = [0] * len(parents)
        for i, parent in enumerate(parents):
            depths[i] = depths[parent] + 1 if parent >= 0 else 0
        target.forward([t % vocab for t in step["tokens"]], [target.committed + d for d in depths],
                       ancestor_matrix(parents))
        target.commit(step["path"])
        for name, kv in drafts.items():
            for n in step["forwards"].get(name, []):
                visible = torch.cat([torch.zeros(n, kv.pending, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1)
                kv.forward(tokens(n), list(range(kv.length, kv.length + n)), visible)
            kv.commit(list(range(min(kv.pending, step["committed"]))))
        new += step["committed"]
        forwards += 1
    _sync(target)
    return perf_counter() - started, new, forwards


def _sync(kv) -> None:
    if kv.device.type == "cuda":
        torch.cuda.synchronize(kv.device)


@torch.inference_mode()
def project(rows: list[dict], sizes: str = "paper", device: str = "cpu", dtype: str = "float32") -> dict:
    """Replay every engine run in `rows` (with recorded decisions) on random models of `sizes`."""
    from ..cache import KVModel

    spec = PROJECTION_SIZES[sizes]
    target = KVModel(random_gpt2(spec["target"], spec["vocab"], device, dtype, 0), "target")
    draft_model = random_gpt2(spec["draft"], spec["vocab"], device, dtype, 1)
    out = []
    for row in rows:
        recorded = row.get("_decisions")
        if not recorded:
            continue
        names = [st["name"] for st in recorded["stages"][1:] if st["kind"] == "model"]
        drafts = {name: KVModel(draft_model, name) for name in names}
        seconds, new, forwards = replay(target, drafts, recorded, row["prompt_tokens"], spec["vocab"])
        out.append({"prompt": row["prompt"], "sampling": row["sampling"], "strategy": row["strategy"],
                    "new_tokens": new, "target_forwards": forwards, "wall_s": seconds,
                    "tokens_per_s": new / seconds if seconds > 0 else 0.0})
    base = {(r["prompt"], r["sampling"]): r["tokens_per_s"] for r in out if r["strategy"] == "baseline"}
    for r in out:
        r["speedup_vs_baseline"] = ratio(r["tokens_per_s"], base.get((r["prompt"], r["sampling"])))
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in out:
        groups[(r["sampling"], r["strategy"])].append(r)
    results = [{"strategy": strategy, "sampling": sampling,
                "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in rs])),
                "tokens_per_s_p25": float(np.percentile([r["tokens_per_s"] for r in rs], 25)),
                "tokens_per_s_p75": float(np.percentile([r["tokens_per_s"] for r in rs], 75)),
                "speedup_vs_baseline": median(r["speedup_vs_baseline"] for r in rs),
                "tokens_per_target_forward": sum(r["new_tokens"] for r in rs) / sum(r["target_forwards"] for r in rs),
                "prompts": len(rs)} for (sampling, strategy), rs in groups.items()]
    return {"note": PROJECTION_NOTE, "sizes": sizes, "configs": spec, "device": device, "dtype": dtype,
            "target_params": sum(p.numel() for p in target.model.parameters()),
            "draft_params": sum(p.numel() for p in draft_model.parameters()),
            "results": results, "per_prompt": out}


def format_projection(projection: dict) -> str:
    lines = [f"*** {projection['note']}",
             f"*** target {projection['target_params'] / 1e6:.0f}M, draft {projection['draft_params'] / 1e6:.0f}M "
             f"parameters, {projection['device']} {projection['dtype']}",
             "sampling  strategy     projected tok/s med [p25-p75]  vs base  tok/fwd"]
    for r in projection["results"]:
        lines.append(f"{r['sampling']:<9} {r['strategy']:<12} {r['tokens_per_s_median']:8.1f} "
                     f"[{r['tokens_per_s_p25']:.1f}-{r['tokens_per_s_p75']:.1f}]"
                     f"{'':8}{fmt(r['speedup_vs_baseline'], '{:.2f}x'):>7}  {r['tokens_per_target_forward']:.2f}")
    return "\n".join(lines)
