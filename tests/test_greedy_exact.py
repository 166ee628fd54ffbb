"""Every strategy's greedy output equals plain greedy decoding, token for token."""
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import TinyTokenizer, tiny_int4_model, tiny_model
from toy_ngram import ToyBigram

from specviz.backends.choose import open_cache
from specviz.decode.drafters import LookupDrafter, ModelDrafter, NgramDrafter, PromptWindow
from specviz.decode.drafters.base import FeedGate, ngram_evidence
from specviz.decode.engine import Decoder
from specviz.decode.tree import Tree, TreeSpec

TOK = TinyTokenizer()
INT4 = "llama-int4"       # the llama family 64 wide in 4 bits: specviz/cpu/decoder.py's forward and the 4-bit kernel


@functools.lru_cache(maxsize=None)
def model(family: str, noise: float = 0.0, noise_seed: int = 1):
    if family != INT4:
        return tiny_model(family, noise=noise, noise_seed=noise_seed)
    return tiny_int4_model(noise, noise_seed)


def drafter_for(kind, family):
    draft = model(family, noise=0.3)
    if kind == "model":
        return ModelDrafter(draft, backend=open_cache)
    if kind == "model-subset":      # predicts over the even tokens only (output_vocab)
        return ModelDrafter(draft, backend=open_cache, output_vocab=torch.arange(0, 64, 2))
    if kind == "model-window":      # reads the prompt's first token and its last 3 only
        return ModelDrafter(draft, backend=open_cache, window=PromptWindow(1, 3))
    if kind == "staged-window":
        return ModelDrafter(draft, backend=open_cache, window=PromptWindow(1, 3),
                            lower=NgramDrafter(ToyBigram.fit(64, seed=3)))
    if kind == "lookup":
        return LookupDrafter(64)
    if kind == "ngram":
        return NgramDrafter(ToyBigram.fit(64, seed=3))
    if kind == "staged-lookup":
        return ModelDrafter(draft, backend=open_cache, lower=LookupDrafter(64))
    if kind == "staged-ngram":
        return ModelDrafter(draft, backend=open_cache, lower=NgramDrafter(ToyBigram.fit(64, seed=3)))
    if kind == "staged-gated":     # feeds the guesses whose learnt chance pays on a steep draft curve
        return ModelDrafter(draft, backend=open_cache, lower=NgramDrafter(ToyBigram.fit(64, seed=3)),
                            gate=FeedGate((0.0, 0.006, 0.008, 0.011, 0.015)))
    if kind == "cascade":          # three stages: draft model, a smaller draft model, lookup
        lower = ModelDrafter(model(family, noise=0.6, noise_seed=2), backend=open_cache, name="small",
                             lower=LookupDrafter(64))
        return ModelDrafter(draft, backend=open_cache, lower=lower)
    raise ValueError(kind)


def greedy(model, prompt, n, static_len=None, **kw):
    return Decoder(open_cache(model, "target", static_len=static_len), TOK, prompt, max_new_tokens=n,
                   **kw).generate().tokens


KINDS = ["model", "model-subset", "model-window", "lookup", "ngram", "staged-lookup", "staged-ngram", "staged-gated",
         "staged-window", "cascade"]


@pytest.mark.parametrize("family", ["llama", "gpt2", INT4])
@given(prompt=st.lists(st.integers(0, 63), min_size=1, max_size=16),
       kind=st.sampled_from(KINDS), shape=st.sampled_from(["chain", "static", "dynamic"]),
       budget=st.integers(0, 20), depth=st.integers(1, 8), branch=st.integers(1, 4),
       width=st.integers(1, 5), n=st.integers(1, 24), lookup=st.sampled_from([0, 0, 3, 10]),
       lookup_ngram=st.integers(1, 3), planned=st.lists(st.floats(0.0, 0.9), max_size=12))
def test_greedy_output_equals_baseline(family, prompt, kind, shape, budget, depth, branch, width, n, lookup,
                                       lookup_ngram, planned):
    """planned: a tree grown by per-guess minimum scores, as specviz/decode/costs.py sets them"""
    target = model(family)
    expected = greedy(target, prompt, n)
    spec = TreeSpec(shape=shape, budget=budget, max_depth=depth, max_branch=branch, level_width=width,
                    lookup=lookup, lookup_ngram=lookup_ngram, min_scores=tuple(sorted(planned)))
    got = greedy(target, prompt, n, drafter=drafter_for(kind, family), tree=spec, strategy="tree")
    assert got == expected


def test_draft_equal_to_target_accepts_every_node_of_a_chain():
    target = tiny_model("llama")
    run = Decoder(open_cache(target, "target"), TOK, [1, 2, 3], drafter=ModelDrafter(target, backend=open_cache),
                  strategy="speculative", tree=TreeSpec(shape="chain", budget=5, max_depth=5),
                  max_new_tokens=30).generate()
    assert run.tokens == greedy(target, [1, 2, 3], 30)
    assert all(len(s.accepted_path) == 6 for s in run.steps)       # root + 5 drafted
    assert run.stats["tokens_per_target_forward"] == 6.0


@pytest.mark.parametrize("family", ["llama", INT4])
def test_a_windowed_draft_reads_the_prompts_head_and_tail_as_one_text(family):
    """PromptWindow(head, tail): the draft reads the prompt's first `head` and last `tail` tokens (the root among them)
    as one text, and its rounds go on from there; a prompt no longer than both it reads whole. The output stays the
    target's."""
    draft, prompt = model(family, noise=0.3), [5, 9, 2, 7, 7, 1, 3, 8, 4, 6]
    windowed = ModelDrafter(draft, backend=open_cache, window=PromptWindow(2, 3))
    run = Decoder(open_cache(model(family), "target"), TOK, prompt, drafter=windowed, strategy="speculative",
                  tree=TreeSpec(shape="chain", budget=3, max_depth=3), max_new_tokens=12).generate()
    assert run.tokens == greedy(model(family), prompt, 12)
    assert run.steps[0].forwards[windowed.name][0] == 5                       # its first feed: 5 tokens, not 10
    read = prompt[:2] + prompt[-3:]
    alone = ModelDrafter(draft, backend=open_cache)
    alone.start(read[:-1])
    windowed.start(prompt[:-1])
    tree = Tree.with_root(prompt[-1])
    assert torch.equal(windowed.expand(tree, [0], prompt)[0], alone.expand(tree, [0], read)[0])
    tree.add(0, 11, 1, 0.5)                    # a guess under the root, read at the position after it
    assert torch.equal(windowed.expand(tree, [1], prompt)[0], alone.expand(tree, [1], read)[0])
    whole = ModelDrafter(draft, backend=open_cache, window=PromptWindow(4, 6))
    whole.start(prompt[:-1])
    assert whole.skip == 0


def test_tree_accepts_more_per_target_forward_than_chain_with_same_draft_and_budget():
    target = tiny_model("llama")
    draft = tiny_model("llama", noise=0.3)
    totals = {"chain": [0, 0], "dynamic": [0, 0]}
    for seed in range(8):
        prompt = [(seed * 7 + i * 13) % 64 for i in range(6)]
        for shape in totals:
            run = Decoder(open_cache(target, "target"), TOK, prompt, drafter=ModelDrafter(draft, backend=open_cache),
                          strategy="tree", tree=TreeSpec(shape=shape, budget=8, max_depth=8),
                          max_new_tokens=32).generate()
            totals[shape][0] += run.stats["new_tokens"]
            totals[shape][1] += run.stats["target_forwards"]
    chain = totals["chain"][0] / totals["chain"][1]
    tree = totals["dynamic"][0] / totals["dynamic"][1]
    assert tree > chain, (tree, chain)


def test_staged_builds_the_same_tree_with_fewer_draft_forwards():
    target = tiny_model("llama")
    draft = tiny_model("llama", noise=0.3)
    spec = TreeSpec(shape="static", budget=12, max_depth=6)
    plain = Decoder(open_cache(target, "target"), TOK, [5, 9, 5, 9, 5], drafter=ModelDrafter(draft, backend=open_cache),
                    tree=spec, max_new_tokens=24).generate()
    lower = ModelDrafter(draft, backend=open_cache, name="same")
    staged = Decoder(open_cache(target, "target"), TOK, [5, 9, 5, 9, 5],
                     drafter=ModelDrafter(draft, backend=open_cache, lower=lower), tree=spec,
                     max_new_tokens=24).generate()
    for a, b in zip(plain.steps, staged.steps):
        assert [n.token for n in a.nodes] == [n.token for n in b.nodes]
        assert [n.parent for n in a.nodes] == [n.parent for n in b.nodes]
    assert staged.stats["draft_forwards"]["draft"] < plain.stats["draft_forwards"]["draft"]
    # nodes the lower stage guessed right are credited to stage 2
    assert any(n.stage == 2 for s in staged.steps for n in s.nodes)


def test_the_ngram_stage_copies_a_run_where_the_text_repeats_and_else_guesses_one_token():
    bigram = ToyBigram.fit(64, seed=3)
    stage = NgramDrafter(bigram)
    own = bigram.top([9], 1)[0][0]
    # after the earlier 5 9 (the latest, the longest match), vouched for as a copy
    assert stage.guess([5, 9, 7, 1, 5, 9], 3) == ([7, 1, 5], ("copy", "copy, later", "copy, later"))
    assert stage.guess_run == 2 and stage.guess([5, 9, 7, 1, 5, 9], stage.guess_run).tokens == [7, 1]
    assert stage.guess([5, 9, 7, 1, 2, 5, 9], 2).tokens == [7, 1]
    # no pair repeats: the model's token alone, vouched for by its probability
    assert stage.guess([3, 4, 5, 6, 7, 8, 9], 3) == ([own], (ngram_evidence(bigram.top([9], 1)[0][1]),))
    stage.copies = False
    assert stage.guess([5, 9, 7, 1, 5, 9], 3).tokens == [own]


def test_copied_guesses_build_the_same_tree_with_fewer_draft_forwards():
    """A draft that repeats itself (the target as its own draft), staged over an n-gram stage that copies the text
    against the same stage with its own tokens alone: the same trees, fewer forwards of the draft."""
    target = tiny_model("llama")
    spec = TreeSpec(shape="dynamic", budget=12, max_depth=12, level_width=1)
    runs = {}
    for copies in (True, False):
        lower = NgramDrafter(ToyBigram.fit(64, seed=3))
        lower.copies = copies
        runs[copies] = Decoder(open_cache(target, "target"), TOK, [5, 9, 5, 9, 5],
                               drafter=ModelDrafter(target, backend=open_cache, lower=lower), tree=spec,
                               strategy="staged", max_new_tokens=40).generate()
    for a, b in zip(runs[True].steps, runs[False].steps):
        assert [(n.token, n.parent) for n in a.nodes] == [(n.token, n.parent) for n in b.nodes]
    assert runs[True].tokens == runs[False].tokens == greedy(target, [5, 9, 5, 9, 5], 40)
    assert runs[True].stats["draft_forwards"]["draft"] < runs[False].stats["draft_forwards"]["draft"]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@settings(max_examples=12)
@given(prompt=st.lists(st.integers(0, 63), min_size=1, max_size=16), kind=st.sampled_from(KINDS),
       budget=st.integers(0, 20), n=st.integers(1, 24), lookup=st.sampled_from([0, 3, 10]))
def test_greedy_output_with_a_static_target_cache_equals_baseline(family, prompt, kind, budget, n, lookup):
    """The static cache (what the compiled path runs on) pads feeds and moves committed slots in
    place; none of it may change a token."""
    target = tiny_model(family)
    got = greedy(target, prompt, n, drafter=drafter_for(kind, family), strategy="tree", static_len=256,
                 tree=TreeSpec(budget=budget, lookup=lookup))
    assert got == greedy(target, prompt, n)


@given(values=st.lists(st.integers(0, 3), min_size=1, max_size=40), rows=st.integers(1, 4))
def test_the_best_token_is_argmaxs_first_of_equals_and_a_top_token_only_with_some_chance(values, rows):
    """Greedy verification and the tree's one-child levels take max's indices for argmax's (ties are common here)."""
    from specviz.decode.sampling import best_tokens, top_tokens
    probs = torch.tensor(values, dtype=torch.float32).roll(1).repeat(rows, 1) / 3
    assert best_tokens(probs).tolist() == probs.argmax(-1).tolist()
    expected = [int(probs[0].argmax())] if probs[0].max() > 0 else []
    assert top_tokens(probs[0], 1) == expected
