"""KatzTrigram on tiny synthetic corpora: normalisation, backoff, storage, fast top-k."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specviz.decode.drafters.ngram import KatzTrigram

V = 12
CORPUS = [
    [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3],
    [5, 6, 7, 5, 6, 7, 5, 6, 7],
    [1, 2, 3, 5, 6, 8],
]


@pytest.fixture(scope="module")
def model():
    return KatzTrigram.build(CORPUS, vocab_size=V, min_trigram_count=1)


@pytest.mark.parametrize("context", [[], [1], [1, 2], [5, 6], [2, 9], [9, 10], [11], [0, 0, 1, 2]])
def test_probs_sum_to_one_for_seen_and_unseen_contexts(model, context):
    p = model.probs(context)
    assert p.shape == (V,) and p.dtype == torch.float32
    assert torch.all(p > 0)
    assert abs(float(p.double().sum()) - 1.0) < 1e-5


def test_seen_trigram_follows_its_counts(model):
    # after (1, 2) the corpus has 3 x4 times... counts: (1,2,3)=4, (1,2,4)=1
    p = model.probs([1, 2])
    total = 5
    assert p[3] == pytest.approx((4 - model.d3) / total, rel=1e-5)
    assert p[4] == pytest.approx((1 - model.d3) / total, rel=1e-5)
    assert p[3] > p[4] > p[0]


def test_unseen_trigram_context_falls_back_to_bigram(model):
    # (9, 2) never occurs: the distribution is exactly the bigram one after 2
    assert torch.allclose(model.probs([9, 2]), model.probs([2]))


def test_unseen_bigram_context_falls_back_to_unigram(model):
    p = model.probs([11])           # 11 never occurs
    assert torch.allclose(p, model.probs([]))
    counts = np.bincount(np.concatenate(CORPUS), minlength=V)
    expected = (counts + 1) / (counts.sum() + V)
    assert torch.allclose(p, torch.tensor(expected, dtype=torch.float32))


def test_unseen_word_in_seen_context_gets_backoff_mass(model):
    p2 = model.probs([2])
    p3 = model.probs([1, 2])
    # word 7 never follows (1, 2): its trigram prob is proportional to its bigram prob
    ratio = p3[7] / p2[7]
    assert torch.isclose(p3[8] / p2[8], ratio, rtol=1e-4)
    assert 0 < float(ratio) < 1


def test_pruned_trigrams_back_off(model):
    pruned = KatzTrigram.build(CORPUS, vocab_size=V, min_trigram_count=2)
    assert pruned.num_trigrams < model.num_trigrams
    # (1, 2, 4) seen once: pruned, so its mass now comes from the bigram row of 2
    p = pruned.probs([1, 2])
    assert abs(float(p.double().sum()) - 1.0) < 1e-5
    assert p[4] < model.probs([1, 2])[4]


def test_save_load_round_trip(model, tmp_path):
    path = tmp_path / "tri.npz"
    model.save(path)
    loaded = KatzTrigram.load(path)
    for context in ([], [1], [1, 2], [5, 6], [3, 11]):
        assert torch.equal(model.probs(context), loaded.probs(context))
        assert model.top(context, 4) == loaded.top(context, 4)


@pytest.mark.parametrize("context", [[], [1, 2], [5, 6], [9, 2], [11]])
def test_top_matches_full_distribution(model, context):
    top = model.top(context, 5)
    p = model.probs(context)
    values, _ = p.topk(5)
    assert [q for _, q in top] == pytest.approx([float(v) for v in values], rel=1e-5)
    for token, q in top:
        assert q == pytest.approx(float(p[token]), rel=1e-5)


def test_top_is_remembered_by_the_last_two_tokens_and_forgotten_when_full(monkeypatch):
    from specviz.decode.drafters import ngram
    model = KatzTrigram.build(CORPUS, vocab_size=V, min_trigram_count=1)
    fresh = KatzTrigram.build(CORPUS, vocab_size=V, min_trigram_count=1)
    first = model.top([9, 1, 2], 3)
    first.append((0, 0.0))                                   # the caller's list, not the remembered one
    assert model.top([7, 1, 2], 3) == fresh.top([1, 2], 3) == list(fresh._top([4, 1, 2], 3)) and len(model._tops) == 1
    assert model.top([1, 2], 2) == fresh.top([1, 2], 2) and len(model._tops) == 2      # k is part of the key
    monkeypatch.setattr(ngram, "TOPS_KEPT", 2)
    assert model.top([5, 6], 3) == fresh.top([5, 6], 3) and len(model._tops) == 1


def test_rejects_out_of_vocabulary_tokens():
    with pytest.raises(ValueError):
        KatzTrigram.build([[1, 2, V]], vocab_size=V)


corpora = st.lists(st.lists(st.integers(0, 7), min_size=0, max_size=30), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(corpus=corpora, context=st.lists(st.integers(0, 7), max_size=3),
       min_count=st.integers(1, 3))
def test_property_random_corpora_normalise_and_top_is_exact(corpus, context, min_count):
    m = KatzTrigram.build(corpus, vocab_size=8, min_trigram_count=min_count)
    p = m.probs(context).double()
    assert torch.all(p > 0)
    assert abs(float(p.sum()) - 1.0) < 1e-5
    top = m.top(context, 3)
    assert [q for _, q in top] == pytest.approx([float(v) for v in p.topk(3).values], rel=1e-5)


def test_top_gives_the_same_answers_from_many_threads_at_once():
    """App sessions share one model across threads: top() must keep no scratch state between calls
    (a shared buffer once gave another thread's candidates, and out-of-range indices)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    big = KatzTrigram.build([list(rng.integers(0, 200, 20000))], vocab_size=50000, min_trigram_count=1)
    contexts = [list(rng.integers(0, 200, 2)) for _ in range(400)]      # a real vocabulary's size
    alone = [big.top(c, 5) for c in contexts]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(3):
            assert list(pool.map(lambda c: big.top(c, 5), contexts)) == alone
