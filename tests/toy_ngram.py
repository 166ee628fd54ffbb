"""A small bigram model with the n-gram drafter's interface, for tests that need no assets."""
import torch


class ToyBigram:
    def __init__(self, table: torch.Tensor):
        self.table = table          # [vocab, vocab] rows sum to 1

    @classmethod
    def fit(cls, vocab: int, seed: int = 0, sharpness: float = 3.0) -> "ToyBigram":
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(vocab, vocab, generator=generator) * sharpness
        return cls(torch.softmax(logits, -1))

    def probs(self, context):
        return self.table[context[-1]].clone()

    def top(self, context, k):
        values, tokens = torch.topk(self.table[context[-1]], k)
        return list(zip(tokens.tolist(), values.tolist()))
