"""specviz's own forward for quantized Llama-family models (specviz/cpu/decoder.py) and its C parts
(row_attention.c): the same function as transformers' forward, each row computed alone."""
import copy

import pytest
import torch
from test_int4 import gqa_model
from tiny import tiny_model

from specviz.backends.choose import OwnForwardKV, open_cache
from specviz.cpu import kernels
from specviz.cpu.decoder import LlamaForward, supported
from specviz.models.load import LoadedModel, _quantized
from specviz.decode.tree import ancestor_matrix

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs specviz's kernels (AVX2 and a C compiler)")


@pytest.mark.parametrize("make", [gqa_model, lambda: tiny_model("llama", hidden=64)], ids=["qwen2", "llama"])
def test_in_float32_it_computes_transformers_logits(make):
    """The decoder's own steps (rotary, grouped-query attention, biases, norms) against transformers', on the
    float model, where only rounding can tell them apart."""
    model = make()
    prompt = [(7 * i) % 64 for i in range(60)]
    with torch.inference_mode():
        theirs = model(torch.tensor([prompt])).logits[0]
        decoder = LlamaForward(model)
        hidden = decoder.forward(prompt, list(range(60)), torch.ones(60, 60, dtype=torch.bool).tril(), 0,
                                 decoder.entries(), 60)
        ours = model.get_output_embeddings()(hidden)
    assert torch.allclose(ours, theirs, atol=1e-4 * theirs.abs().max().item())


def test_it_runs_quantized_llama_family_models_only():
    llama, gpt2 = copy.deepcopy(tiny_model("llama", hidden=64)), copy.deepcopy(tiny_model("gpt2", hidden=64))
    assert not supported(llama)                      # float32: transformers' forward
    for model in (llama, gpt2):
        _quantized(LoadedModel("m", model, None))
    assert supported(llama) and not supported(gpt2)
    assert isinstance(open_cache(llama, "l"), OwnForwardKV) and not isinstance(open_cache(gpt2, "g"), OwnForwardKV)


# (query heads, kv heads, values a head): the 1.5B's and the 0.5B's, an odd group, one head alone of a size not a
# multiple of 32
SHAPES = [(12, 2, 128), (14, 2, 64), (6, 2, 64), (4, 4, 24)]


@pytest.mark.parametrize("heads, kv_heads, dim", SHAPES)
@pytest.mark.parametrize("committed", [20, 3, 0])
def test_attention_gives_each_row_softmax_over_the_entries_it_sees(heads, kv_heads, dim, committed):
    torch.manual_seed(0)
    capacity, group = 40, heads // kv_heads
    keys, values = torch.randn(kv_heads, capacity, dim), torch.randn(kv_heads, capacity, dim)
    query = torch.randn(5, heads, dim) * 2
    visible = ancestor_matrix([-1, 0, 0, 1, 3]).bool()
    out = kernels.attend(query, keys, values, visible, committed, 0.125)
    for row in range(5):
        seen = list(range(committed)) + [committed + c for c in range(5) if visible[row, c]]
        k, v = keys[:, seen].repeat_interleave(group, 0), values[:, seen].repeat_interleave(group, 0)
        expected = torch.softmax(query[row][:, None] @ k.transpose(1, 2) * 0.125, -1) @ v
        assert torch.allclose(out[row], expected[:, 0], atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads, dim", SHAPES)
def test_a_rows_attention_and_norm_are_the_same_bits_whatever_rows_come_with_it(heads, kv_heads, dim):
    """Rows that see 50 to 62 entries (their sums over entries in runs of 8 end anywhere), fed together and alone."""
    torch.manual_seed(1)
    keys, values = torch.randn(kv_heads, 64, dim), torch.randn(kv_heads, 64, dim)
    query = torch.randn(13, heads, dim)
    together = kernels.attend(query, keys, values, torch.ones(13, 13, dtype=torch.bool).tril(), 50, 0.1)
    for row in range(13):
        alone = kernels.attend(query[row:row + 1], keys, values, torch.ones(1, 1, dtype=torch.bool), 50 + row, 0.1)
        assert torch.equal(alone[0], together[row])
    x, weight = torch.randn(8, 1536) * 3, torch.randn(1536)
    normed = kernels.rms_norm(x, weight, 1e-6)
    assert torch.allclose(normed, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight, atol=1e-5)
    assert all(torch.equal(kernels.rms_norm(x[r:r + 1], weight, 1e-6)[0], normed[r]) for r in range(8))


def test_committing_a_branch_keeps_the_entries_plain_feeding_writes():
    model = gqa_model()
    _quantized(LoadedModel("target", model, None))
    prefix = [(5 * i) % 256 for i in range(30)]
    with torch.inference_mode():
        plain, tree = open_cache(model, "plain"), open_cache(model, "tree")
        for kv in (plain, tree):
            kv.feed_committed(prefix)
        plain.feed_committed([11, 99])
        tree.forward([11, 5, 99], [30, 31, 31], ancestor_matrix([-1, 0, 0]))     # keep the root and its 2nd child
        tree.commit([0, 2])
        forked = open_cache(model, "forked")
        forked.copy_committed(tree)
    for kv in (tree, forked):
        assert kv.committed == plain.committed == 32
        assert torch.equal(kv.cache.keys[:, :, :32], plain.cache.keys[:, :, :32])
        assert torch.equal(kv.cache.values[:, :, :32], plain.cache.values[:, :, :32])


def test_the_cache_grows_past_its_first_allocation():
    model = copy.deepcopy(tiny_model("llama", hidden=64))
    _quantized(LoadedModel("m", model, None))
    prompt = [(3 * i) % 64 for i in range(300)]
    with torch.inference_mode():
        grown = open_cache(model, "grown")
        grown.feed_committed(prompt[:200])
        first = grown.feed_committed(prompt[200:])          # 300 entries: past the first 256
        whole = open_cache(model, "whole").feed_committed(prompt)
    assert grown.cache.keys.shape[2] >= 300
    assert torch.equal(first, whole[200:])


@pytest.mark.parametrize("make", [gqa_model, lambda: tiny_model("llama", hidden=64)], ids=["qwen2", "llama"])
def test_its_layers_in_one_c_call_compute_what_its_steps_in_python_compute(make):
    """layer_loop.c against decoder.py's loop over the same 4-bit layers, on a prompt and then a tree: the same
    steps, so only SiLU's exponential (C's against torch's) may move the last bits."""
    model = copy.deepcopy(make())
    _quantized(LoadedModel("m", model, None))
    looped = LlamaForward(model)
    stepped = copy.copy(looped)
    stepped.loop = None
    assert looped.loop is not None
    prompt = [(11 * i) % 64 for i in range(40)]
    results = []
    with torch.inference_mode():
        for decoder in (looped, stepped):
            entries = decoder.entries()
            causal = torch.ones(40, 40, dtype=torch.bool).tril()
            first = decoder.forward(prompt, list(range(40)), causal, 0, entries, 40)
            tree = decoder.forward([3, 9, 4], [40, 41, 41], ancestor_matrix([-1, 0, 0]).bool(), 40, entries, 3)
            results.append((first, tree, entries.keys[:, :, :43], entries.values[:, :, :43]))
    for ours, theirs in zip(*results):
        assert torch.allclose(ours, theirs, atol=1e-4 * theirs.abs().max().item())


def test_layers_the_c_loop_cannot_read_take_the_python_steps():
    model = copy.deepcopy(tiny_model("llama", hidden=64))
    _quantized(LoadedModel("m", model, None))
    assert LlamaForward(model).loop is not None
    output = model.model.layers[1].self_attn.o_proj
    output.bias = torch.nn.Parameter(torch.zeros(output.out_features, dtype=torch.bfloat16), requires_grad=False)
    assert LlamaForward(model).loop is None             # a bfloat16 bias: stepped in Python, not refused
