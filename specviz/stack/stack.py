"""Which models and drafters a strategy uses: the model stack, loaded once and shared.

A stack is the target plus a list of drafter specs, top stage first: model specs (hub id, local
directory, GGUF file, assets/...) and the non-neural drafters "trigram" (assets/trigram.npz or a
path to an .npz) and "lookup". `Stack.decoder()` builds a fresh `Decoder` for one generation. Its other jobs
have modules of their own: loading the drafts (load.py, draft_precision.py), the drafts' vocabulary
(draft_vocabulary.py), how they read prompts (prompt_reads.py), compiling (compiled.py) and the plans made
from the machine's cost curves (plans.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends.choose import open_cache
from ..cpu.machine import give_back_freed_memory
from ..decode.drafters import Drafter, LookupDrafter, ModelDrafter, NgramDrafter, PromptWindow
from ..decode.drafters.base import FeedGate
from .draft_vocabulary import DraftVocabulary
from ..decode.engine import Decoder, Prefill, prefill, static_length
from ..models.locations import DEFAULT_TARGET
from ..models.load import LoadedModel, load_model
from ..models.prompt_format import COMPLETION, encode_prompt
from ..models.precision import AUTO_DTYPE, auto_precision, auto_reason, check_dtype, precisions_named
from ..profile.store import Profile
from .prompt_reads import PromptReads
from ..decode.sampling import Sampling
from .compiled import CompiledModels
from .load import default_drafts, load_drafts
from .plans import StackPlans
from .strategies import STRATEGIES, default_tree, drafter_specs
from ..decode.tree import TreeSpec


def drafter_name(spec: str) -> str:
    """A drafter's name in traces: its file's or folder's name, less a file type (qwen2.5-coder-0.5b stays whole)."""
    path = Path(spec)
    return (path.stem if path.suffix in (".gguf", ".npz") else path.name) or spec


@dataclass
class Stack:
    target: LoadedModel
    drafts: list[str]                                  # specs, top stage first
    loaded: dict[str, object] = field(default_factory=dict)     # each spec's model or n-gram table ("lookup": none)
    precision_reason: str = ""      # under `auto`: why this precision, with the probe's timings (precision.auto_reason)
    vocabulary: DraftVocabulary = field(default_factory=DraftVocabulary)
    prompt_reads: PromptReads = field(default_factory=PromptReads, repr=False)
    compiled: CompiledModels = field(default_factory=CompiledModels, repr=False)     # see stack_compile.compile_models
    # this machine's measurements, which the stack was loaded by and plans from (specviz/profile/store.py)
    profile: Profile = field(default_factory=Profile, repr=False, compare=False)
    plans: StackPlans = field(init=False, repr=False, compare=False)
    # the target's, for good: asked at every visitor's Step
    tokenizer: object = field(init=False, repr=False, compare=False)
    target_name: str = field(init=False, repr=False, compare=False)
    # each strategy's drafter specs, top stage first (strategies.drafter_specs), where the cascade can run it
    stages: dict[str, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.tokenizer, self.target_name = self.target.tokenizer, self.target.short_name
        self.stages = {}
        for strategy in STRATEGIES:
            try:
                self.stages[strategy] = drafter_specs(strategy, self.drafts)
            except ValueError:      # drafter_for says why when it is asked for
                pass
        self.plans = StackPlans(self.profile, self.target, self.drafts, self.stages.get("staged", []), self.loaded,
                                self.vocabulary, self.prompt_reads)

    @classmethod
    def load(cls, target: str = DEFAULT_TARGET, drafts: list[str] | None = None,
             dtype: str = AUTO_DTYPE, device: str = "cpu", profile: Profile | None = None) -> "Stack":
        """profile: this machine's measurements (None: the default file's, specviz/profile/store.py)."""
        check_dtype(dtype)
        profile = profile or Profile()
        auto = dtype == AUTO_DTYPE
        dtype = auto_precision(target, profile, device) if auto else dtype
        loaded_target = load_model(target, dtype, device, profile=profile)
        specs = default_drafts() if drafts is None else list(drafts)
        stack = cls(loaded_target, specs, load_drafts(loaded_target, specs, dtype, device, profile, auto),
                    profile=profile)
        if auto:
            stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
            stack.precision_reason = auto_reason(profile, device, target)
        stack.prompt_reads.read(stack.draft_models(), profile)
        give_back_freed_memory()        # re-quantising the drafts freed their float weights
        return stack

    @property
    def dtype(self) -> str:
        return self.target.dtype

    def draft_models(self) -> dict[str, LoadedModel]:
        """The loaded draft models by spec (n-gram tables and lookup left out)."""
        return {spec: m for spec, m in self.loaded.items() if isinstance(m, LoadedModel)}

    def assistant(self) -> tuple[str, torch.nn.Module] | tuple[None, None]:
        """The top draft if it is a neural model: what transformers' assisted generation gets."""
        if self.drafts and isinstance(self.loaded.get(self.drafts[0]), LoadedModel):
            return self.drafts[0], self.loaded[self.drafts[0]].model
        return None, None

    @property
    def weight_bytes(self) -> int:
        """Bytes of model weights this stack holds (the target and its draft models)."""
        return self.target.weight_bytes + sum(m.weight_bytes for m in self.draft_models().values())

    def precision(self) -> str:
        """The precisions in use, e.g. `gguf (the file's own blocks)`, or `gguf (...) target, int4 (re-quantised)
        draft` (see draft_precision.py)."""
        return precisions_named(self.dtype, {m.dtype for m in self.draft_models().values()})

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids as written (completion)."""
        return encode_prompt(self.tokenizer, prompt, COMPLETION)

    def _drafter(self, spec: str, stage: int, lower: Drafter | None, prompt: list[int],
                 window: PromptWindow | None = None, gate: FeedGate | None = None) -> Drafter:
        if spec == "lookup":
            return LookupDrafter(self.target.model.get_output_embeddings().out_features)
        item = self.loaded[spec]
        name = "trigram" if spec == "trigram:auto" else drafter_name(spec)
        if name == self.target_name or self.drafts.index(spec) != stage - 1:
            name = f"{name}@stage{stage}"      # forward logs are kept by name: keep names unique
        if isinstance(item, LoadedModel):
            return ModelDrafter(item.model, name=name, lower=lower,
                                output_vocab=self.vocabulary.for_draft(item, prompt),
                                compiled=self.compiled.drafts.get(spec), backend=self.prompt_reads.backend(spec),
                                window=window if stage == 1 else None, gate=gate if stage == 1 else None)
        return NgramDrafter(item, name=name)

    def drafter_for(self, strategy: str, prompt: list[int] = (), max_new_tokens: int | None = None,
                    draft_cost: tuple[float, ...] | None = None) -> Drafter | None:
        """baseline: none; speculative and tree: the top stage alone; staged: the whole cascade. max_new_tokens: the
        run's, which sets how much of the prompt the top draft model reads (None: all of it). draft_cost: the top
        draft's cost curve (seconds by tokens fed), by which it feeds only the lower stage's guesses worth their cost
        (None: all of them)."""
        specs = self.stages[strategy] if strategy in self.stages else drafter_specs(strategy, self.drafts)
        window = None if max_new_tokens is None else PromptWindow.for_run(max_new_tokens)
        gate = FeedGate(draft_cost) if draft_cost is not None and len(specs) > 1 else None
        drafter = None
        for stage in range(len(specs), 0, -1):
            drafter = self._drafter(specs[stage - 1], stage, drafter, list(prompt), window, gate)
        return drafter

    def prefill(self, prompt_ids: list[int]) -> Prefill:
        """The target's and every draft model's read of the prompt, for decoders of it to copy."""
        return prefill(prompt_ids, open_cache(self.target.model, "prefill"),
                       [self.prompt_reads.backend(spec)(m.model, "prefill") for spec, m in self.draft_models().items()])

    def decoder(self, prompt_ids: list[int], strategy: str, tree: TreeSpec | None = None,
                sampling: Sampling = Sampling(), max_new_tokens: int = 64, stop_at_eos: bool = True,
                prefilled: Prefill | None = None) -> Decoder:
        tree, planner = self.plans.for_decoder(strategy, default_tree(strategy) if tree is None else tree, sampling)
        draft_cost = planner.costs.draft if planner is not None else None
        static_len = self.compiled.static_len
        if static_len is None and self.compiled.target is not None:     # a compiled target needs a static cache
            static_len = static_length(len(prompt_ids), max_new_tokens, tree)
        target = open_cache(self.target.model, self.target_name, static_len=static_len, compiled=self.compiled.target)
        return Decoder(target, self.tokenizer, prompt_ids,
                       drafter=self.drafter_for(strategy, prompt_ids, max_new_tokens, draft_cost), strategy=strategy,
                       tree=tree, sampling=sampling, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos,
                       prefilled=prefilled, planner=planner)
