"""The replay backend: a recorded generation's rounds run again through the engine, on models that only have its
models' shapes (random weights: a projection to another model or machine).

The engine runs its whole round as it would (tree building, masks, the target's forward of the tree, verification,
commits, the trace record), while the recording decides what happens:
- `ReplayDrafter` hands back each round's recorded tree (its nodes, with their draft probabilities), and runs the
  draft models' forwards of the recorded sizes on their caches;
- `ReplayKV` wraps the target's cache: it runs the real forward of the tree, then raises in each row the token the
  recording accepted there, so greedy verification walks the recorded path and takes the recorded bonus token.

A replayed token is a recorded node's id within its round (the bonus: one id past the tree), so the rows' decisions
need no real vocabulary, and siblings never share a token. A replay that leaves the recording raises `ReplayError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..backends.interface import ModelCache
from ..decode.drafters.base import Drafter, Guess
from ..decode.trace import Phase
from ..decode.tree import Tree

ROOT = -1           # the key of a round's root (its token is the previous round's bonus)


class ReplayError(RuntimeError):
    """The replayed run left its recording (a tree or a path that differs)."""


@dataclass(frozen=True)
class RecordedRound:
    """What a projection replays of one recorded round, its tokens renamed to node ids (see the module's docstring)."""
    children: dict[int, list[tuple[int, float]]]   # per parent (ROOT or a node id): (child's token, draft probability)
    accepts: dict[int, int]                        # per node on the accepted path (ROOT first): the target's argmax
    forwards: dict[str, list[int]]                 # per draft model: tokens fed by each forward
    nodes: int                                     # the tree's size, the root counted
    committed: int                                 # tokens the round added to the output

    @classmethod
    def of(cls, step: dict, vocab: int) -> "RecordedRound":
        """One round of `projection.decisions()`'s record; vocab: the replaying models' vocabulary."""
        size = len(step["tokens"])
        if size + 1 > vocab:
            raise ReplayError(f"a recorded tree of {size} nodes needs a vocabulary above {size}; the model has {vocab}")
        probs = step.get("probs") or [1.0] * size
        children: dict[int, list[tuple[int, float]]] = {}
        for node, parent in enumerate(step["parents"]):
            if parent >= 0:
                children.setdefault(ROOT if parent == 0 else parent, []).append((node, max(probs[node] or 0.0, 1e-9)))
        path = [ROOT] + step["path"][1:]
        accepts = {node: next_node for node, next_node in zip(path, path[1:])}
        accepts[path[-1]] = size                     # the bonus: no child of the last accepted node
        return cls(children, accepts, step["forwards"], size, step["committed"])


def rounds_of(recorded: dict, vocab: int) -> list[RecordedRound]:
    return [RecordedRound.of(step, vocab) for step in recorded["steps"]]


def _key(tree: Tree, node: int) -> int:
    return ROOT if node == 0 else tree.tokens[node]


class ReplayKV:
    """A target's cache (any backend) whose tree forwards return the recorded decisions: each accepted node's row has
    the next accepted token (or the bonus) on top, the other rows are the model's own."""

    def __init__(self, inner: ModelCache, rounds: list[RecordedRound]):
        self.inner, self.rounds, self.round = inner, rounds, 0

    model = property(lambda self: self.inner.model)
    name = property(lambda self: self.inner.name)
    static_len = property(lambda self: self.inner.static_len)
    output_vocab = property(lambda self: self.inner.output_vocab)
    committed = property(lambda self: self.inner.committed)
    pending = property(lambda self: self.inner.pending)
    log = property(lambda self: self.inner.log)
    seconds = property(lambda self: self.inner.seconds)

    def forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor,
                keep: int | None = None) -> torch.Tensor:
        if keep is not None:
            raise ReplayError("a replayed tree forward returns every row (the engine never asks for fewer)")
        logits = self.inner.forward(tokens, positions, visible)
        if self.round >= len(self.rounds):
            raise ReplayError(f"the replay went past the recording's {len(self.rounds)} rounds")
        accepts = self.rounds[self.round].accepts
        self.round += 1
        rows = [(row, accepts[key]) for row, key in enumerate([ROOT, *tokens[1:]]) if key in accepts]
        at = torch.tensor([row for row, _ in rows], device=logits.device)
        # the largest value the dtype holds: a margin over the row's maximum could round away in bfloat16
        logits[at, torch.tensor([token for _, token in rows], device=logits.device)] = torch.finfo(logits.dtype).max
        return logits

    def feed_committed(self, tokens: list[int], keep: int | None = None) -> torch.Tensor:
        return self.inner.feed_committed(tokens, keep)

    def read_prompt(self, prompt_ids: list[int]) -> None:
        self.inner.read_prompt(prompt_ids)

    def commit(self, slots: list[int]) -> None:
        self.inner.commit(slots)

    def copy_committed(self, other: ModelCache) -> None:
        self.inner.copy_committed(other)

    def reset(self) -> None:
        self.inner.reset()
        self.round = 0

    def costs(self) -> tuple[int, int, int]:
        return self.inner.costs()


class ReplayBackend:
    """Hands the engine one prepared target cache (made, and compiled for, before anything is timed) as a ReplayKV of
    these rounds."""

    def __init__(self, target: ModelCache, rounds: list[RecordedRound]):
        self.target, self.rounds = target, rounds

    def __call__(self, model, name, output_vocab=None, static_len=None, compiled=None) -> ReplayKV:
        if model is not self.target.model:
            raise ReplayError("the replay's target cache is of another model")
        self.target.reset()
        return ReplayKV(self.target, self.rounds)


class ReplayDrafter(Drafter):
    """Proposes each round's recorded children with their recorded draft probabilities; its draft models feed the
    recorded forwards' sizes (one forward a tree level, what is left at the commit) and keep, as the real ones, the
    committed text."""
    kind = "model"
    name = "replay"

    def __init__(self, rounds: list[RecordedRound], drafts: dict[str, ModelCache], vocab: int):
        super().__init__()
        self.rounds, self.drafts, self.vocab = rounds, drafts, vocab
        self.round = 0
        self.fed: dict[str, int] = {}

    def start(self, tokens: list[int], prefilled=None, **placed) -> None:
        """Empty caches: a draft model reads the prompt in its first round, and the recording's first forward holds
        that read."""
        super().start(tokens, **placed)
        self.round, self.fed = 0, {name: 0 for name in self.drafts}
        for kv in self.drafts.values():
            kv.reset()

    def expand(self, tree: Tree, nodes: list[int], context: list[int]) -> list[torch.Tensor | None]:
        if self.round >= len(self.rounds):
            raise ReplayError(f"the replay went past the recording's {len(self.rounds)} rounds")
        recorded = self.rounds[self.round]
        with self.timer.phase(Phase.draft(self.stage)):
            for name in self.drafts:
                self._feed(name, 1)
            rows = []
            for node in nodes:
                children = recorded.children.get(_key(tree, node))
                row = None
                if children:
                    row = torch.full((self.vocab,), -math.inf)
                    row[[token for token, _ in children]] = torch.tensor([math.log(p) for _, p in children])
                rows.append(row)
        return rows

    def _feed(self, name: str, forwards: int | None) -> None:
        """The draft model's next `forwards` recorded forwards of this round (None: all that are left)."""
        kv, sizes = self.drafts[name], self.rounds[self.round].forwards.get(name, [])
        done = self.fed[name]
        for n in sizes[done: None if forwards is None else done + forwards]:
            visible = torch.cat([torch.zeros(n, kv.pending, dtype=torch.bool),
                                 torch.ones(n, n, dtype=torch.bool).tril()], 1)
            start = kv.committed + kv.pending
            kv.forward(torch.randint(0, self.vocab, (n,)).tolist(), list(range(start, start + n)), visible)
        self.fed[name] = len(sizes) if forwards is None else min(len(sizes), done + forwards)

    def commit(self, tree: Tree, path: list[int], context: list[int]) -> None:
        recorded = self.rounds[self.round]
        if len(tree) != recorded.nodes:
            raise ReplayError(f"round {self.round}: the replayed tree has {len(tree)} nodes, the recording "
                              f"{recorded.nodes}")
        for name, kv in self.drafts.items():
            with self.timer.phase(Phase.draft(self.stage)):
                self._feed(name, None)
            # a draft keeps what it fed of the committed text, the bonus token aside, as a real draft does
            kept = len(context) + len(path) - 1 - kv.committed
            kv.commit(list(range(max(0, min(kv.pending, kept)))))
            self.fed[name] = 0
        self.round += 1

    def guess(self, sequence: list[int], n: int) -> Guess:
        return Guess([])

    def kv_models(self) -> list[ModelCache]:
        return list(self.drafts.values())
