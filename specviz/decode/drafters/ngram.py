"""A Katz-backoff n-gram model as a drafter: the paper's stage-2 (costs a table lookup)."""
from __future__ import annotations

from ..trace import Phase
from .base import Drafter, Guess
from .feed_gate import copy_evidence, ngram_evidence
from .lookup import COPIED_RUN, copied_run


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
