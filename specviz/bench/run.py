"""Timing one generation (our decoders, or transformers' generate as a user runs it) and the whole
benchmark: prompt-major, so machine noise hits every strategy alike."""
from __future__ import annotations

import sys
from collections import Counter
from time import perf_counter

import torch

from ..peers import llama_cpp, reference
from ..peers.hf import PEERS, PROMPT_LOOKUP_TOKENS, hf_generate
from ..analysis.priced import price
from ..models.prompt_format import NoChatTemplate, default_format, encode_prompt
from .prompts import Prompt
from ..stack.plans import keep_learnt
from ..stack.strategies import STRATEGIES, default_tree
from .projection import decisions, project
from .report import compare_rows, reference_strategy, summarise
from .settings import BenchError, parse_sampling, usable_strategies, with_seed

WARMUP_TOKENS = 8
# Every lane writes the same number of tokens, so that speeds compare like for like; the app and the CLI stop at the
# model's end-of-text tokens instead (specviz/decode/end_tokens.py)
FIXED_LENGTH = ("every lane writes exactly {} tokens, past any end-of-text token, so that the lanes compare like for "
                "like (the app and the CLI stop at the model's end of text)")


class ForwardClock:
    """Wall time spent inside the forward passes of the given models (forward hooks): the HF peers' clock.
    Our decoders time their own forwards (Decoder.forward_seconds), whose output layer may run outside
    the model's modules (specviz/backends/choose.py)."""

    def __init__(self, models):
        self.seconds = 0.0
        self._started: list[float] = []
        self._handles = []
        for model in models:
            self._handles.append(model.register_forward_pre_hook(self._pre))
            self._handles.append(model.register_forward_hook(self._post))

    @torch.compiler.disable
    def _pre(self, module, args):
        self._started.append(perf_counter())

    @torch.compiler.disable
    def _post(self, module, args, output):
        started = self._started.pop()
        if not self._started:           # count nested model calls once
            self.seconds += perf_counter() - started

    def close(self):
        for handle in self._handles:
            handle.remove()


def run_engine(stack, strategy, prompt_ids, sampling, max_new_tokens, tree=None, keep: bool = True) -> dict:
    """tree: overrides of the strategy's default tree (budget, lookup, min_score, max_depth). keep: store what the
    planner learnt for the next run (a repeat that another repeat follows keeps nothing: each starts alike)."""
    started = perf_counter()
    # no stop at end-of-sequence: every strategy makes the same number of tokens
    decoder = stack.decoder(prompt_ids, strategy, default_tree(strategy, **(tree or {})), sampling,
                            max_new_tokens, stop_at_eos=False)
    run = decoder.generate()
    wall = perf_counter() - started
    if keep:
        keep_learnt(decoder, stack.profile)
    s = run.stats
    # the planner's curves never change in a run (only what it learns a level costs)
    priced = (price(run.steps, decoder.planner.costs, decoder.target.name).to_dict()
              if decoder.planner is not None else None)
    return {"tokens": run.tokens, "wall_s": wall, "target_forwards": s["target_forwards"],
            "draft_forwards": sum(s["draft_forwards"].values()),
            "mean_accepted_per_target_forward": s["mean_accepted_per_target_forward"],
            "steps": s["steps"], "bytes_per_token": s["bytes_per_token"],
            "decode_wall_s": s["wall_s"], "phase_s": s["phase_s"], "forward_s": decoder.forward_seconds(),
            "rounds_by_plan": s.get("rounds_by_plan"), "lookup_joined_by_plan": s.get("lookup_joined_by_plan"),
            "priced": priced, "_decisions": decisions(run.steps)}


def run_peer(stack, strategy, prompt_ids, sampling, max_new_tokens) -> dict:
    assistant = stack.assistant()[1] if strategy == "hf_assisted" else None
    lookup = PROMPT_LOOKUP_TOKENS if strategy == "hf_prompt_lookup" else None
    clock = ForwardClock([m for m in (stack.target.model, assistant) if m is not None])
    try:
        run = hf_generate(stack.target.model, prompt_ids, sampling, max_new_tokens, assistant, lookup)
    finally:
        clock.close()
    return {"tokens": run.tokens, "wall_s": run.wall_s, "target_forwards": run.target_forwards,
            "draft_forwards": run.draft_forwards, "mean_accepted_per_target_forward": None, "steps": None,
            "bytes_per_token": None, "decode_wall_s": None, "phase_s": None, "forward_s": clock.seconds}


def run_llama_cpp(stack, strategy, prompt_ids, sampling, max_new_tokens) -> dict:
    """llama.cpp's own program on the stack's GGUF files, as many threads as ours. Its clock stops when
    the max_new_tokens-th token arrived; its text is compared with baseline's as text (peers/llama_cpp.py)."""
    run, chunks = llama_cpp.generate_for(stack, strategy, prompt_ids, sampling, max_new_tokens)
    return {"tokens": [t for _, chunk in chunks for t in chunk], "wall_s": chunks[-1][0] if chunks else run.seconds,
            "target_forwards": run.target_forwards, "draft_forwards": run.drafted or 0,
            "mean_accepted_per_target_forward": None if run.accepted is None else run.accepted / run.target_forwards,
            "steps": None, "bytes_per_token": None, "decode_wall_s": None, "phase_s": None, "forward_s": None,
            "_text": run.text}


def run_strategy(stack, strategy, prompt_ids, sampling, max_new_tokens, tree=None, keep: bool = True) -> dict:
    """keep: store what our planner learnt (run_engine)."""
    if strategy in PEERS:
        return run_peer(stack, strategy, prompt_ids, sampling, max_new_tokens)
    if strategy in llama_cpp.PEERS:
        return run_llama_cpp(stack, strategy, prompt_ids, sampling, max_new_tokens)
    return run_engine(stack, strategy, prompt_ids, sampling, max_new_tokens, tree, keep)



def run_bench(stack, prompts: list[Prompt], strategies: list[str], samplings: list[str],
              max_new_tokens: int, seed: int = 0, tree: dict | None = None,
              progress: bool = True, warmup: bool = True, projection: str | None = None,
              device: str = "cpu", dtype: str = "float32", compile: bool = False,
              prompt_format: str | None = None, repeats: int = 1) -> dict:
    """Run every strategy on every prompt under every sampling.

    Returns {"settings", "results" (one row per sampling and strategy), "per_prompt"} and, with
    `projection` (a PROJECTION_SIZES name), "projection". compile: our strategies run the compiled target
    over one static cache length, compiled for every bucket before anything is timed. prompt_format: chat or
    completion for every prompt (None: each prompt's default, as in the app). repeats: runs of each strategy per
    prompt and sampling, each repeat in the order rotated by one, so that no strategy always runs first or right after
    another; each row is the strategy's run of median time, with every run's time in "wall_s_repeats". Every repeat
    starts from the same stored calibration, so repeats replay one run."""
    strategies, notes = usable_strategies(stack, strategies)
    if not strategies:
        raise BenchError("no strategy can run: " + "; ".join(notes))
    settings = {name: parse_sampling(name, seed) for name in samplings}
    formats = {p.id: prompt_format or default_format(p.text, stack.tokenizer) for p in prompts}
    try:
        encoded = [(p, encode_prompt(stack.tokenizer, p.text, formats[p.id])) for p in prompts]
    except NoChatTemplate as exc:
        raise BenchError(f"{exc}: pass --prompt-format completion") from None
    # staged's plan and how each draft reads prompts, as this machine's profile says (prepare measured them)
    planned = "staged" in strategies and default_tree("staged", **(tree or {})).planned
    plan = stack.plans.tree_plan() if planned else None
    reads = stack.prompt_reads.read(stack.draft_models(), stack.profile)
    if compile:
        from ..decode.engine import static_length
        from ..stack.compiled import compile_models
        trees = [stack.plans.planned(default_tree(s, **(tree or {}))) for s in strategies if s in STRATEGIES]
        context = max(static_length(len(ids), max_new_tokens, t) for _, ids in encoded for t in trees)
        stack.compiled = compile_models(stack.target, stack.draft_models(), stack.vocabulary, context)
    if warmup:
        for name, sampling in settings.items():
            for strategy in strategies:
                run_strategy(stack, strategy, encoded[0][1], sampling, min(WARMUP_TOKENS, max_new_tokens), tree)
    bar = _progress(len(prompts) * len(settings) * len(strategies) * repeats, progress)
    rows = []
    for index, (prompt, ids) in enumerate(encoded):
        for name, sampling in settings.items():
            sampling = with_seed(sampling, seed + index)
            runs: dict[str, list[dict]] = {strategy: [] for strategy in strategies}
            for repeat in range(repeats):
                for strategy in strategies[repeat % len(strategies):] + strategies[:repeat % len(strategies)]:
                    bar.set_description(f"{prompt.id} {name} {strategy}", refresh=False)
                    # a planned run starts from the calibration the runs before it stored: were each repeat to store
                    # its own, the next would plan other trees, and sampled repeats wrote other texts
                    runs[strategy].append(run_strategy(stack, strategy, ids, sampling, max_new_tokens, tree,
                                                       keep=repeat == repeats - 1))
                    bar.update()
            for strategy in strategies:
                run = median_run(runs[strategy])
                run.setdefault("_text", stack.tokenizer.decode(run["tokens"]))
                rows.append({"prompt": prompt.id, "prompt_tokens": len(ids), "sampling": name,
                             "strategy": strategy, **run})
    bar.close()
    per_prompt = compare_rows(rows)
    results = summarise(per_prompt)
    ref = reference_strategy(rows)
    report = {"settings": {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "strategies": strategies,
                           "samplings": {n: vars(s) for n, s in settings.items()}, "seed": seed,
                           "repeats": repeats,
                           "prompt_formats": dict(Counter(formats.values())),
                           "tree": tree or {}, "tree_plan": None if plan is None else plan.to_dict(),
                           "prompt_reads": reads, "compiled": compile,
                           "static_cache_entries": stack.compiled.static_len if compile else None,
                           "target": stack.target.name, "drafts": list(stack.drafts), "dtype": stack.dtype,
                           "precision": stack.precision(), "precision_reason": stack.precision_reason,
                           "assistant": stack.assistant()[0], "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
                           "notes": notes, "length": FIXED_LENGTH.format(max_new_tokens)},
              "results": results, "per_prompt": per_prompt,
              "reference": reference.entry(ref, stack.precision(), f"measured in this run on the same prompts, "
                                           f"{torch.get_num_threads()} threads, prompt read included; median over "
                                           "prompts of the first sampling",
                                           next((r["tokens_per_s_median"] for r in results
                                                 if r["strategy"] == ref), None))}
    if projection:
        report["projection"] = project(rows, projection, device, dtype, compile)
    return report


def median_run(runs: list[dict]) -> dict:
    """Of one strategy's repeats on one prompt, the run of median time (the slower middle one of an even count), with
    every repeat's time, and whether every repeat wrote the same tokens (a run that does not repeat itself is not
    exact: report.compare_rows)."""
    ordered = sorted(runs, key=lambda run: run["wall_s"])
    return {**ordered[len(ordered) // 2], "wall_s_repeats": [round(run["wall_s"], 4) for run in runs],
            "repeats_agree": all(run["tokens"] == runs[0]["tokens"] for run in runs)}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, disable=not enabled, file=sys.stderr, unit="run", dynamic_ncols=True)

