"""Speculative sampling: turning logits into the distribution we sample from, drawing from it, and deciding which
drafted tokens the target accepts.

Greedy: walk down from the root while the target's argmax is one of the children, then emit the
target's argmax ("bonus" token). Output equals plain greedy decoding, whatever the tree.

Sampling (multi-draft speculative sampling, as in SpecInfer): at a node with target distribution
p and draft distribution q, try the children in the order they were drawn; accept child c with
probability min(1, p[c] / q[c]). On rejection p <- normalise(max(p - q, 0)), and because siblings
are drawn without replacement, q[c] <- 0 and q is renormalised. If no child is accepted, sample
the bonus token from the current p. The committed tokens are then distributed exactly as the target's.
One rule covers every child proposed deterministically (q = a point mass on its token; context lookup's
branch): such children are tried before the drawn ones, each accepted with probability p[c]; on
rejection p[c] <- 0 and p is renormalised, after which the drawn children are checked against that p
as usual (a drawn child with the same token can then never be accepted). A drafter whose q is itself a
point mass (LookupDrafter) gets the same arithmetic from the drawn rule: min(1, p/1) = p, and
normalise(max(p - q, 0)) = p without its token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import Tree


@dataclass(frozen=True)
class Sampling:
    """Greedy when temperature == 0; otherwise temperature, then top-k, then top-p."""
    temperature: float = 0.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1.0 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")


def logits_to_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Rows of logits -> rows of probabilities (float32). Greedy uses the plain softmax.

    Top-k keeps every logit at least the k-th largest (ties included). Where no row ties at the k-th, as is all but
    certain, the softmax runs over the k kept logits alone and is scattered into zeros: comparing and masking 151,936
    logits took milliseconds a row on 2 cores (a sampled token cost 15% more than a greedy one on an AVX2 machine)."""
    logits = logits.float()
    if sampling.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        k = sampling.top_k
        values, tokens = torch.topk(logits, k + 1, dim=-1)      # one more than kept, to see a tie at the k-th
        if bool((values[..., k] < values[..., k - 1]).all()):
            probs = torch.zeros_like(logits).scatter_(-1, tokens[..., :k], torch.softmax(values[..., :k], dim=-1))
        else:
            probs = torch.softmax(logits.masked_fill(logits < values[..., k - 1:k], float("-inf")), dim=-1)
    else:
        probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution: the inverse of its cumulative sum over its support at one uniform number.
    torch.multinomial took 7-8 ms over 151,936 probabilities on 2 cores; this takes a few hundred microseconds."""
    support = torch.nonzero(probs > 0).flatten()
    cumulative = torch.cumsum(probs[support].double(), dim=0)
    at = torch.searchsorted(cumulative, torch.rand((), dtype=torch.float64, generator=generator) * cumulative[-1],
                            right=True)
    return int(support[min(int(at), support.numel() - 1)])


def draw_without_replacement(probs: torch.Tensor, k: int, generator: torch.Generator) -> list[int]:
    """Up to k distinct tokens, in draw order, each drawn from probs renormalised over those not yet drawn.

    Gumbel-top-k: sorting log p + Gumbel noise gives exactly sequential sampling without replacement.
    Only the support is perturbed: after top-k/top-p that is a few dozen tokens, not the vocabulary.
    """
    support = torch.nonzero(probs > 0).flatten()
    k = min(k, support.numel())
    if k <= 0:
        return []
    uniform = torch.rand(support.shape, generator=generator).clamp_(min=1e-20)
    keys = probs[support].log() - torch.log(-torch.log(uniform))
    return support[torch.topk(keys, k).indices].tolist()


def best_tokens(rows: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token, the first of equals as argmax gives it: max's indices, which on a CPU take a third
    of argmax's time over a 151,936-token vocabulary (72 against 208 us a row, 2 threads)."""
    return rows.max(-1).indices


def top_tokens(probs: torch.Tensor, k: int) -> list[int]:
    """The k most likely tokens with non-zero probability, most likely first."""
    if k == 1:
        best = int(best_tokens(probs))
        return [best] if probs[best] > 0 else []
    values, tokens = torch.topk(probs, min(k, probs.shape[-1]))
    return tokens[values > 0].tolist()


@dataclass
class Verdict:
    path: list[int]                       # accepted node ids, root first
    bonus: int                            # the target's own token after the path
    accept_probs: list[float | None]      # per node: chance it was accepted when tried; None = never tried
    target_probs: list[float]             # per node: p(token | parent) under the target (1.0 for the root)


def target_probs_of_nodes(tree: Tree, probs: torch.Tensor) -> list[float]:
    parents = torch.tensor([max(p, 0) for p in tree.parents])
    values = probs[parents, torch.tensor(tree.tokens)].tolist()
    values[0] = 1.0
    return values


def verify_greedy(tree: Tree, probs: torch.Tensor) -> Verdict:
    """probs: [nodes, vocab] target distributions after each node."""
    best = best_tokens(probs).tolist()
    accept: list[float | None] = [None] * len(tree)
    accept[0] = 1.0
    node = 0
    path = [0]
    while True:
        chosen = None
        for child in tree.children[node]:
            accept[child] = 1.0 if tree.tokens[child] == best[node] else 0.0
            if chosen is None and accept[child] == 1.0:
                chosen = child
        if chosen is None:
            return Verdict(path, best[node], accept, target_probs_of_nodes(tree, probs))
        node = chosen
        path.append(node)


def verify_sampling(tree: Tree, probs: torch.Tensor, draft_dists: dict[int, torch.Tensor],
                    generator: torch.Generator) -> Verdict:
    """draft_dists[n]: the distribution node n's children were drawn from (without replacement)."""
    accept: list[float | None] = [None] * len(tree)
    accept[0] = 1.0
    node = 0
    path = [0]
    while True:
        p = probs[node].clone()
        chosen = None
        proposed = [c for c in tree.children[node] if tree.point_mass[c]]
        for child in proposed:      # point-mass proposals first: each accepted with the chance p gives it
            token = tree.tokens[child]
            accept[child] = float(p[token])
            if float(torch.rand((), generator=generator)) < accept[child]:
                chosen = child
                break
            p = without(p, token)
        drawn = [c for c in tree.children[node] if tree.drawn[c]]
        if chosen is None and drawn:
            q = draft_dists[node].clone()
            for child in drawn:
                token = tree.tokens[child]
                ratio = float(p[token] / q[token]) if q[token] > 0 else 0.0
                if child not in proposed:   # a proposed token has p = 0 by now: its chance was the point mass's
                    accept[child] = min(1.0, ratio)
                if float(torch.rand((), generator=generator)) < min(1.0, ratio):
                    chosen = child
                    break
                p = residual(p, q)
                q[token] = 0.0
                if q.sum() <= 0:
                    break
                q = q / q.sum()
        if chosen is None:
            return Verdict(path, sample(p, generator), accept, target_probs_of_nodes(tree, probs))
        node = chosen
        path.append(node)


def without(p: torch.Tensor, token: int) -> torch.Tensor:
    """p conditioned on not being `token`: the residual of a point-mass proposal that was rejected."""
    r = p.clone()
    r[token] = 0.0
    return r / r.sum()


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(p - q, 0)); if rounding leaves no mass, p itself (then p == q, nothing to fix)."""
    r = (p - q).clamp_(min=0.0)
    total = r.sum()
    return r / total if total > 0 else p
