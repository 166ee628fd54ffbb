"""The lossless panel's statistics: on a tiny model whose next-token distribution is known exactly,
staged sampling passes the chi-square tests, and a broken verifier fails them."""
from collections import Counter
from dataclasses import replace

import pytest
import torch
from tiny import tiny_stack

from specviz.decode import engine
from specviz.analysis.lossless import (
    ChiSquare,
    first_tokens,
    goodness_of_fit,
    greedy_diff,
    homogeneity,
    next_token_distribution,
    p_value,
)
from specviz.decode.sampling import Sampling, Verdict, sample, target_probs_of_nodes

PROMPT = [3, 14, 15, 9, 26, 5]
SAMPLING = Sampling(temperature=0.3)    # sharp enough that 1000 samples tell small biases apart
N = 1000


@pytest.fixture(scope="module")
def stack():
    return tiny_stack(("draft", "lookup"), noise=1.0)


def counts(stack, strategy, n=N, seed=0, prefilled=None):
    def new(seed):
        return stack.decoder(PROMPT, strategy, sampling=replace(SAMPLING, seed=seed), max_new_tokens=8,
                             stop_at_eos=False, prefilled=prefilled)

    return Counter(first_tokens(new, n, seed))


def test_p_values_match_the_chi_square_table():
    assert p_value(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert p_value(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    assert p_value(float("inf"), 3) == 0.0 and p_value(2.0, 0) == 1.0


def test_the_tests_tell_equal_from_different_distributions():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.3, 0.3, 0.3, 0.1])

    def draw(dist, n):
        return Counter(torch.multinomial(dist, n, replacement=True, generator=g).tolist())

    assert goodness_of_fit(draw(p, 2000), p).p_value > 1e-3
    assert goodness_of_fit(draw(q, 2000), p).p_value < 1e-6
    assert homogeneity(draw(p, 2000), draw(p, 2000)).p_value > 1e-3
    assert homogeneity(draw(p, 2000), draw(q, 2000)).p_value < 1e-6
    assert goodness_of_fit(Counter({4: 1}), p).p_value == 0.0    # a token the target never writes


def test_staged_sampling_follows_the_targets_distribution(stack):
    exact = next_token_distribution(stack.target.model, PROMPT, SAMPLING)
    staged, plain = counts(stack, "staged"), counts(stack, "baseline", seed=10_000)
    assert goodness_of_fit(staged, exact).p_value > 1e-3
    assert goodness_of_fit(plain, exact).p_value > 1e-3
    assert homogeneity(staged, plain).p_value > 1e-3
    # the draft really disagrees with the target, so a verifier that trusts it is visible
    draft = next_token_distribution(stack.loaded["draft"].model, PROMPT, SAMPLING)
    assert 0.5 * (draft - exact).abs().sum() > 0.3


def test_staged_copying_the_models_reads_of_the_prompt_follows_the_targets_distribution(stack):
    """The panel's samples: the target and the draft read the prompt once, every decoder copies them."""
    exact = next_token_distribution(stack.target.model, PROMPT, SAMPLING)
    read_once = stack.prefill(PROMPT)
    assert read_once.cache_of(stack.loaded["draft"].model) is not None
    assert goodness_of_fit(counts(stack, "staged", seed=20_000, prefilled=read_once), exact).p_value > 1e-3


def _forgets_the_residual(tree, probs, dists, generator):
    """A classic bug: after a rejection, sample from p instead of normalise(max(p - q, 0))."""
    node, path = 0, [0]
    while True:
        chosen = None
        for child in tree.children[node]:
            token = tree.tokens[child]
            if float(torch.rand((), generator=generator)) < min(1.0, float(probs[node][token] / dists[node][token])):
                chosen = child
                break
        if chosen is None:
            return Verdict(path, sample(probs[node], generator), [None] * len(tree), target_probs_of_nodes(tree, probs))
        node = chosen
        path.append(node)


def _trusts_the_draft(tree, probs, dists, generator):
    node, path = 0, [0]
    while tree.children[node]:
        node = tree.children[node][0]
        path.append(node)
    return Verdict(path, sample(probs[node], generator), [1.0] * len(tree), target_probs_of_nodes(tree, probs))


# samples each broken verifier needs: trusting the draft is a gross bias (p below 1e-100 at 300 samples); a forgotten
# residual is a subtle one (p near 1e-13 at 1000, 1e-2 at 300)
@pytest.mark.parametrize("broken,n", [(_trusts_the_draft, 300), (_forgets_the_residual, N)])
def test_a_broken_verifier_fails_the_test(stack, monkeypatch, broken, n):
    monkeypatch.setattr(engine, "verify_sampling", broken)
    exact = next_token_distribution(stack.target.model, PROMPT, SAMPLING)
    spec = counts(stack, "speculative", n=n)
    assert goodness_of_fit(spec, exact).p_value < 1e-4
    if broken is _trusts_the_draft:       # a gross bias shows against plain samples too
        assert homogeneity(spec, counts(stack, "baseline", n=300, seed=10_000)).p_value < 1e-4


def test_greedy_diff_names_the_first_difference():
    got = greedy_diff({"baseline": [1, 2, 3, 4], "staged": [1, 2, 3, 4], "tree": [1, 2, 9, 4], "hf": [1, 2]})
    assert got == {"staged": "all 4 tokens identical", "tree": "3 of 4 tokens equal; first difference at token 3",
                   "hf": "identical for 2 tokens, then one lane stopped (2 vs 4)"}
    assert isinstance(homogeneity(Counter(), Counter({1: 3})), ChiSquare)
