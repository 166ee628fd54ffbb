"""The stages that look tokens up instead of running a model, so that neither costs a forward: context lookup
(prompt lookup decoding), which copies what followed the latest earlier occurrence of the last few tokens,
strong on code that repeats names and structure; and an n-gram table, a Katz-backoff trigram over token ids,
as a drafter: the paper's stage 2.

The trigram's estimator (Katz backoff with absolute discounting, one discount per order):

    P3(w | u v) = (c(u v w) - D3) / c(u v .)              if (u v w) is kept
                = a(u v) * P2(w | v)                        otherwise
    P2(w | v)   = (c(v w) - D2) / c(v .)                    if (v w) is kept
                = a(v) * P1(w)                              otherwise
    P1(w)       = (c(w) + 1) / (N + V)                      (add-one: every token has mass)

Each backoff weight a(.) hands the discounted mass to the words the higher order does not cover,
in proportion to the lower order, so every distribution sums to 1 exactly:
a(ctx) = (1 - sum_kept own(w)) / (1 - sum_kept P_lower(w)). The discounts are the usual
count-of-counts estimate D = n1 / (n1 + 2 n2) (Ney et al.), taken before pruning. Pruning drops
rare n-grams (count < min_count) but keeps each context's full total c(ctx .), so the mass of the
pruned n-grams also flows to the lower order.

Stored as a compact .npz of sorted arrays: for bigrams a CSR table indexed by the context token,
for trigrams sorted context keys u*V+v with a CSR table of (next token, count) each.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
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
        self.model = model          # a KatzTrigram (below), or anything with probs/top
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


FORMAT = "specviz-katz-trigram-v1"
TOPS_KEPT = 1 << 16               # top()'s answers kept (then forgotten all at once)


def _discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    if n1 == 0:
        return 0.5
    return float(min(max(n1 / (n1 + 2 * n2), 0.1), 0.9))


def _csr(context_keys: np.ndarray, nexts: np.ndarray, counts: np.ndarray, keep: np.ndarray):
    """Group sorted (context, next) pairs into CSR arrays over the distinct contexts.

    Totals count every pair of a context; only the kept pairs get rows."""
    contexts, first = np.unique(context_keys, return_index=True)
    totals = np.add.reduceat(counts, first) if len(counts) else np.zeros(0, np.int64)
    kept_per_context = np.add.reduceat(keep.astype(np.int64), first) if len(keep) else totals
    ptr = np.concatenate([[0], np.cumsum(kept_per_context)])
    return contexts, totals, ptr, nexts[keep], counts[keep]


@dataclass
class KatzTrigram:
    vocab_size: int
    unigram: np.ndarray          # float64 [V], add-one smoothed
    d2: float
    d3: float
    bi_total: np.ndarray         # [V] c(v .), all bigrams with context v
    bi_ptr: np.ndarray           # [V + 1] CSR rows of kept bigrams
    bi_next: np.ndarray
    bi_count: np.ndarray
    tri_keys: np.ndarray         # sorted u * V + v of contexts with any trigram
    tri_total: np.ndarray
    tri_ptr: np.ndarray
    tri_next: np.ndarray
    tri_count: np.ndarray
    # top()'s answers, by last two tokens
    _tops: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ building

    @classmethod
    def build(cls, token_sequences, vocab_size: int, min_bigram_count: int = 1,
              min_trigram_count: int = 2) -> "KatzTrigram":
        """Count n-grams within each sequence (never across two), discount, prune and index."""
        V = vocab_size
        uni = np.zeros(V, dtype=np.int64)
        bi_keys, tri_keys = [], []
        for seq in token_sequences:
            s = np.asarray(seq, dtype=np.int64)
            if len(s) == 0:
                continue
            if s.min() < 0 or s.max() >= V:
                raise ValueError("token id outside the vocabulary")
            uni += np.bincount(s, minlength=V)
            bi_keys.append(s[:-1] * V + s[1:])
            tri_keys.append((s[:-2] * V + s[1:-1]) * V + s[2:])
        unigram = (uni + 1.0) / (uni.sum() + V)
        empty = np.zeros(0, np.int64)
        bi, bi_c = np.unique(np.concatenate(bi_keys or [empty]), return_counts=True)
        tri, tri_c = np.unique(np.concatenate(tri_keys or [empty]), return_counts=True)

        b_ctx, b_tot, b_ptr, b_next, b_cnt = _csr(bi // V, bi % V, bi_c, bi_c >= min_bigram_count)
        bi_total = np.zeros(V, np.int64)
        bi_total[b_ctx] = b_tot
        rows = np.zeros(V + 1, np.int64)           # expand CSR rows to every context token
        rows[b_ctx + 1] = np.diff(b_ptr)
        t_ctx, t_tot, t_ptr, t_next, t_cnt = _csr(tri // V, tri % V, tri_c,
                                                  tri_c >= min_trigram_count)
        has_rows = np.diff(t_ptr) > 0              # contexts left without rows back off fully
        t_ctx, t_tot = t_ctx[has_rows], t_tot[has_rows]
        t_ptr = np.concatenate([[0], np.cumsum(np.diff(t_ptr)[has_rows])])
        return cls(vocab_size=V, unigram=unigram, d2=_discount(bi_c), d3=_discount(tri_c),
                   bi_total=bi_total, bi_ptr=np.cumsum(rows), bi_next=b_next, bi_count=b_cnt,
                   tri_keys=t_ctx, tri_total=t_tot, tri_ptr=t_ptr, tri_next=t_next,
                   tri_count=t_cnt)

    # ------------------------------------------------------------------ storage

    def save(self, path) -> None:
        """Compressed .npz with the smallest dtypes that hold the values (loads in ~0.1 s)."""
        V = self.vocab_size
        idx = np.uint16 if V <= 1 << 16 else np.uint32
        key = np.uint32 if V * V <= 1 << 32 else np.int64
        ptr = np.uint32 if max(len(self.bi_next), len(self.tri_next)) < 1 << 32 else np.int64
        np.savez_compressed(
            path, format=np.array(FORMAT), vocab_size=np.array(V),
            d2=np.array(self.d2), d3=np.array(self.d3), unigram=self.unigram.astype(np.float64),
            bi_total=self.bi_total.astype(np.uint32), bi_ptr=self.bi_ptr.astype(ptr),
            bi_next=self.bi_next.astype(idx), bi_count=self.bi_count.astype(np.uint32),
            tri_keys=self.tri_keys.astype(key), tri_total=self.tri_total.astype(np.uint32),
            tri_ptr=self.tri_ptr.astype(ptr), tri_next=self.tri_next.astype(idx),
            tri_count=self.tri_count.astype(np.uint32))

    @classmethod
    def load(cls, path) -> "KatzTrigram":
        with np.load(path) as z:
            if str(z["format"]) != FORMAT:
                raise ValueError(f"{path} is not a {FORMAT} file")
            arrays = {name: z[name] for name in z.files if name not in ("format", "d2", "d3",
                                                                         "vocab_size")}
            return cls(vocab_size=int(z["vocab_size"]), d2=float(z["d2"]), d3=float(z["d3"]),
                       **arrays)

    def seen_tokens(self) -> np.ndarray:
        """The token ids its corpus holds (each one followed by another at least once)."""
        return np.nonzero(self.bi_total)[0]

    # ------------------------------------------------------------------ lookup

    def _bigram_row(self, v: int):
        a, b = int(self.bi_ptr[v]), int(self.bi_ptr[v + 1])
        return self.bi_next[a:b], self.bi_count[a:b], int(self.bi_total[v])

    def _trigram_row(self, u: int, v: int):
        key = u * self.vocab_size + v
        j = int(np.searchsorted(self.tri_keys, key))
        if j == len(self.tri_keys) or self.tri_keys[j] != key:
            return self.tri_next[:0], self.tri_count[:0], 0
        a, b = int(self.tri_ptr[j]), int(self.tri_ptr[j + 1])
        return self.tri_next[a:b], self.tri_count[a:b], int(self.tri_total[j])

    def _rows(self, context):
        """The (next, count, total, discount) rows of the orders the context reaches, low to high."""
        context = [int(t) for t in context[-2:]]
        rows = []
        if len(context) >= 1:
            rows.append((*self._bigram_row(context[-1]), self.d2))
        if len(context) >= 2:
            rows.append((*self._trigram_row(context[-2], context[-1]), self.d3))
        return rows

    @staticmethod
    def _back_off(p: np.ndarray, slots: np.ndarray, counts: np.ndarray, total: int,
                  discount: float) -> None:
        """Turn the lower-order probabilities `p` into the higher order's, in place: the row's
        words (at `slots` of p) get their discounted estimates, every other entry is scaled by
        the backoff weight a = (1 - sum own) / (1 - sum of the row's lower-order probs)."""
        if total == 0:
            return
        own = (counts.astype(np.float64) - discount) / total
        weight = (1.0 - float(own.sum())) / max(1.0 - float(p[slots].sum()), 1e-12)
        p *= weight
        p[slots] = own

    def probs(self, context) -> torch.Tensor:
        """The full next-token distribution after `context` (a list of token ids), float32 [V]."""
        p = self.unigram.copy()
        for nexts, counts, total, d in self._rows(context):
            self._back_off(p, nexts, counts, total, d)
        return torch.from_numpy(p.astype(np.float32))

    def top(self, context, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens with their probabilities, without building all of P; remembered by the last two
        tokens (all the model reads of a context): staged's guesses meet the same pairs again and again, and each
        costs about 0.4 ms of numpy (0.15 s of six 64-token generations)."""
        key = (tuple(int(t) for t in context[-2:]), k)
        found = self._tops.get(key)
        if found is None:
            if len(self._tops) >= TOPS_KEPT:
                self._tops.clear()
            found = self._tops[key] = self._top(context, k)
        return list(found)

    def _top(self, context, k: int) -> tuple[tuple[int, float], ...]:
        """Any word outside the context's rows gets (product of backoff weights) * P1(w), so the
        candidates are the rows' words plus the k + (number of row words) best unigrams: among
        those are at least k words outside the rows, so the result is exact."""
        unigram_top = getattr(self, "_unigram_top", None)
        if unigram_top is None:          # computed once; threads that race here compute the same array
            unigram_top = self._unigram_top = np.argsort(-self.unigram, kind="stable")
        rows = self._rows(context)
        row_words = sum(len(r[0]) for r in rows)      # row words may take unigram slots
        # sorted and unique, and no scratch buffer: app sessions share one model across threads
        candidates = np.unique(np.concatenate([unigram_top[:k + row_words], *(r[0] for r in rows)]))
        p = self.unigram[candidates]
        for nexts, counts, total, d in rows:
            self._back_off(p, np.searchsorted(candidates, nexts), counts, total, d)
        k = min(k, len(candidates))
        best = np.argpartition(-p, k - 1)[:k] if k < len(candidates) else np.arange(len(p))
        best = best[np.lexsort((candidates[best], -p[best]))]
        return tuple((int(candidates[j]), float(p[j])) for j in best)

    @property
    def num_bigrams(self) -> int:
        return len(self.bi_next)

    @property
    def num_trigrams(self) -> int:
        return len(self.tri_next)
