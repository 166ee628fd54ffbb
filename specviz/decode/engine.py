"""One speculation round at a time: draft a tree, verify it in one target forward, commit.

`Decoder` holds one generation's state (caches, output, random stream); models are shared and
read-only, so many decoders (app sessions) can use the same loaded models. `step()` returns the
round's trace record; `generate()` is the loop over `step()`. The caller opens the target's cache
(specviz/backends/interface.py) and hands it over: the engine never asks which kind it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import torch

from . import end_tokens
from ..backends.interface import BUCKETS, ModelCache
from .drafters.base import Drafter, cascade
from .drafters.model import LONGEST_GUESS
from .tree import TreeSpec
from .tree_builder import build_tree
from .metrics import summarise
from .sampling import Sampling, logits_to_probs, verify_greedy, verify_sampling
from .trace import NodeRecord, Phase, PhaseTimer, RunRecord, StageInfo, StepRecord
from .tree import ancestor_matrix
from .planner import RoundPlanner

MAX_NEW_TOKENS = 4096          # the engine's output limit per generation


@dataclass(frozen=True)
class Prefill:
    """A target's KV cache after reading a prompt but its last token (`prefill`), and draft models' caches
    of the same tokens. Decoders of that prompt given it copy the caches instead of reading the prompt
    again: the lossless panel starts a hundred generations of one prompt, and the 1.5B reads a 120-token
    prompt in about 3 s on our CPU. A draft's copy changes no output: it moves acceptance only."""
    model: torch.nn.Module
    tokens: tuple[int, ...]
    kv: ModelCache
    drafts: tuple[ModelCache, ...] = ()

    def cache_of(self, model: torch.nn.Module) -> ModelCache | None:
        """This model's read of the prompt, if it is here."""
        return next((kv for kv in (self.kv, *self.drafts) if kv.model is model), None)


def prefill(prompt_ids: list[int], target: ModelCache, drafts: list[ModelCache] = ()) -> Prefill:
    """The prompt read into fresh caches of the target and of draft models (made by their backends)."""
    with torch.inference_mode():
        for kv in (target, *drafts):
            kv.read_prompt(prompt_ids)
    return Prefill(target.model, tuple(prompt_ids[:-1]), target, tuple(drafts))


class Decoder:
    def __init__(self, target: ModelCache, tokenizer, prompt_ids: list[int], *, drafter: Drafter | None = None,
                 strategy: str = "baseline", tree: TreeSpec = TreeSpec(), sampling: Sampling = Sampling(),
                 max_new_tokens: int = 64, stop_at_eos: bool = True, prefilled: Prefill | None = None,
                 planner: RoundPlanner | None = None):
        """target: a fresh cache of the target model, opened by the caller's backend (e.g. backends.open_cache), named
        as the trace names the target; a static one (a compiled target's) must hold static_length() entries.
        prefilled: this target's Prefill of this prompt, copied (a static cache reads the prompt itself).
        planner: plans each round before it is drafted (specviz/decode/planner.py), within the tree's budget and
        depth."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max new tokens must be in [1, {MAX_NEW_TOKENS}], got {max_new_tokens}")
        if target.committed or target.pending:      # the caller opens it: one that decoded before holds another text
            raise ValueError("the target's cache must be fresh: open one for each decoder")
        config = target.model.config
        context_limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if context_limit and len(prompt_ids) + max_new_tokens + max(tree.max_depth, tree.lookup) + 1 > context_limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) plus max new tokens ({max_new_tokens}) "
                             f"exceeds the model's context of {context_limit} tokens")
        sampling.validate()
        tree.validate()
        self.tokenizer = tokenizer
        self.strategy = strategy
        self.spec = tree
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.eos = end_tokens.of(target.model, tokenizer) if stop_at_eos else frozenset()
        self.timer = PhaseTimer()
        needed, static_len = static_length(len(prompt_ids), max_new_tokens, tree), target.static_len
        if static_len is not None and static_len < needed:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) plus max new tokens ({max_new_tokens}) and a "
                             f"tree need a KV cache of {needed} entries; the static cache holds {static_len}")
        self.target = target
        self.drafter = drafter
        self.planner = planner if drafter is not None else None
        self.stages = [StageInfo(target.name, "target")]
        if drafter is not None:
            self.stages += [StageInfo(d.name, d.kind) for d in cascade(drafter)]
            if tree.lookup:
                self.stages.append(StageInfo("context lookup", "lookup"))
        self.generator = torch.Generator().manual_seed(sampling.seed)
        self.prompt = list(prompt_ids)
        self.tokens = list(prompt_ids)        # committed sequence; its last token is not yet in the target cache
        self.steps: list[StepRecord] = []
        self.finished = False
        self.finish_reason = ""
        if prefilled is not None and (prefilled.model is not target.model
                                      or prefilled.tokens != tuple(self.prompt[:-1])):
            raise ValueError("the prefilled cache is of another model or prompt")
        with torch.inference_mode():
            if prefilled is not None and static_len is None:
                self.target.copy_committed(prefilled.kv)
            else:
                self.target.read_prompt(self.prompt)
            if drafter is not None:
                drafter.start(self.prompt[:-1], prefilled, timer=self.timer, static_len=static_len)
        self.target.log.clear()
        self.timer.take()

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @torch.inference_mode()
    def step(self) -> StepRecord:
        if self.finished:
            raise RuntimeError("generation already finished")
        started = perf_counter()
        context = self.tokens
        with self.timer.phase(Phase.TREE):      # planning and choosing children; drafter forwards are timed inside
            left = self.max_new_tokens - len(self.new_tokens)
            plan = self.planner.plan(left) if self.planner is not None else None
            drafted = build_tree(context[-1], context, self.drafter, self.spec.within(left), self.sampling,
                                 self.generator, self.eos, plan)
            tree = drafted.tree
        with self.timer.phase(Phase.VERIFY):
            positions = [self.target.committed + d for d in tree.depths]
            logits = self.target.forward(tree.tokens, positions, ancestor_matrix(tree.parents))
            probs = logits_to_probs(logits.cpu(), self.sampling)    # sampling draws use a CPU generator
            verdict = (verify_greedy(tree, probs) if self.sampling.greedy
                       else verify_sampling(tree, probs, drafted.dists, self.generator))
        with self.timer.phase(Phase.BOOKKEEPING):
            self.target.commit(verdict.path)
            if self.drafter is not None:
                self.drafter.commit(tree, verdict.path, context)
            new = [tree.tokens[n] for n in verdict.path[1:]] + [verdict.bonus]
            by = [tree.stages[n] for n in verdict.path[1:]] + [0]
            new, by = self._truncate(new, by)
            position = len(self.new_tokens)
            self.tokens = context + new
            draft_feeds = self._draft_feeds()
            record = self._record(drafted, verdict, new, by, position, plan)
            if plan is not None:
                self.planner.observe(plan, tree, verdict.path, [stage.kind for stage in self.stages], draft_feeds,
                                     committed_probs(verdict, probs), new, drafted.lookup)
        record.phase_s = self.timer.take()
        record.wall_s = perf_counter() - started
        self._name_tokens(record)
        self.steps.append(record)
        return record

    def _truncate(self, new: list[int], by: list[int]) -> tuple[list[int], list[int]]:
        """Cut the committed tokens at the first end-of-sequence token or at max new tokens."""
        room = self.max_new_tokens - len(self.new_tokens)
        new, by = new[:room], by[:room]
        ends = [i for i, token in enumerate(new) if token in self.eos]
        if ends:
            new, by = new[: ends[0] + 1], by[: ends[0] + 1]
            self.finished, self.finish_reason = True, "eos"
        elif len(new) == room:
            self.finished, self.finish_reason = True, "length"
        return new, by

    def _draft_feeds(self) -> list[int]:
        """The tokens each forward of the top draft model fed this round (before _record clears the logs)."""
        models = self.drafter.kv_models() if self.drafter is not None else []
        return list(models[0].log.tokens) if models else []

    def _record(self, drafted, verdict, new, by, position, plan=None) -> StepRecord:
        tree, accepted = drafted.tree, set(verdict.path)
        nodes = [NodeRecord(id=i, token=tree.tokens[i], text="",
                            parent=tree.parents[i], depth=tree.depths[i], rank=tree.ranks[i],
                            stage=tree.stages[i],
                            draft_prob=None if i == 0 else tree.draft_probs[i],
                            target_prob=None if i == 0 else verdict.target_probs[i],
                            accept_prob=None if i == 0 else verdict.accept_probs[i],
                            accepted=i in accepted, calibrated=None if plan is None else drafted.chances.get(i))
                 for i in range(len(tree))]
        logs = {kv.name: kv.log for kv in self.kv_models()}
        costs = self.model_costs()
        forwards = {name: list(log.tokens) for name, log in logs.items()}
        read = {name: log.bytes_read(costs[name]) for name, log in logs.items()}
        for log in logs.values():
            log.clear()
        return StepRecord(step=len(self.steps), strategy=self.strategy, stages=self.stages, nodes=nodes,
                          accepted_path=list(verdict.path), committed_tokens=new,
                          committed_text=[], committed_stage=by,
                          phase_s={}, forwards=forwards, bytes_read=read, wall_s=0.0,
                          position=position, finished=self.finished, finish_reason=self.finish_reason,
                          plan=None if plan is None else self.planner.record(plan, [s.kind for s in self.stages[1:]],
                                                                             drafted.lookup))

    def model_costs(self) -> dict[str, tuple[int, int, int]]:
        """Per model, the target first: its cache's costs() (weight bytes per forward, KV bytes per cached
        token, weight bytes per token fed)."""
        return {kv.name: kv.costs() for kv in self.kv_models()}

    def kv_models(self) -> list[ModelCache]:
        """The target's cache, then those of the drafter's models, top stage first."""
        return [self.target] + (self.drafter.kv_models() if self.drafter is not None else [])

    def forward_seconds(self) -> float:
        """Time spent in model forwards since this decoder began, the prompt's read included."""
        return sum(kv.seconds for kv in self.kv_models())

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def _name_tokens(self, record: StepRecord) -> None:
        """Each node's and committed token's text, for the views: made after the round's clocks stop, as the round
        itself needs no text."""
        for node in record.nodes:
            node.text = self._text(node.token)
        record.committed_text = [self._text(token) for token in record.committed_tokens]

    def text(self) -> str:
        return self.tokenizer.decode(self.new_tokens, skip_special_tokens=True)

    def generate(self, on_step=None) -> RunRecord:
        """The loop over step(); on_step(record) is called after each step (streaming)."""
        while not self.finished:
            record = self.step()
            if on_step is not None:
                on_step(record)
        return self.record()

    def record(self) -> RunRecord:
        return RunRecord(strategy=self.strategy, prompt_tokens=len(self.prompt), tokens=self.new_tokens,
                         text=self.text(), steps=self.steps,
                         stats=summarise(self.steps, self.model_costs(), len(self.prompt)),
                         settings={"tree": self.spec.to_dict(), "sampling": vars(self.sampling),
                                   "max_new_tokens": self.max_new_tokens})


def committed_probs(verdict, probs: torch.Tensor) -> list[float]:
    """The target's probability of each token a round committed: the accepted guesses, then the bonus."""
    return [verdict.target_probs[n] for n in verdict.path[1:]] + [float(probs[verdict.path[-1], verdict.bonus])]


def static_length(prompt_tokens: int, max_new_tokens: int, tree: TreeSpec, step: int = 256) -> int:
    """The static cache a generation needs: the prompt, the output and one whole tree (plus bucket
    padding), rounded up to a multiple of `step` so compiled shapes are reused across prompts of
    similar length (each distinct length is one more compilation per bucket). A draft model shares
    the length: a round feeds it each tree node it expands with the lower stage's guesses after it."""
    entries = prompt_tokens + max_new_tokens + tree.budget * (1 + LONGEST_GUESS) + tree.lookup + 1 + BUCKETS[-1]
    return -(-entries // step) * step
