"""Sampled output is distributed exactly as the target's: checked against computed distributions."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import TinyTokenizer, tiny_model

import specviz.decode.sampling as sampling_rule
from specviz.backends.choose import open_cache
from specviz.decode.drafters import ModelDrafter
from specviz.decode.engine import Decoder
from specviz.decode.sampling import Sampling, draw_without_replacement, logits_to_probs, sample
from specviz.decode.tree import Tree, TreeSpec


def chi2_critical(df: int, p_value: float = 1e-5) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (accurate to a few % for df >= 3)."""
    z = {1e-5: 4.265}[p_value]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum()
    keep = expected_probs * n >= 5          # pool rare cells into one
    exp = torch.cat([expected_probs[keep] * n, (expected_probs[~keep] * n).sum().unsqueeze(0)])
    obs = torch.cat([counts[keep].double(), counts[~keep].sum().double().unsqueeze(0)])
    if exp[-1] < 5:
        exp, obs = exp[:-1], obs[:-1]
        assert counts[~keep].sum() <= max(5, 0.01 * n)
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def one_level_output(p, q, k, generator, copied=()):
    """Draw k children from q without replacement (plus a point-mass child for each token in `copied`,
    as context lookup proposes them), verify against p; return the committed token."""
    tree = Tree.with_root(0)
    for token in draw_without_replacement(q, k, generator):
        tree.add(0, token, 1, float(q[token]))
    for token in copied:
        tree.add_lookup_chain([token], 2)
    probs = torch.stack([p] * len(tree))
    verdict = sampling_rule.verify_sampling(tree, probs, {0: q}, generator)
    return tree.tokens[verdict.path[1]] if len(verdict.path) > 1 else verdict.bonus


def run_one_level(p, q, k, trials, seed=0, copied=()):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(p))
    for _ in range(trials):
        counts[one_level_output(p, q, k, generator, copied)] += 1
    return counts


def distribution(draw, size):
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=size, max_size=size))
    w = torch.tensor(weights) ** 2
    if w.sum() == 0:
        w[0] = 1.0
    return w / w.sum()


@settings(max_examples=8)
@given(data=st.data(), k=st.integers(1, 4))
def test_multi_draft_verification_preserves_the_target_distribution(data, k):
    p = distribution(data.draw, 6)
    q = distribution(data.draw, 6)
    stat, df = chi2(run_one_level(p, q, k, 6000), p)
    assert df < 1 or stat < chi2_critical(max(df, 3)), (p, q, stat)


@settings(max_examples=8)
@given(data=st.data(), k=st.integers(0, 3), copied=st.lists(st.integers(0, 5), min_size=1, max_size=2, unique=True))
def test_a_context_lookup_child_keeps_the_target_distribution(data, k, copied):
    """Point-mass children (one or two) are tried first, before (or merged with) drawn children."""
    p = distribution(data.draw, 6)
    q = distribution(data.draw, 6)
    stat, df = chi2(run_one_level(p, q, k, 6000, copied=copied), p)
    assert df < 1 or stat < chi2_critical(max(df, 3)), (p, q, copied, stat)


def test_lookup_rejection_without_removing_the_copied_token_is_caught(monkeypatch):
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.05, 0.05])
    monkeypatch.setattr(sampling_rule, "without", lambda p, token: p)
    stat, df = chi2(run_one_level(p, q, 1, 6000, copied=[0]), p)
    assert stat > chi2_critical(df)


def test_verification_without_residual_is_caught(monkeypatch):
    """The check has power: dropping the residual correction gives a detectably wrong distribution."""
    p = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05, 0.0])
    q = torch.tensor([0.1, 0.1, 0.6, 0.1, 0.05, 0.05])
    monkeypatch.setattr(sampling_rule, "residual", lambda p, q: p)
    stat, df = chi2(run_one_level(p, q, 2, 6000), p)
    assert stat > chi2_critical(df)


def exact_two_token_distribution(model, prompt, sampling):
    """p(x1, x2 | prompt) under the target with the sampling transform, by enumeration."""
    with torch.no_grad():
        first = logits_to_probs(model(torch.tensor([prompt])).logits[0, -1], sampling)
        vocab = first.shape[0]
        batch = torch.tensor([prompt + [x] for x in range(vocab)])
        second = logits_to_probs(model(batch).logits[:, -1], sampling)
    return (first[:, None] * second).flatten()


CASES = [   # name, sampling, tree, the draft's output vocabulary (None: all tokens)
    ("temperature", Sampling(temperature=1.0), TreeSpec(shape="dynamic", budget=6, max_depth=3, max_branch=3), None),
    ("top-k branching", Sampling(temperature=0.8, top_k=4),
     TreeSpec(shape="static", budget=6, max_depth=2, max_branch=3), None),
    ("top-p chain", Sampling(temperature=1.2, top_p=0.9), TreeSpec(shape="chain", budget=3, max_depth=3), None),
    ("draft over a token subset", Sampling(temperature=1.0),
     TreeSpec(shape="dynamic", budget=6, max_depth=3, max_branch=3), torch.tensor([0, 2, 3])),
    ("planned minimum scores", Sampling(temperature=1.0), TreeSpec(shape="dynamic", budget=6, max_depth=3, max_branch=3,
                                                                   min_scores=(0.1, 0.15, 0.2, 0.3, 0.3, 0.4)), None),
    ("context lookup branch", Sampling(temperature=1.0), TreeSpec(shape="dynamic", budget=2, max_depth=2, max_branch=2,
                                                                  lookup=3, lookup_ngram=1), None),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,sampling,spec,output_vocab", CASES, ids=[c[0] for c in CASES])
def test_engine_samples_two_tokens_exactly_as_the_target(name, sampling, spec, output_vocab):
    vocab = 5
    target = tiny_model("llama", vocab=vocab, hidden=16)
    draft = tiny_model("llama", vocab=vocab, hidden=16, noise=0.8)
    prompt = [1, 3, 2, 4, 1, 3]       # repeats itself, so context lookup proposes [2, 4, ...]
    expected = exact_two_token_distribution(target, prompt, sampling)
    counts = torch.zeros(vocab * vocab)
    trials = 2000
    for seed in range(trials):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        drafter = ModelDrafter(draft, backend=open_cache, output_vocab=output_vocab)
        run = Decoder(open_cache(target, "target"), TinyTokenizer(), prompt, drafter=drafter, tree=spec, sampling=s,
                      max_new_tokens=2).generate()
        counts[run.tokens[0] * vocab + run.tokens[1]] += 1
    stat, df = chi2(counts, expected)
    assert stat < chi2_critical(df), (stat, df)


def test_seeded_runs_are_reproducible():
    target = tiny_model("llama")
    draft = tiny_model("llama", noise=0.5)
    runs = [Decoder(open_cache(target, "target"), TinyTokenizer(), [4, 5, 6],
                    drafter=ModelDrafter(draft, backend=open_cache),
                    sampling=Sampling(temperature=1.0, top_k=20, seed=11), max_new_tokens=20).generate().tokens
            for _ in range(2)]
    other = Decoder(open_cache(target, "target"), TinyTokenizer(), [4, 5, 6],
                    drafter=ModelDrafter(draft, backend=open_cache),
                    sampling=Sampling(temperature=1.0, top_k=20, seed=12), max_new_tokens=20).generate().tokens
    assert runs[0] == runs[1]
    assert other != runs[0]


def masked_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k as a mask over every logit: the definition the fast path must equal."""
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 40), st.integers(1, 12), st.integers(0, 10 ** 6), st.booleans())
def test_top_k_over_the_kept_logits_alone_equals_the_mask_over_every_logit(rows, vocab, k, seed, tie):
    """Ties at the k-th logit keep every tied token (the slow path); else exactly k, with the same probabilities."""
    k = min(k, vocab - 1)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)).mul_(3).round_(decimals=1)
    if tie:
        logits[0, torch.topk(logits[0], k + 1).indices[-1]] = torch.topk(logits[0], k).values[-1]
    got = logits_to_probs(logits, Sampling(temperature=1.0, top_k=k))
    assert torch.allclose(got, masked_top_k(logits, k), atol=1e-6)
    assert ((got > 0).sum(-1) >= k).all()


def test_one_draw_follows_the_distribution_and_never_takes_a_token_without_probability():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    generator = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([sample(probs, generator) for _ in range(6000)]), minlength=6)
    assert counts[probs == 0].sum() == 0
    statistic, df = chi2(counts[probs > 0], probs[probs > 0])
    assert statistic < chi2_critical(df)
    assert sample(torch.tensor([0.0, 0.0, 1.0]), generator) == 2
