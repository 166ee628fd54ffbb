"""A Katz-backoff n-gram model as a drafter: the paper's stage-2 (costs a table lookup)."""
from __future__ import annotations

from .base import Drafter


class NgramDrafter(Drafter):
    kind = "ngram"

    def __init__(self, model, name: str = "trigram"):
        super().__init__()
        self.model = model          # specviz.drafters.katz.KatzTrigram (or anything with probs/top)
        self.name = name

    def expand(self, tree, nodes, context):
        with self.timer.phase(f"stage{self.stage}_draft"):
            return [self.model.probs(context + tree.path_tokens(n)[1:]).log() for n in nodes]

    def guess(self, sequence, n):
        with self.timer.phase(f"stage{self.stage}_draft"):
            out: list[int] = []
            for _ in range(n):
                best = self.model.top(sequence + out, 1)
                if not best:
                    break
                out.append(best[0][0])
            return out
