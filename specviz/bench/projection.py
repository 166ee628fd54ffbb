"""Projection (`--projection`): replay the recorded decisions of real runs on randomly initialised
models of other sizes (the paper's GPT-2 pair, or the Qwen2.5-Coder pair's shapes on a machine that lacks
its weights). A projection, never a measurement, and labelled as one."""
from __future__ import annotations

from collections import Counter, defaultdict
from time import perf_counter

import numpy as np
import torch

from ..decode.engine import Decoder, static_length
from .replay_backend import ReplayBackend, ReplayDrafter, ReplayError, rounds_of
from ..cpu.matmul import install
from ..models.precision import DTYPES
from ..decode.trace import RunRecord
from ..decode.tree import TreeSpec
from .report import fmt, median, ratio

QWEN2 = {"rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
ROUND_PARTS = ("draft", "verify", "bookkeeping")     # a round's time, by part: every phase but the last two drafts
PROJECTION_SIZES = {   # the paper's GPT-2-L target and 40M GPT-2 draft, the Qwen2.5-Coder pair; "tiny*" for tests
    "paper": {"family": "gpt2", "vocab": 50257, "target": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
              "draft": {"n_layer": 4, "n_embd": 512, "n_head": 8}},
    "tiny": {"family": "gpt2", "vocab": 256, "target": {"n_layer": 2, "n_embd": 64, "n_head": 4},
             "draft": {"n_layer": 1, "n_embd": 32, "n_head": 4}},
    # Qwen2.5-Coder-1.5B and 0.5B-Instruct as their GGUF files give them (specviz/models/chunked.py)
    "qwen-coder": {"family": "qwen2", "vocab": 151936,
                   "target": {"num_hidden_layers": 28, "hidden_size": 1536, "intermediate_size": 8960,
                              "num_attention_heads": 12, "num_key_value_heads": 2, **QWEN2},
                   "draft": {"num_hidden_layers": 24, "hidden_size": 896, "intermediate_size": 4864,
                             "num_attention_heads": 14, "num_key_value_heads": 2, **QWEN2}},
    "tiny-qwen": {"family": "qwen2", "vocab": 256,
                  "target": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                             "num_attention_heads": 4, "num_key_value_heads": 2, **QWEN2},
                  "draft": {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                            "num_attention_heads": 4, "num_key_value_heads": 2, **QWEN2}},
}
PROJECTION_NOTE = ("PROJECTION, not a measurement: randomly initialised models of the given sizes run the "
                   "engine's rounds again with the decisions recorded from real runs (the replay backend, "
                   "specviz/bench/replay_backend.py): whole rounds are timed (tree building, masks, the target's "
                   "forward, verification, commits), decode only: the target's prompt read is excluded, a draft's (its "
                   "first recorded forward) is not. The drafts feed the recorded forward sizes and hand back the "
                   "recorded trees, so an n-gram or lookup stage's own work is not timed; "
                   "sampled runs are verified greedily along their recorded path.")


def random_model(family: str, sizes: dict, vocab: int, device: str, dtype: str, seed: int) -> torch.nn.Module:
    """A randomly initialised causal LM of these sizes: GPT-2 or Qwen2."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=4096, bos_token_id=None, eos_token_id=None, **sizes)
        build = GPT2LMHeadModel
    else:
        config = Qwen2Config(vocab_size=vocab, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                             **sizes)
        build = Qwen2ForCausalLM
    with torch.device(device):
        model = build(config)
    model = model.to(DTYPES[dtype]).eval().requires_grad_(False)
    install(model)          # as a loaded model: the engine's products, where they apply
    return model


def replay_spec(recorded: dict) -> TreeSpec:
    """A dynamic tree spec that lets every recorded tree grow whole, its last rounds too: the drafter proposes only
    recorded nodes."""
    steps = recorded["steps"]
    budget = max((len(st["tokens"]) - 1 for st in steps), default=0)
    depths = [_depths(st["parents"]) for st in steps]
    branches = [max(Counter(st["parents"][1:]).values(), default=1) for st in steps]
    return TreeSpec(shape="dynamic", budget=min(budget, 256), max_depth=min(max(map(max, depths), default=1) or 1, 64),
                    max_branch=min(max(branches, default=1), 16), level_width=max(budget, 1), past_room=True)


def _depths(parents: list[int]) -> list[int]:
    depths = [0] * len(parents)
    for i, parent in enumerate(parents):
        depths[i] = depths[parent] + 1 if parent >= 0 else 0
    return depths


def static_entries(row: dict) -> int:
    """The static cache a replay of this row needs (see engine.static_length)."""
    recorded = row["_decisions"]
    return static_length(row["prompt_tokens"], _new_tokens(recorded), replay_spec(recorded))


def _new_tokens(recorded: dict) -> int:
    return sum(st["committed"] for st in recorded["steps"])


def decisions(steps) -> dict:
    """What a projection replays of a run's trace records: per round the tree, the accepted path and each
    model's forward sizes."""
    return {"stages": [vars(st) for st in steps[0].stages] if steps else [],
            "steps": [{"tokens": [n.token for n in st.nodes], "parents": [n.parent for n in st.nodes],
                       "probs": [n.draft_prob for n in st.nodes], "path": list(st.accepted_path),
                       "forwards": st.forwards,
                       "committed": len(st.committed_tokens)} for st in steps]}


def recorded_rows(paths: list[str]) -> list[dict]:
    """Rows to project from recordings (specviz.recording files): one per recorded lane of ours, with its
    decisions; the prompt is named by the file."""
    from pathlib import Path

    from ..recording import load
    from .settings import sampling_name

    rows = []
    for path in paths:
        for strategy, lane in load(path).lanes.items():
            rows.append({"prompt": Path(path).name.split(".")[0], "sampling": sampling_name(lane.sampling),
                         "strategy": strategy, "prompt_tokens": len(lane.prompt),
                         "_decisions": decisions(lane.recorded_steps)})
    return rows


class NodeIds:
    """A replayed run's tokens are recorded node ids (specviz/bench/replay_backend.py): their text is the id."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)


def replay(target, drafts: dict, recorded: dict, prompt_tokens: int, vocab: int,
           static_len: int | None = None, compiled=None) -> tuple[float, RunRecord]:
    """Run a recorded generation's rounds again through the engine on other models (the replay backend); return the
    decode's seconds (the target's prompt read excluded; a draft reads the prompt in its first round, as recorded)
    and its run record."""
    rounds = rounds_of(recorded, vocab)
    drafter = ReplayDrafter(rounds, drafts, vocab) if any(r.nodes > 1 for r in rounds) else None
    prompt = torch.randint(0, vocab, (prompt_tokens,)).tolist()
    replayed = ReplayBackend(target, rounds)(target.model, target.name, static_len=static_len, compiled=compiled)
    decoder = Decoder(replayed, NodeIds(), prompt, drafter=drafter, strategy="replay", tree=replay_spec(recorded),
                      max_new_tokens=_new_tokens(recorded), stop_at_eos=False)
    _sync(target)
    started = perf_counter()
    run = decoder.generate()
    _sync(target)
    seconds = perf_counter() - started
    replayed = [[st.nodes[n].token for n in st.accepted_path[1:]] for st in run.steps]
    if replayed != [step["path"][1:] for step in recorded["steps"]]:
        raise ReplayError("the replay accepted other paths than the recording")
    return seconds, run


def _sync(kv) -> None:
    if kv.device.type == "cuda":
        torch.cuda.synchronize(kv.device)


def _models(spec: dict, device: str, dtype: str, names: list[str], static_len: int | None):
    """The target's cache and one per draft stage name (the draft model shared), compiled over static caches
    of `static_len` entries, with every bucket compiled before anything is timed; eager where it is None."""
    from ..backends.choose import open_cache
    from ..models.load import compile_model

    models = [random_model(spec["family"], spec[role], spec["vocab"], device, dtype, seed)
              for seed, role in enumerate(("target", "draft"))]
    compiled = [None, None] if static_len is None else [compile_model(model) for model in models]
    for model, fast in zip(models, compiled):
        if fast is not None:
            open_cache(model, "compile", static_len=static_len, compiled=fast).compile_buckets()
    target = open_cache(models[0], "target", static_len=static_len, compiled=compiled[0])
    drafts = {name: open_cache(models[1], name, static_len=static_len, compiled=compiled[1]) for name in names}
    return target, drafts, models, compiled[0]


@torch.inference_mode()
def project(rows: list[dict], sizes: str = "paper", device: str = "cpu", dtype: str = "float32",
            compile: bool = False) -> dict:
    """Replay every engine run in `rows` (with recorded decisions) on random models of `sizes`. compile: the
    models run torch.compile'd over static caches (CUDA graphs on a GPU), as `bench --compile` runs ours."""
    spec = PROJECTION_SIZES[sizes]
    rows = [row for row in rows if row.get("_decisions")]
    names = sorted({st["name"] for row in rows for st in row["_decisions"]["stages"][1:] if st["kind"] == "model"})
    static_len = max(map(static_entries, rows), default=256) if compile else None
    target, drafts, models, compiled = _models(spec, device, dtype, names, static_len)

    def run(row):
        return replay(target, _drafts_of(drafts, row), row["_decisions"], row["prompt_tokens"], spec["vocab"],
                      static_len, compiled)

    if rows:        # once untimed: kernels load, caches allocate
        run(rows[0])
    out = []
    for row in rows:
        seconds, record = run(row)
        new = len(record.tokens)
        out.append({"prompt": row["prompt"], "sampling": row["sampling"], "strategy": row["strategy"],
                    "new_tokens": new, "target_forwards": len(record.steps), "wall_s": seconds,
                    "tokens_per_s": new / seconds if seconds > 0 else 0.0,
                    "phase_s": round_parts(record.steps)})
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
                "phase_share": _shares(rs), "prompts": len(rs)} for (sampling, strategy), rs in groups.items()]
    return {"note": PROJECTION_NOTE, "sizes": sizes, "configs": spec, "device": device, "dtype": dtype,
            "compiled": compile, "static_cache_entries": static_len,
            "target_params": sum(p.numel() for p in models[0].parameters()),
            "draft_params": sum(p.numel() for p in models[1].parameters()),
            "results": results, "per_prompt": out}


def round_parts(steps) -> dict[str, float]:
    """The rounds' seconds by part: drafting (tree building and each stage's draft phase), verifying, bookkeeping."""
    parts = dict.fromkeys(ROUND_PARTS, 0.0)
    for step in steps:
        for phase, seconds in step.phase_s.items():
            parts[phase if phase in parts else "draft"] += seconds
    return parts


def _shares(rows: list[dict]) -> dict[str, float]:
    """Each part's share of the rows' round time (drafting: tree building and the drafts' forwards; the target's
    verification; bookkeeping)."""
    total = Counter()
    for row in rows:
        total.update(row["phase_s"])
    whole = sum(total.values()) or 1.0
    return {name: seconds / whole for name, seconds in total.items()}


def _drafts_of(drafts: dict, row: dict) -> dict:
    """The draft caches a row's stages name, in stage order."""
    return {st["name"]: drafts[st["name"]] for st in row["_decisions"]["stages"][1:] if st["kind"] == "model"}


def format_projection(projection: dict) -> str:
    lines = [f"*** {projection['note']}",
             f"*** target {projection['target_params'] / 1e6:.0f}M, draft {projection['draft_params'] / 1e6:.0f}M "
             f"parameters, {projection['device']} {projection['dtype']}"
             f"{', compiled' if projection.get('compiled') else ''}",
             "sampling  strategy     projected tok/s med [p25-p75]  vs base  tok/fwd  draft/verify/bookkeeping"]
    for r in projection["results"]:
        lines.append(f"{r['sampling']:<9} {r['strategy']:<12} {r['tokens_per_s_median']:8.1f} "
                     f"[{r['tokens_per_s_p25']:.1f}-{r['tokens_per_s_p75']:.1f}]"
                     f"{'':8}{fmt(r['speedup_vs_baseline'], '{:.2f}x'):>7}  {r['tokens_per_target_forward']:7.2f}  "
                     + "/".join(f"{r['phase_share'].get(name, 0):.0%}" for name in ROUND_PARTS))
    return "\n".join(lines)
