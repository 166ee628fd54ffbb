"""The tokens a stack's draft models predict: under `trigram:auto`, the corpus's tokens, the special tokens and the
prompt's, as FR-Spec does with frequent tokens. The 0.5B's output layer is a quarter of its weights, and its corpus
(stdlib source and the 0.5B's own code) holds 28,149 of 151,936 tokens. A draft's vocabulary moves acceptance only,
never the output."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..backends.choose import restricts_output
from ..models.load import LoadedModel


@dataclass
class DraftVocabulary:
    tokens: torch.Tensor | None = None      # None: each draft predicts its whole vocabulary

    def restrict(self, table, tokenizer) -> None:
        """Cut to an n-gram table's tokens and the tokenizer's special tokens (no table: left as it is)."""
        if table is not None:
            ids = np.union1d(table.seen_tokens(), tokenizer.all_special_ids)
            self.tokens = torch.from_numpy(ids).long()

    def for_draft(self, draft: LoadedModel, prompt: list[int]) -> torch.Tensor | None:
        """The tokens `draft` predicts for this prompt: its own output vocabulary, else these with the prompt's."""
        if draft.output_vocab is not None or self.tokens is None \
                or not restricts_output(draft.model.get_output_embeddings()):
            return draft.output_vocab
        return torch.unique(torch.cat([self.tokens, torch.tensor(prompt, dtype=torch.long)]))
