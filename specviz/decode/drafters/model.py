"""A neural draft model as a drafter, optionally sped up by a lower stage (staged speculation).

During a round the draft model is fed only the tree nodes it must expand (internal nodes), a level
at a time in one batch each. With a lower stage, a node fed may also bring a short chain that the
lower stage guesses will follow it, where the feed gate finds it worth what it adds to the forward
(base.py's FeedGate); those guesses are fed in the same batch, so when the tree
builder later picks a guessed token as a child its scores are already there and no new forward is
needed. Guessing never changes which tree is built, only how many draft forwards it costs, so the
staged tree is exactly the tree the draft model alone would build.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...backends.interface import Backend
from ..trace import Phase
from ..tree import Tree
from ..sampling import verify_greedy
from .base import Drafter, FeedGate, Guess, Seen
from .ngram import COPIED_RUN

# Tokens the lower stage guesses after each node the draft expands: its guess_run (base.py). A guess saves a draft
# forward only when it covers every node of the next level, which a branching tree rarely allows, while every guessed
# token fed costs its share of the forward. With the trigram's own guesses 0-2 came out within noise of each other on
# held-out prompts, and 4 lost; so an n-gram stage guesses one token of its own, or a run of up to COPIED_RUN copied
# from the text where it repeats, which is right far more often.
LONGEST_GUESS = max(Drafter.guess_run, COPIED_RUN)
LEVEL_FEED = 2      # a staged level's draft feed before the run shows its own: its node and one guessed token

# The prompt a draft model reads (PromptWindow): its first READ_HEAD tokens and its last ones, up to
# READ_PER_NEW_TOKEN tokens in all per token to write. On six long tuning prompts (HumanEval, 310-400 tokens, AVX2) a
# 128-token window for 64 new tokens cut the draft's read from 573 to 230 ms, and tokens per target forward from 4.06
# to 3.41 (the last 128 tokens alone: 2.69): about 5% less time in all, its rounds priced by the cost curves and the
# reads as timed. The fewer tokens a run writes, the less of a long prompt pays for its read.
READ_HEAD, READ_PER_NEW_TOKEN = 32, 2


@dataclass(frozen=True)
class PromptWindow:
    """The prompt's tokens a draft model reads: its first `head` and its last `tail` (the root among them), read as
    one text whose positions run on past the tokens left out. A prompt read is compute-bound on a CPU, a draft's as
    a target's: the 0.5B read a prompt token in about a fifteenth of the 1.5B's one-token step (AVX2), so a 350-token
    prompt cost the draft as much as speculation saved over 64 new tokens. What the draft leaves unread moves
    acceptance only, never the output. The head keeps a code prompt's imports and signature, which the end of a
    long docstring lacks."""
    head: int
    tail: int

    @classmethod
    def for_run(cls, max_new_tokens: int) -> "PromptWindow":
        """The prompt's tokens the top draft model reads, for a run of max_new_tokens."""
        return cls(READ_HEAD, max(READ_PER_NEW_TOKEN * max_new_tokens - READ_HEAD, READ_HEAD))


def accepted_chain(root: int, proposal: list[int], logits: torch.Tensor) -> list[int]:
    """The lower stage's guesses this model agrees with, then its own next token: the engine's greedy
    verification applied to a chain (logits: after the root and after each proposed token)."""
    chain = Tree.with_root(root)
    for token in proposal:
        chain.add(len(chain) - 1, token, stage=1, draft_prob=1.0)
    verdict = verify_greedy(chain, logits[: len(chain)])
    return [chain.tokens[node] for node in verdict.path[1:]] + [verdict.bonus]


class RoundReads:
    """What a draft model read in this round, beyond its committed cache: each fed path's pending cache slot (-1 for
    the root) and its logits, and which paths a lower stage guessed. A commit or a new round starts a fresh one."""

    def __init__(self):
        self.fed: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}   # path tokens -> (slot, logits)
        self.ancestry: list[list[int]] = []     # per pending slot: itself and its pending ancestors
        self.guessed: set[tuple[int, ...]] = set()

    def layout(self, chains: list[tuple[tuple[int, ...], list[int]]], root_position: int):
        """One feed of token chains, each under an already fed path: its tokens, positions, attention mask (each
        token sees its pending ancestors and itself) and the paths they end."""
        tokens, positions, parents, keys = [], [], [], []
        for start, chain in chains:
            parent_key = start
            for token in chain:
                key = parent_key + (token,)
                tokens.append(token)
                positions.append(root_position + len(key))
                parents.append(parent_key)
                keys.append(key)
                parent_key = key
        first = len(self.ancestry)
        new_slot = {key: first + i for i, key in enumerate(keys)}
        visible = torch.zeros(len(tokens), first + len(tokens), dtype=torch.bool)
        for i, parent_key in enumerate(parents):
            parent_slot = new_slot[parent_key] if parent_key in new_slot else self.fed[parent_key][0]
            ancestry = (self.ancestry[parent_slot] if parent_slot >= 0 else []) + [first + i]
            self.ancestry.append(ancestry)
            visible[i, ancestry] = True
        return tokens, positions, visible, keys

    def record(self, keys: list[tuple[int, ...]], logits: torch.Tensor) -> None:
        first = len(self.ancestry) - len(keys)
        for i, key in enumerate(keys):
            self.fed[key] = (first + i, logits[i])


class ModelDrafter(Drafter):
    kind = "model"

    def __init__(self, model: torch.nn.Module, name: str = "draft", lower: Drafter | None = None,
                 lookahead: int | None = None, output_vocab: torch.Tensor | None = None, compiled=None, *,
                 backend: Backend, window: PromptWindow | None = None, gate: FeedGate | None = None):
        """compiled: a compiled copy of the model (of its body, with output_vocab) for bucket-sized feeds
        (`models.compile_model`): used once `start` is given a static cache length.
        backend: makes the model's cache (e.g. cache.open_cache, given a draft's prompt reader).
        window: the prompt's tokens the draft reads (None: all of it); a top stage only.
        gate: which of the lower stage's guesses are worth feeding (None: all of them)."""
        super().__init__()
        self.backend = backend
        self.kv = backend(model, name, output_vocab)
        vocab = None if output_vocab is None else output_vocab.cpu()
        self.support = vocab if vocab is not None and bool((vocab[1:] > vocab[:-1]).all()) else None
        self.compiled = compiled
        self.name = name
        self.lower = lower
        self.lookahead = (lower.guess_run if lower is not None else 0) if lookahead is None else lookahead
        self.known: list[int] = []      # the committed sequence, as far as this drafter was told
        self.reads = RoundReads()
        self.window = window
        self.gate = gate
        self.head = 0                   # the prompt's first tokens the draft reads...
        self.skip = 0                   # ...then the tokens after them it leaves unread: its positions run on past them

    def start(self, tokens, prefilled=None, *, stage=1, timer=None, static_len=None):
        if static_len is not None and self.compiled is not None and self.kv.static_len != static_len:
            self.kv = self.backend(self.kv.model, self.name, self.kv.output_vocab, static_len=static_len,
                                   compiled=self.compiled)
        self.kv.reset()
        read = prefilled.cache_of(self.kv.model) if prefilled is not None else None
        self.head = self.skip = 0
        if read is not None and self.kv.static_len is None:     # a static cache reads the tokens itself
            self.kv.copy_committed(read)        # the root is fed at the first expand
        elif self.window is not None and len(tokens) + 1 > self.window.head + self.window.tail:
            self.head, self.skip = self.window.head, len(tokens) + 1 - self.window.head - self.window.tail
        self.known = list(tokens)
        self.reads = RoundReads()
        super().start(tokens, prefilled, stage=stage, timer=timer, static_len=static_len)

    # -- feeding ------------------------------------------------------------------------------
    def _catch_up(self, context: list[int]) -> None:
        """Feed committed tokens the draft has not read yet, ending with the root: in the first round, the prompt."""
        with self.timer.phase(Phase.PROMPT_READ if self.kv.committed == 0 else Phase.draft(self.stage)):
            read = self.kv.committed
            unread = (context[read:self.head] + context[self.head + self.skip:] if read < self.head
                      else context[read + self.skip:])
            logits = self.kv.feed_committed(unread, keep=1)
        self.reads.fed[()] = (-1, logits[-1])

    def _feed(self, chains: list[tuple[tuple[int, ...], list[int]]], root_position: int) -> None:
        """Feed token chains, each hanging under an already fed path, in one forward."""
        tokens, positions, visible, keys = self.reads.layout(chains, root_position)
        with self.timer.phase(Phase.draft(self.stage)):
            logits = self.kv.forward(tokens, positions, visible)
        self.reads.record(keys, logits)

    # -- the Drafter interface ----------------------------------------------------------------
    def expand(self, tree, nodes, context):
        if () not in self.reads.fed:
            self._catch_up(context)
        keys = [tuple(tree.path_tokens(n)[1:]) for n in nodes]
        missing = [k for k in keys if k not in self.reads.fed]
        if missing:
            guesses = [self._guess_after(context + list(key)) for key in missing]
            taken = (self.gate.choose(guesses, len(missing)) if self.gate is not None
                     else [len(guess.tokens) for guess in guesses])
            chains = []
            for key, guess, n in zip(missing, guesses, taken):
                chains.append((key[:-1], [key[-1]] + guess.tokens[:n]))
                self.reads.guessed.update(key + tuple(guess.tokens[:i + 1]) for i in range(n))
            self._feed(chains, len(context) - 1 - self.skip)
            if self.gate is not None:
                self._learn(missing, guesses)
        return [self.reads.fed[k][1] for k in keys]

    def _learn(self, keys: list[tuple[int, ...]], guesses: list[Guess]) -> None:
        """Teach the gate whether each guessed token was the draft's own next token, fed or not: the draft's scores
        after the node tell for the first token, and after each fed one that was right for the next."""
        for key, guess in zip(keys, guesses):
            for token, evidence in zip(guess.tokens, guess.evidence):
                if key not in self.reads.fed:
                    break
                hit = int(self.reads.fed[key][1].argmax()) == token
                self.gate.learn(evidence, hit)
                if not hit:
                    break
                key = key + (token,)

    def _guess_after(self, sequence: list[int]) -> Guess:
        if self.lower is None or self.lookahead <= 0:
            return Guess([])
        return self.lower.guess(sequence, self.lookahead)

    def seen(self, path):
        return Seen(self.stage + 1 if path in self.reads.guessed else self.stage,
                    () in self.reads.fed and path in self.reads.fed)

    def commit(self, tree, path, context):
        # The accepted nodes the draft has read form a prefix of the path; keep exactly those.
        slots = []
        for node in path[1:]:
            key = tuple(tree.path_tokens(node)[1:])
            if key not in self.reads.fed:
                break
            slots.append(self.reads.fed[key][0])
        if () in self.reads.fed:
            self.kv.commit(slots)
        self.known = context + tree.path_tokens(path[-1])[1:]
        self.reads = RoundReads()
        super().commit(tree, path, context)

    def guess(self, sequence, n):
        """Greedy continuation, itself sped up by the lower stage (greedy chain speculation).

        As a lower stage this drafter sees whole sequences: it feeds what its cache lacks, keeps
        the entries that are known to be committed, and drops the rest after each forward.
        """
        assert self.skip == 0, "a lower stage reads the whole sequence"
        out: list[int] = []
        with self.timer.phase(Phase.draft(self.stage)):
            while len(out) < n:
                proposal = self._guess_after(sequence + out).tokens[: n - len(out)]
                fed = (sequence + out)[self.kv.committed:]
                start = self.kv.committed
                count = len(fed) + len(proposal)
                logits = self.kv.forward(fed + proposal, list(range(start, start + count)),
                                         torch.ones(count, count, dtype=torch.bool).tril(), keep=len(proposal) + 1)
                safe = 0
                while safe < len(fed) and start + safe < len(self.known) and fed[safe] == self.known[start + safe]:
                    safe += 1
                self.kv.commit(list(range(min(safe, len(fed) - 1))))   # the last token is re-fed next time
                out += accepted_chain(fed[-1], proposal, logits)[: n - len(out)]
        return Guess(out, ("model",) * len(out))

    def kv_models(self):
        return [self.kv] + super().kv_models()
