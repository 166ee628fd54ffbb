"""Deciding which drafted tokens the target accepts.

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

from .sampling import best_tokens, sample
from .tree import Tree


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
