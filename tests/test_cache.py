"""The tree-masked forward and the KV commit agree with plain decoding."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny import tiny_model

from specviz.backends.choose import bucket, open_cache
from specviz.decode.tree import Tree, ancestor_matrix

FAMILIES = [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa"), ("gpt2", "eager")]


def plain_cache(model, tokens):
    kv = open_cache(model, "plain")
    logits = kv.feed_committed(tokens)
    return kv, logits


def random_tree(data, vocab):
    tree = Tree.with_root(data.draw(st.integers(0, vocab - 1)))
    for i in range(1, data.draw(st.integers(1, 12))):
        tree.add(data.draw(st.integers(0, i - 1)), data.draw(st.integers(0, vocab - 1)), 1, 0.5)
    return tree


@pytest.mark.parametrize("family,attn", FAMILIES)
@given(data=st.data())
def test_tree_logits_equal_sequential_logits_and_commit_equals_plain_cache(family, attn, data):
    model = tiny_model(family, attn=attn)
    prefix = data.draw(st.lists(st.integers(0, 63), min_size=1, max_size=10))
    tree = random_tree(data, 64)
    kv = open_cache(model, "tree")
    kv.feed_committed(prefix)
    logits = kv.forward(tree.tokens, [len(prefix) + d for d in tree.depths], ancestor_matrix(tree.parents))
    for node in range(len(tree)):
        _, expected = plain_cache(model, prefix + tree.path_tokens(node))
        torch.testing.assert_close(logits[node], expected[-1], rtol=1e-4, atol=1e-4)

    leaf = data.draw(st.integers(0, len(tree) - 1))
    kv.commit(tree.path(leaf))
    plain, _ = plain_cache(model, prefix + tree.path_tokens(leaf))
    assert kv.committed == plain.committed and kv.pending == 0
    for ours, theirs in zip(kv.cache.layers, plain.cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, rtol=1e-4, atol=1e-5)


def test_boolean_mask_is_not_what_we_pass():
    """Eager attention adds the mask: ours must be an additive float mask with -inf-like blocks."""
    model = tiny_model("llama", attn="eager")
    kv = open_cache(model, "t")
    kv.feed_committed([1, 2, 3])
    tree = Tree.with_root(4)
    a = tree.add(0, 5, 1, 0.5)
    tree.add(0, 6, 1, 0.5)          # sibling of a: must not see a
    logits = kv.forward(tree.tokens, [3, 4, 4], ancestor_matrix(tree.parents))
    _, expected = plain_cache(model, [1, 2, 3, 4, 6])
    torch.testing.assert_close(logits[2], expected[-1], rtol=1e-4, atol=1e-4)
    assert a == 1


def test_forward_log_counts_tokens_and_kv_entries():
    kv = open_cache(tiny_model("llama"), "t")
    kv.feed_committed([1, 2, 3, 4])
    kv.forward([5, 6], [4, 5], torch.ones(2, 2, dtype=torch.bool).tril())
    assert kv.log.tokens == [4, 2]
    assert kv.log.kv_entries == [4, 6]
    assert kv.kv_bytes_per_entry == 2 * 2 * 2 * 8 * 4     # k+v, layers, kv heads, head dim, fp32


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_output_vocab_gives_the_full_models_logits_on_the_subset_and_minus_inf_elsewhere(family):
    model = tiny_model(family)
    subset = torch.tensor([0, 3, 7, 8, 20, 63])
    full, restricted = open_cache(model, "full"), open_cache(model, "subset", output_vocab=subset)
    tokens, positions = [5, 9, 2], [0, 1, 2]
    visible = torch.ones(3, 3, dtype=torch.bool).tril()
    expected, got = full.forward(tokens, positions, visible), restricted.forward(tokens, positions, visible)
    torch.testing.assert_close(got[:, subset], expected[:, subset], rtol=1e-5, atol=1e-5)
    outside = torch.ones(64, dtype=torch.bool)
    outside[subset] = False
    assert torch.isneginf(got[:, outside]).all()
    hidden = model.config.hidden_size if family == "llama" else model.config.n_embd
    assert full.weight_bytes - restricted.weight_bytes == (64 - len(subset)) * hidden * 4


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])     # our output layer / the model's own
@pytest.mark.parametrize("subset", [None, torch.tensor([0, 3, 7, 8, 20, 63])])
@pytest.mark.parametrize("static_len", [None, 64])
def test_keep_gives_the_last_rows_logits_and_the_same_cache(family, dtype, subset, static_len):
    model = tiny_model(family, dtype=dtype)
    every, last = (open_cache(model, name, output_vocab=subset, static_len=static_len) for name in ("every", "last"))
    prompt = [5, 9, 2, 11, 40, 1, 7]
    expected = every.feed_committed(prompt)
    got = last.feed_committed(prompt, keep=2)
    assert got.shape == (2, 64)
    torch.testing.assert_close(got, expected[-2:], rtol=2e-2, atol=2e-2)
    assert last.committed == every.committed == len(prompt)
    visible = torch.ones(3, 3, dtype=torch.bool).tril()
    torch.testing.assert_close(last.forward([3, 4, 6], [7, 8, 9], visible),       # the caches hold the same entries
                               every.forward([3, 4, 6], [7, 8, 9], visible), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="keep must be in"):
        last.forward([1], [10], torch.ones(1, 1, dtype=torch.bool), keep=2)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@given(data=st.data())
def test_static_cache_gives_the_dynamic_caches_logits_and_keeps_the_same_entries(family, data):
    """Over a few rounds, each tree fed in one or two forwards (padded to buckets), then a path
    committed: the static cache's logits and committed entries are the dynamic cache's."""
    model = tiny_model(family)
    dynamic, static = open_cache(model, "dynamic"), open_cache(model, "static", static_len=160)
    prefix = data.draw(st.lists(st.integers(0, 63), min_size=1, max_size=10))
    for kv in (dynamic, static):
        kv.feed_committed(prefix)
    for _ in range(data.draw(st.integers(1, 3))):
        tree = random_tree(data, 64)
        split = data.draw(st.integers(1, len(tree)))
        visible = ancestor_matrix(tree.parents)
        positions = [dynamic.committed + d for d in tree.depths]
        outputs = []
        for kv in (dynamic, static):
            parts = [kv.forward(tree.tokens[:split], positions[:split], visible[:split, :split])]
            if split < len(tree):
                parts.append(kv.forward(tree.tokens[split:], positions[split:], visible[split:]))
            outputs.append(torch.cat(parts))
        torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-4)
        path = tree.path(data.draw(st.integers(0, len(tree) - 1)))
        for kv in (dynamic, static):
            kv.commit(path)
    assert static.committed == dynamic.committed and static.pending == 0
    end = dynamic.committed
    for ours, theirs in zip(static.cache.layers, dynamic.cache.layers):
        torch.testing.assert_close(ours.keys[:, :, :end], theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.values[:, :, :end], theirs.values, rtol=1e-4, atol=1e-5)
        assert int(ours.cumulative_length) == end


def test_static_feeds_are_padded_to_buckets_and_a_full_cache_is_a_clear_error():
    assert [bucket(n) for n in (1, 3, 5, 16, 17, 64, 65)] == [1, 4, 8, 16, 32, 64, 65]
    model = tiny_model("llama")
    kv = open_cache(model, "small", static_len=8)
    kv.feed_committed([1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="static cache holds 8"):
        kv.forward([6, 7, 8], [5, 6, 7], torch.ones(3, 3, dtype=torch.bool).tril())     # padded to 4
    with pytest.raises(ValueError, match="needs a static cache"):
        open_cache(model, "compiled", compiled=model)


def test_a_static_feed_larger_than_every_bucket_runs_unpadded():
    model = tiny_model("llama")
    prompt = [i % 64 for i in range(70)]
    static = open_cache(model, "static", static_len=128)
    _, expected = plain_cache(model, prompt)
    torch.testing.assert_close(static.feed_committed(prompt), expected, rtol=1e-4, atol=1e-4)
    assert static.log.tokens == [70] and int(static.cache.layers[0].cumulative_length) == 70


def test_a_reset_static_cache_keeps_its_memory_and_reads_like_a_new_one():
    """A static cache is zeroed in place on reset: CUDA graphs read the addresses they recorded."""
    model = tiny_model("llama")
    reused = open_cache(model, "reused", static_len=64)
    reused.feed_committed([9, 8, 7, 6, 5, 4])
    addresses = [layer.keys.data_ptr() for layer in reused.cache.layers]
    reused.reset()
    assert reused.length == 0 and int(reused.cache.layers[0].cumulative_length) == 0
    assert [layer.keys.data_ptr() for layer in reused.cache.layers] == addresses
    fresh = open_cache(model, "fresh", static_len=64)
    torch.testing.assert_close(reused.feed_committed([1, 2, 3]), fresh.feed_committed([1, 2, 3]), rtol=0, atol=0)


def test_an_untied_input_embedding_is_read_a_row_per_token_and_a_tied_one_with_the_output_layer():
    from specviz.backends.choose import parameter_bytes, read_bytes

    untied = tiny_model("llama")                    # Llama's default: separate input and output matrices
    embedding = untied.get_input_embeddings().weight
    once, per_token = read_bytes(untied)
    assert per_token == embedding.shape[1] * 4 and once == parameter_bytes(untied) - embedding.numel() * 4
    kv = open_cache(untied, "t")
    kv.feed_committed([1, 2, 3, 4])
    assert kv.log.bytes_read(kv.costs()) == once + 4 * per_token + 4 * kv.kv_bytes_per_entry   # 4 entries attended
    tied = tiny_model("gpt2")                       # GPT-2 reads its one matrix as the output layer
    assert read_bytes(tied) == (parameter_bytes(tied), 0)
