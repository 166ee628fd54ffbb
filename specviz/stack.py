"""Which models and drafters a strategy uses: the model stack, loaded once and shared.

A stack is the target plus a list of drafter specs, top stage first: model specs (hub id, local
directory, GGUF file, assets/...) and the non-neural drafters "trigram" (assets/trigram.npz or a
path to an .npz) and "lookup". `Stack.decoder()` builds a fresh `Decoder` for one generation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import auto_choice
from .cpu import prompt_reader
from .cpu.decoder import supported as runs_own_forward
from .cpu.machine import give_back_freed_memory
from .auto_trigram import auto_trigram, draft_texts
from .cache import open_cache, restricts_output
from .cost_curve import cost_curves
from .drafters import Drafter, LookupDrafter, ModelDrafter, NgramDrafter
from .backend import Backend
from .drafters.model import LEVEL_FEED
from .tree import TreeSpec
from .engine import Decoder, Prefill, prefill
from .locations import DEFAULT_TARGET
from .paths import ASSETS
from .models import (AUTO_DTYPE, LoadedModel, ModelLoadError, auto_precision, auto_reason,
                     GGUF, check_dtype, check_tokenizers_match, compile_model, draft_precisions, is_gguf, load_model,
                     precision_name)
from .sampling import Sampling
from .calibration import Calibration
from .round_plan import Costs, RoundPlanner
from .strategies import CHAIN_LENGTH, default_tree, drafter_specs, is_ngram
from .tree_plan import DRAFT_FEED, TreePlan, key as plan_key
from .tree_plan_store import stored_plan

DEFAULT_DRAFT = "assets/draft"
DEFAULT_TRIGRAM = "trigram"


STAGED_LEVEL_TOKENS = TreeSpec().level_width * LEVEL_FEED   # a staged level: its nodes, each with a guess after it


def draft_probe_seconds(models: list[torch.nn.Module], under_lower_stage: bool) -> list[float]:
    """What each candidate draft's forwards cost as it will run them, after a short prefix: one token
    per step of a chain; under a lower stage (staged) also a level of its tree, fed with the lower
    stage's guesses. On a CPU without bf16 units a bfloat16 0.5B reads one token 2.6x faster than in
    float32 but 4 tokens or more slower, so the answer depends on the feed.
    The candidates take turns in each round, so this machine's drifting speed hits them alike."""
    sizes = (1, STAGED_LEVEL_TOKENS) if under_lower_stage else (1,)
    return [sum(curve.values()) for curve in cost_curves(models, sizes=sizes, context=64, reps=5)]


def kv_backend(prompt_products: list[dict] | None = None) -> Backend:
    """What makes a model's caches: open_cache, given the products a draft reads prompts through (read_prompts)."""
    return open_cache if prompt_products is None else functools.partial(open_cache, prompt_products=prompt_products)


def draft_choice_key(spec: str, under_lower_stage: bool, target_dtype: str) -> str:
    where = "under a lower stage" if under_lower_stage else "as the top stage"
    return f"draft {spec} {where} of a {target_dtype} target"


def default_drafts() -> list[str]:
    """The offline default cascade: the shipped draft model and trigram where present, else lookup."""
    drafts = [DEFAULT_DRAFT] if (ASSETS / "draft" / "config.json").is_file() else []
    drafts.append(DEFAULT_TRIGRAM if (ASSETS / "trigram.npz").is_file() else "lookup")
    return drafts


def drafter_name(spec: str) -> str:
    """A drafter's name in traces: its file's or folder's name, less a file type (qwen2.5-coder-0.5b stays whole)."""
    path = Path(spec)
    return (path.stem if path.suffix in (".gguf", ".npz") else path.name) or spec


def load_trigram(spec: str):
    from .drafters.katz import KatzTrigram
    path = ASSETS / "trigram.npz" if spec == "trigram" else Path(spec)
    if not path.is_file():
        raise ModelLoadError(f"trigram file not found: {path}")
    return KatzTrigram.load(path)


@dataclass
class Stack:
    target: LoadedModel
    drafts: list[str]                                  # specs, top stage first
    loaded: dict[str, object] = field(default_factory=dict)
    compiled: object = None         # the compiled target every decoder uses (see compile())
    compiled_drafts: dict[str, object] = field(default_factory=dict)   # ...and compiled draft models, by spec
    static_len: int | None = None   # ...and the static KV cache length they share, if fixed
    draft_vocabulary: torch.Tensor | None = None    # see restrict_draft_vocabulary
    precision_reason: str = ""      # under `auto`: why this precision, with the probe's timings (models.auto_reason)
    plans: dict = field(default_factory=dict, repr=False)   # tree_plan()'s answer, once read
    prompt_reads: dict = field(default_factory=dict, repr=False)   # read_prompts()'s answer, by draft spec
    prompt_products: dict = field(default_factory=dict, repr=False)     # ...and the products it reads through

    @classmethod
    def load(cls, target: str = DEFAULT_TARGET, drafts: list[str] | None = None,
             dtype: str = AUTO_DTYPE, device: str = "cpu") -> "Stack":
        check_dtype(dtype)
        auto = dtype == AUTO_DTYPE
        dtype = auto_precision(target, device) if auto else dtype
        stack = cls(load_model(target, dtype, device), default_drafts() if drafts is None else list(drafts))
        for spec in stack.drafts:
            if spec != "lookup":
                stack.loaded[spec] = stack._load_source(spec, dtype, device, auto)
        if auto:
            stack.restrict_draft_vocabulary()
            stack.precision_reason = auto_reason(device, target)
        stack.read_prompts()
        give_back_freed_memory()        # re-quantising the drafts freed their float weights
        return stack

    def read_prompts(self, measure_now: bool = False) -> dict[str, dict]:
        """Each quantized draft model reads prompts in the way stored for it (specviz/cpu/prompt_reader.py): through
        float copies of its weights, or its own summed 8 outputs at a time, where that was measured faster here.
        Measured and stored first where nothing is stored and `measure_now` (setup, the bench, the app before its first
        race), else left to its own products. Returns the choices in use, by draft spec."""
        for spec, draft in self.draft_models().items():
            if (spec in self.prompt_reads and not measure_now) or not runs_own_forward(draft.model):
                continue
            name = prompt_reader.key(Path(draft.name).name or draft.name, draft.dtype)
            choice = auto_choice.decided(name, lambda: prompt_reader.choose(draft.model)) if measure_now \
                else auto_choice.stored(name)
            if not choice or choice == self.prompt_reads.get(spec):      # nothing stored, or in use already
                continue
            self.prompt_reads[spec] = choice
            reads = choice["choice"] != prompt_reader.OWN
            self.prompt_products[spec] = prompt_reader.copies(draft.model, choice["choice"]) if reads else None
        return self.prompt_reads

    def restrict_draft_vocabulary(self) -> None:
        """Draft models above a `trigram:auto` stage predict only the tokens its corpus holds, the special
        tokens and the prompt's tokens, as FR-Spec does with frequent tokens: the 0.5B's output layer is a
        quarter of its weights, and its corpus (stdlib source and the 0.5B's own code) holds 28,149 of
        151,936 tokens. A draft's vocabulary moves acceptance only, never the output."""
        table = self.loaded.get("trigram:auto")
        if table is not None:
            ids = np.union1d(table.seen_tokens(), self.tokenizer.all_special_ids)
            self.draft_vocabulary = torch.from_numpy(ids).long()

    def compile(self, context: int | None = None) -> None:
        """Compile the target's and the draft models' decoding forwards (CUDA graphs on a GPU); decoders
        then keep their KV caches static. The first feed of each bucket size compiles (minutes on a small
        CPU). context: one static cache length for every decoder, compiled now for every bucket (else
        each decoder sizes its own and compiles what it meets)."""
        self.compiled = compile_model(self.target.model)
        self.compiled_drafts = {spec: compile_model(self._draft_body(draft))
                                for spec, draft in self.draft_models().items()}
        self.static_len = context
        if context is not None:
            warm = [(self.target.model, None, self.compiled)] + [
                (draft.model, self._output_vocab(draft, []), self.compiled_drafts[spec])
                for spec, draft in self.draft_models().items()]
            with torch.inference_mode():
                for model, output_vocab, compiled in warm:
                    open_cache(model, "compile", output_vocab, static_len=context, compiled=compiled).compile_buckets()

    def _draft_body(self, draft: LoadedModel) -> torch.nn.Module:
        """What a draft's static forwards run: the model, or its body where its output layer is computed
        for a vocabulary of its own (kv_model.KVModel)."""
        return draft.model.base_model if self._output_vocab(draft, []) is not None else draft.model

    def _load_source(self, spec: str, dtype: str, device: str, auto: bool = False):
        """The model or n-gram table behind a drafter spec. Under `auto` a draft model on a CPU runs in the precision
        whose forwards were fastest as the stack feeds them, of models.draft_precisions (draft_probe_seconds; another
        must be 10% faster than the first to be chosen): measured once per machine and stored (specviz/auto_choice.py).
        A draft's precision only moves acceptance, never the output."""
        if spec == "trigram:auto":
            return auto_trigram(self.tokenizer, self.target_name, draft_texts(self.drafts))
        if is_ngram(spec):
            return load_trigram(spec)
        loaded: dict[str, LoadedModel] = {}
        auto = auto or (dtype == GGUF and not is_gguf(spec))    # a draft that is no GGUF file: the pick for it here
        if auto and device == "cpu":
            lower = self.drafts.index(spec) < len(self.drafts) - 1

            def fastest() -> str:
                loaded.update((name, load_model(spec, name, device, draft=True))
                              for name in draft_precisions(spec, dtype))
                seconds = draft_probe_seconds([c.model for c in loaded.values()], lower)
                seconds[0] *= 0.9
                return list(loaded)[seconds.index(min(seconds))]
            dtype = auto_choice.decided(draft_choice_key(spec, lower, dtype), fastest)
        model = loaded.get(dtype) or load_model(spec, dtype, device, draft=True)
        check_tokenizers_match(self.target, model)
        return model

    @property
    def dtype(self) -> str:
        return self.target.dtype

    def assistant(self) -> tuple[str, torch.nn.Module] | tuple[None, None]:
        """The top draft if it is a neural model: what transformers' assisted generation gets."""
        if self.drafts and isinstance(self.loaded.get(self.drafts[0]), LoadedModel):
            return self.drafts[0], self.loaded[self.drafts[0]].model
        return None, None

    def draft_models(self) -> dict[str, LoadedModel]:
        """The loaded draft models by spec (n-gram tables and lookup left out)."""
        return {spec: m for spec, m in self.loaded.items() if isinstance(m, LoadedModel)}

    @property
    def weight_bytes(self) -> int:
        """Bytes of model weights this stack holds (the target and its draft models)."""
        return self.target.weight_bytes + sum(m.weight_bytes for m in self.draft_models().values())

    def precision(self) -> str:
        """The precisions in use, e.g. `gguf (the file's own blocks)`, or `gguf (...) target, int4 (re-quantised)
        draft` (see _load_source)."""
        drafts = {m.dtype for m in self.draft_models().values()} - {self.dtype}
        if not drafts:
            return precision_name(self.dtype)
        return f"{precision_name(self.dtype)} target, {', '.join(map(precision_name, sorted(drafts)))} draft"

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.target.model.get_output_embeddings().out_features

    @property
    def target_name(self) -> str:
        return Path(self.target.name).name or self.target.name

    def _drafter(self, spec: str, stage: int, lower: Drafter | None, prompt: list[int]) -> Drafter:
        if spec == "lookup":
            return LookupDrafter(self.vocab_size)
        item = self.loaded[spec]
        name = "trigram" if spec == "trigram:auto" else drafter_name(spec)
        if name == self.target_name or self.drafts.index(spec) != stage - 1:
            name = f"{name}@stage{stage}"      # forward logs are kept by name: keep names unique
        if isinstance(item, LoadedModel):
            return ModelDrafter(item.model, name=name, lower=lower, output_vocab=self._output_vocab(item, prompt),
                                compiled=self.compiled_drafts.get(spec),
                                backend=kv_backend(self.prompt_products.get(spec)))
        return NgramDrafter(item, name=name)

    def _output_vocab(self, draft: LoadedModel, prompt: list[int]) -> torch.Tensor | None:
        """The tokens a draft model predicts: its own output vocabulary, else the stack's with the prompt's."""
        if draft.output_vocab is not None or self.draft_vocabulary is None \
                or not restricts_output(draft.model.get_output_embeddings()):
            return draft.output_vocab
        return torch.unique(torch.cat([self.draft_vocabulary, torch.tensor(prompt, dtype=torch.long)]))

    def prefill(self, prompt_ids: list[int]) -> Prefill:
        """The target's and every draft model's read of the prompt, for decoders of it to copy."""
        return prefill(prompt_ids, open_cache(self.target.model, "prefill"),
                       [kv_backend(self.prompt_products.get(spec))(m.model, "prefill")
                        for spec, m in self.draft_models().items()])

    def drafter_for(self, strategy: str, prompt: list[int] = ()) -> Drafter | None:
        """baseline: none; speculative and tree: the top stage alone; staged: the whole cascade."""
        specs = drafter_specs(strategy, self.drafts)
        drafter = None
        for stage in range(len(specs), 0, -1):
            drafter = self._drafter(specs[stage - 1], stage, drafter, list(prompt))
        return drafter

    def tree_plan(self, measure_now: bool = False) -> TreePlan | None:
        """This machine's plan for staged's tree (specviz/tree_plan.py), as stored; measured and stored first where
        there is none and `measure_now`. None where the top stage is no model, or nothing is stored."""
        name = self.plan_name()
        if name is None:
            return None
        if name not in self.plans:
            draft = self.loaded[self.drafts[0]]
            plan = stored_plan(name, self.target.model, draft.model, self._output_vocab(draft, []), measure_now)
            if plan is None:
                return None
            self.plans[name] = plan
        return self.plans[name]

    def plan_name(self) -> str | None:
        """The key staged's plan is stored under (specviz/tree_plan.py's key), None where this stack cannot run
        staged."""
        try:
            drafter_specs("staged", self.drafts)
        except ValueError:
            return None
        if self.drafts[0] not in self.draft_models():
            return None
        draft = self.loaded[self.drafts[0]]
        return plan_key(self.target_name, self.dtype, Path(draft.name).name or draft.name, draft.dtype)

    def planned(self, tree: TreeSpec) -> TreeSpec:
        """A planned spec with this machine's stored minimum scores filled in, its budget and depth within what its
        curves allow (others as they are; a planned one where no plan is stored grows the fixed rule: staged's minimum
        score, speculative's chain of CHAIN_LENGTH)."""
        plan = self.tree_plan() if tree.planned and not tree.min_scores else None
        if plan is not None:
            return plan.tree(tree)
        if tree.planned and not tree.min_scores and tree.shape == "chain":
            return replace(tree, budget=CHAIN_LENGTH, max_depth=CHAIN_LENGTH)
        return tree

    def round_planner(self, strategy: str, tree: TreeSpec, sampling: Sampling) -> RoundPlanner | None:
        """Speculative's and staged's rounds planned from this machine's curves and a calibration that starts from the
        pair's stored one (specviz/round_plan.py); None for a spec not planned or where no curves are stored. The
        calibration a run ends with is stored for the next only where the pair's curves are stored too: a stack
        given curves by hand (a test, a sweep) leaves the machine's store alone."""
        plan = self.tree_plan() if tree.planned and strategy in ("speculative", "staged") else None
        if plan is None:
            return None
        key = self.plan_name().replace("tree plan", f"calibration of {strategy}, "
                                       f"{'greedy' if sampling.greedy else 'sampled'}", 1)
        stored = auto_choice.stored(key)
        store = (lambda calibration: auto_choice.learnt(key, calibration.to_store())) \
            if auto_choice.stored(self.plan_name()) is not None else None
        costs = Costs.of(plan, DRAFT_FEED if strategy == "staged" else 1)
        return RoundPlanner(costs, Calibration(stored if isinstance(stored, dict) else None), on_finish=store)

    def decoder(self, prompt_ids: list[int], strategy: str, tree: TreeSpec | None = None,
                sampling: Sampling = Sampling(), max_new_tokens: int = 64, stop_at_eos: bool = True,
                prefilled: Prefill | None = None) -> Decoder:
        tree = self.planned(default_tree(strategy) if tree is None else tree)
        return Decoder(self.target.model, self.tokenizer, prompt_ids, backend=open_cache,
                       drafter=self.drafter_for(strategy, prompt_ids),
                       strategy=strategy, tree=tree, sampling=sampling, max_new_tokens=max_new_tokens,
                       target_name=self.target_name, stop_at_eos=stop_at_eos, compiled=self.compiled,
                       static_len=self.static_len, prefilled=prefilled,
                       planner=self.round_planner(strategy, tree, sampling))

    def encode(self, prompt: str) -> list[int]:
        if not prompt or not prompt.strip():
            raise ValueError("the prompt is empty")
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
