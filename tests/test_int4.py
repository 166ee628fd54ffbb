"""Linear layers in 4 bits (specviz/cpu/int4.py): what they compute, and models built from them."""
import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import tiny_model

from specviz.backends import choose as cache
from specviz.backends.choose import OwnForwardKV, open_cache, parameter_bytes, read_bytes
from specviz.cpu import kernels
from specviz.cpu.int4 import GROUP, WIDE_GROUP, Int4Linear, is_quantized, quantize_model
from specviz.models.load import LoadedModel, ModelLoadError, _quantized, load_model
from specviz.decode.tree import ancestor_matrix

REPO = Path(__file__).resolve().parents[1]


def linear(inputs=256, outputs=96, seed=0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(inputs, outputs)


def rows_as_the_kernel_reads_them(x: torch.Tensor, q: Int4Linear) -> torch.Tensor:
    """specviz's kernel rounds each row to int8 on one scale per 256 values (8 groups; the chunk's largest
    magnitude / 127, ties to even); PyTorch's rounds it to bfloat16."""
    if not q.own:
        return x.bfloat16().float()
    chunks = list(x.split(256, dim=1))
    for i, chunk in enumerate(chunks):
        amax = chunk.abs().amax(-1, keepdim=True)
        chunks[i] = torch.round(chunk * torch.where(amax > 0, 127 / amax, 0)) * (amax / 127)
    return torch.cat(chunks, 1)


GROUPS = pytest.mark.parametrize("group", [GROUP, WIDE_GROUP])     # a target's, a draft's


@GROUPS
def test_a_layer_multiplies_by_its_dequantized_weight_within_the_groups_rounding(group):
    layer = linear(320)                                      # a chunk of 256 inputs and one of 64
    q = Int4Linear(layer, group)
    assert q.group == (group if q.own else GROUP) and q.scales.shape[0] == 96
    w, w4 = layer.weight.detach(), q.dequantized()
    groups = w.reshape(w.shape[0], -1, q.group)
    step = (groups.amax(-1) - groups.amin(-1)) / 15          # one 4-bit step of each group
    slack = 2 ** -7 * groups.abs().amax(-1)                  # scale and zero rounded to bfloat16
    error = (w4 - w).abs().reshape(groups.shape).amax(-1)
    assert (error <= 0.5 * step + slack).all()
    assert error.max() > 0                                   # it did quantize
    x = torch.randn(5, 320)
    expected = rows_as_the_kernel_reads_them(x, q).double() @ w4.double().T + layer.bias
    assert torch.allclose(q(x).double(), expected, atol=1e-5 if q.own else 1e-2)
    # its inputs are rounded
    assert not torch.allclose(q(x).double(), x.double() @ w4.double().T + layer.bias, atol=1e-5)
    assert q(x[None]).shape == (1, 5, 96)                    # any leading dimensions


@GROUPS
@pytest.mark.parametrize("outputs", [64, 24])     # 16 outputs at a time with AVX512-VNNI; 8 without it, or for 24
def test_the_columns_product_of_a_prompt_read_computes_the_layers_model_within_float_rounding(outputs, group):
    q = Int4Linear(linear(896, outputs), group)
    if not q.own:
        pytest.skip("no rows kernel here (no AVX2): no columns product")
    x = torch.randn(40, 896)
    y = kernels.product_q4(q.packed, q.scales, q.zeros, x, outputs, columns=True, group=group)
    expected = rows_as_the_kernel_reads_them(x, q).double() @ q.dequantized().double().T
    assert torch.allclose(y.double(), expected, atol=1e-5 * expected.abs().max().item())
    unrounded = x.double() @ q.dequantized().double().T
    assert not torch.allclose(y.double(), unrounded, atol=1e-5 * expected.abs().max().item())


def test_specviz_kernel_and_pytorchs_hold_the_same_weights(monkeypatch):
    if not kernels.rows_available():
        pytest.skip("no kernel here: every layer is PyTorch's")
    layer = linear(192, 32)
    own = Int4Linear(layer)
    assert own.own and own.kernel() == "specviz q4 x q8"
    monkeypatch.setattr(kernels, "available", lambda: False)
    fallback = Int4Linear(layer)
    assert not fallback.own and fallback.kernel().startswith("torch")
    assert torch.equal(own.dequantized(), fallback.dequantized())
    x = torch.randn(3, 192)
    assert torch.allclose(own(x), fallback(x), atol=0.05)


@GROUPS
def test_a_weight_already_on_a_4bit_grid_is_kept_exactly(group):
    """GGUF's Q4 blocks are 32 weights on a 16-level grid: re-packing them loses nothing where the
    grid's step and middle are bfloat16 numbers (and so for 64 weights on one grid)."""
    if group != GROUP and not kernels.rows_available():
        pytest.skip("no rows kernel here: groups of 32 only")
    torch.manual_seed(1)
    out, inputs = 32, 640                                    # chunks of 8 blocks: 2 and a half
    q = torch.randint(0, 16, (out, inputs // group, group))
    q[..., 0], q[..., 1] = 0, 15                             # every group spans its whole grid
    scale = torch.rand(out, inputs // group, 1).add(0.01).bfloat16().float()
    zero = torch.randn(out, inputs // group, 1).bfloat16().float()
    weight = ((q - 8) * scale + zero).reshape(out, inputs)
    layer = torch.nn.Linear(inputs, out)
    with torch.no_grad():
        layer.weight.copy_(weight)
    assert torch.equal(Int4Linear(layer, group).dequantized(), weight)


def with_sinks(x: torch.Tensor) -> torch.Tensor:
    """Every third row an attention sink's: one value thousands of times the rest, which int8 rounding would crush
    the rest of its 256 values against (the kernel rounds such a row twice)."""
    x = x.clone()
    x[::3, 5] = 3000 * x.abs().amax()
    return x


@GROUPS
@pytest.mark.parametrize("inputs", [64, 192, 512, 896])     # the kernel's chunks of 8 blocks: 2, 6, 16, 28 blocks
@pytest.mark.parametrize("sinks", [False, True])
def test_each_row_is_computed_alone(inputs, group, sinks):
    """Plain decoding feeds one token and verification many: each token's product must not depend on
    how many are fed with it (bit for bit), or the two would round differently; rows rounded twice among them."""
    q = Int4Linear(linear(inputs, 160), group)
    x = torch.randn(70, inputs)
    x = with_sinks(x) if sinks else x
    together = q(x)
    for n in (1, 2, 3, 7, 16, 70):
        assert torch.equal(q(x[:n]), together[:n])
        assert torch.equal(q(x[n - 1:n]), together[n - 1:n])


@GROUPS
@pytest.mark.parametrize("columns", [False, True])
def test_a_row_that_rounding_crushes_is_rounded_twice(group, columns):
    """A sink's row rounded once to int8 loses the rest of its 256 values; the kernel rounds its remainder again
    (specviz/cpu/c/rounding.h), which brings it within int16's rounding of the layer's own product."""
    q = Int4Linear(linear(896, 64), group)
    if not q.own:
        pytest.skip("no rows kernel here (no AVX2): the layer is PyTorch's")
    x = with_sinks(torch.randn(4, 896))
    y = kernels.product_q4(q.packed, q.scales, q.zeros, x, 64, columns=columns, group=group).double()
    exact = x.double() @ q.dequantized().double().T
    once = rows_as_the_kernel_reads_them(x, q).double() @ q.dequantized().double().T
    for r in (0, 3):                                          # the sinks' rows: far closer than rounded once
        assert (y[r] - exact[r]).abs().max() < (once[r] - exact[r]).abs().max() / 20
    for r in (1, 2):                                          # the others: rounded once, as before
        assert torch.allclose(y[r], once[r], atol=1e-5 * once[r].abs().max().item())


@pytest.mark.slow
def test_vnni_and_avx2_builds_of_the_kernel_give_the_same_bits(tmp_path, kernel_builds):
    """The integer dot products are exact either way, and the float operations are the same: a machine
    with VNNI computes what one without it does (in groups of 32 and of 64)."""
    if not kernels.rows_available():
        pytest.skip("no rows kernel here (no AVX2): the layer is PyTorch's (tested above)")
    code = ("import sys, torch; from specviz.cpu import kernels; from specviz.cpu.int4 import Int4Linear; "
            "torch.manual_seed(0); layer = torch.nn.Linear(896, 64); x = torch.randn(5, 896); "
            "torch.save(([Int4Linear(layer, g)(x) for g in (32, 64)], kernels.status()), sys.argv[1])")
    results = []
    for switch in ("1", "avx2"):
        path = tmp_path / f"{switch}.pt"
        # the machine's own build is the user cache's (setup built it); the AVX2 one is built once a run
        builds = {"SPECVIZ_CACHE": str(kernel_builds)} if switch == "avx2" else {}
        env = {**os.environ, kernels.SWITCH: switch, **builds}
        done = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        results.append(torch.load(path))
    (vnni, status), (avx2, plain) = results
    assert plain == f"{kernels.KERNEL}: AVX2" and status.startswith(f"{kernels.KERNEL}: AVX2")
    assert all(torch.equal(a, b) for a, b in zip(vnni, avx2)) and not torch.equal(*avx2)


def test_a_quantized_model_has_no_float_linear_layers_left_and_reads_a_fraction_of_the_bytes():
    model = copy.deepcopy(tiny_model("llama", hidden=64))
    embedding = model.get_input_embeddings().weight.clone()
    fp32_once, _ = read_bytes(model)
    ids = torch.tensor([[3, 9, 27, 17, 51, 25, 11, 33]])
    with torch.inference_mode():
        before = model(ids).logits
        quantize_model(model)
        after = model(ids).logits
    assert is_quantized(model) and LoadedModel("tiny", model, None).dtype == "int4"
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert torch.equal(model.get_input_embeddings().weight, embedding)         # the embedding stays float32
    assert not model.config.tie_word_embeddings
    once, per_token = read_bytes(model)
    assert once < 0.4 * fp32_once and per_token == 64 * 4        # an untied embedding: a row per token fed
    assert (before.argmax(-1) == after.argmax(-1)).float().mean() >= 0.75
    assert torch.allclose(before, after, atol=0.5 * before.abs().max().item())


def test_a_draft_with_an_output_vocabulary_keeps_its_output_layer(tmp_path):
    """The engine reads only the predicted tokens' rows of such a draft's output layer."""
    model = copy.deepcopy(tiny_model("llama", hidden=64))
    vocab = torch.tensor([2, 5, 7, 11, 13])
    loaded = _quantized(LoadedModel("draft", model, None, output_vocab=vocab))
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)          # kept in float: not 4 bits
    assert type(model.model.layers[0].mlp.down_proj) is Int4Linear
    kv = open_cache(model, "draft", output_vocab=vocab)
    with torch.inference_mode():
        logits = kv.feed_committed([1, 2, 3])
    assert torch.isfinite(logits[:, vocab]).all() and torch.isinf(logits).sum() == 3 * (64 - 5)
    assert loaded.weight_bytes == parameter_bytes(model)


def test_int4_is_refused_off_the_cpu():
    with pytest.raises(ModelLoadError, match="CUDA|CPU precision"):
        load_model("smollm2-135m", "int4", "cuda")


def gqa_model(seed: int = 0, noise: float = 0.0):
    """A random 2-layer Qwen2 with Qwen2.5-Coder's head size and grouped queries (6 heads sharing 2 key
    and value heads): the shapes where SDPA rounds a token differently by how many are fed with it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=256, hidden_size=768, intermediate_size=1536, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)       # sharper distributions: drafts agree, greedy paths are not all ties
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * noise * p.std())
    return model


def tree_and_sequential_logits(model, root: int):
    """Logits of a 5-node tree (a chain and a side branch) fed at once, and of its chain's tokens fed
    one at a time, after the same 149-token prefix."""
    prefix = [(7 * i) % 256 for i in range(149)]
    tokens, parents, depths = [root, 5, 99, 6, 7], [-1, 0, 0, 1, 3], [0, 1, 1, 2, 3]
    with torch.inference_mode():
        one = open_cache(model, "sequential")
        one.feed_committed(prefix)
        sequential = torch.stack([one.feed_committed([t])[0] for t in (root, 5, 6, 7)])
        tree = open_cache(model, "tree")
        tree.feed_committed(prefix)
        fed = tree.forward(tokens, [tree.committed + d for d in depths], ancestor_matrix(parents))
    return fed[[0, 1, 3, 4]], sequential


@pytest.mark.parametrize("own_forward", [True, False])       # specviz/cpu/decoder.py, or transformers' modules
def test_an_int4_model_verifies_each_token_bit_for_bit_as_plain_decoding_computes_it(monkeypatch, own_forward):
    model = gqa_model()
    _quantized(LoadedModel("target", model, None))
    if not own_forward:
        monkeypatch.setattr(cache, "own_forward", lambda model: None)
    assert isinstance(open_cache(model, "which"), OwnForwardKV) == own_forward
    for root in range(10, 20):
        assert torch.equal(*tree_and_sequential_logits(model, root))


def test_through_transformers_with_all_tokens_attending_at_once_it_would_not_be(monkeypatch):
    model = gqa_model()
    _quantized(LoadedModel("target", model, None))
    monkeypatch.setattr(cache, "own_forward", lambda model: None)
    model.set_attn_implementation("sdpa")
    differ = [not torch.equal(*tree_and_sequential_logits(model, root)) for root in range(10, 20)]
    assert any(differ)


@pytest.mark.parametrize("precision", ["int4", "int8"])       # int8: specviz/cpu/int8.py (tests/test_int8.py)
def test_every_strategy_writes_baselines_tokens_with_a_quantized_target_and_draft(tmp_path, precision):
    from tiny import pin_plan, save_with_word_tokenizer

    from specviz.models.precision import precision_name
    from specviz.stack.stack import Stack

    for name, noise in (("target", 0.0), ("draft", 0.05)):
        save_with_word_tokenizer(gqa_model(noise=noise), tmp_path / name)
    stack = Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft"), "lookup"], dtype=precision)
    pin_plan(stack)                     # staged drafts as where verifying is cheap (tests/tiny.py)
    if precision == "int4" and kernels.rows_available():     # the draft's groups are 64 wide, the target's 32
        def groups(model) -> set[int]:
            return {m.group for m in model.modules() if isinstance(m, Int4Linear)}

        draft = stack.loaded[str(tmp_path / "draft")].model
        assert groups(stack.target.model) == {GROUP} and groups(draft) == {WIDE_GROUP}
    assert stack.precision() == precision_name(precision) == f"{precision} (re-quantised)"
    prompt = [(7 * i) % 64 for i in range(40)]
    base = stack.decoder(prompt, "baseline", max_new_tokens=40, stop_at_eos=False).generate().tokens
    runs = {s: stack.decoder(prompt, s, max_new_tokens=40, stop_at_eos=False).generate()
            for s in ("speculative", "tree", "staged")}
    assert {s: run.tokens for s, run in runs.items()} == {s: base for s in runs}
    # the draft does agree: tree's fixed shape shows it (speculative and staged plan their rounds, and take plain
    # steps where this toy's quantized guesses do not pay)
    assert runs["tree"].stats["tokens_per_target_forward"] > 1.2
