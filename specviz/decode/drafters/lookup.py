"""The stages that look tokens up instead of running a model: context lookup (prompt lookup decoding), which copies
what followed the latest earlier occurrence of the last few tokens, strong on code that repeats names and structure;
and an n-gram table (a Katz-backoff trigram, katz.py) as a drafter, the paper's stage 2. Neither costs a forward."""
from __future__ import annotations

import torch

from ..trace import Phase
from .base import Drafter, Guess, copy_evidence, ngram_evidence

# A lower stage's copied guess: the tokens after the latest earlier occurrence of the text's last 3 tokens, else its
# last 2. Teacher-forced on HumanEval/26-55 (the 0.5B drafting for the 1.5B), a level of the draft's chain cost 9.0 ms
# of its forwards (AVX2 curve) with up to 2 tokens copied, 9.1 with 3, 10.4 with 8, against 11.4 with the trigram's
# one token alone. Staged on HumanEval/57-65 (AVX2): 497 draft forwards in 7.6-7.8 s with the trigram's token, 437 in
# 7.0-7.1 s with up to 2 copied, 429 in 7.5 s with up to 3: a longer run is fed whole, and pays only where it is right.
COPIED_RUN, COPY_MATCH = 2, 2


def context_continuation(sequence: list[int], n: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to n tokens after the latest earlier match of the longest suffix n-gram (longest first)."""
    for size in range(min(max_ngram, len(sequence) - 1), min_ngram - 1, -1):
        tail = sequence[-size:]
        for start in range(len(sequence) - size - 1, -1, -1):
            if sequence[start:start + size] == tail:
                return sequence[start + size:start + size + n]
    return []


def copied_run(sequence: list[int], n: int = COPIED_RUN) -> list[int]:
    """A lower stage's copied guess (COPIED_RUN's rule): up to n tokens, none where nothing repeats."""
    return context_continuation(sequence, n, 3, COPY_MATCH)


class LookupDrafter(Drafter):
    kind = "lookup"
    guess_run = COPIED_RUN

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        super().__init__()
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.name = f"lookup{max_ngram}"

    def continuation(self, sequence: list[int], n: int) -> list[int]:
        return context_continuation(sequence, n, self.max_ngram, self.min_ngram)

    def expand(self, tree, nodes, context):
        out = []
        with self.timer.phase(Phase.draft(self.stage)):
            for node in nodes:
                follow = self.continuation(context + tree.path_tokens(node)[1:], 1)
                if not follow:
                    out.append(None)
                    continue
                scores = torch.full((self.vocab_size,), float("-inf"))
                scores[follow[0]] = 0.0      # a point mass: deterministic proposals have q = 1
                out.append(scores)
        return out

    def guess(self, sequence, n):
        with self.timer.phase(Phase.draft(self.stage)):
            copied = self.continuation(sequence, n)
        return Guess(copied, copy_evidence(len(copied)))


class NgramDrafter(Drafter):
    kind = "ngram"
    guess_run = COPIED_RUN
    copies = True               # guesses copy the text where it repeats (False: the model's token alone)

    def __init__(self, model, name: str = "trigram"):
        super().__init__()
        self.model = model          # specviz.decode.drafters.katz.KatzTrigram (or anything with probs/top)
        self.name = name

    def expand(self, tree, nodes, context):
        with self.timer.phase(Phase.draft(self.stage)):
            return [self.model.probs(context + tree.path_tokens(n)[1:]).log() for n in nodes]

    def guess(self, sequence, n):
        """Where the text's last tokens occurred before, up to n of the tokens that followed them there (code repeats
        its names and lines); elsewhere the model's most likely next token alone, as its second guess is rarely the
        draft's (teacher-forced on HumanEval/26-55, the 0.5B's next token: the trigram's first guess 27%, its first
        two 10%; a copied run's first token 48% with the trigram's where nothing repeats)."""
        with self.timer.phase(Phase.draft(self.stage)):
            copied = copied_run(sequence, n) if self.copies else []
            if copied or n < 1:
                return Guess(copied, copy_evidence(len(copied)))
            best = self.model.top(sequence, 1)
            return Guess([best[0][0]], (ngram_evidence(best[0][1]),)) if best else Guess([])
