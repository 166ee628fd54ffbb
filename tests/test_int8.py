"""Linear layers in 8 bits (specviz/cpu/int8.py) through the rows kernel: what they compute, and models built
from them (every strategy with an int8 target and draft: tests/test_int4.py, parametrized)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from test_int4 import gqa_model, tree_and_sequential_logits
from tiny import tiny_model

from specviz.backends.choose import read_bytes
from specviz.cpu import kernels
from specviz.cpu.int8 import Int8Linear
from specviz.models.load import LoadedModel, ModelLoadError, _quantized, load_model


def test_a_layer_multiplies_by_its_dequantized_weight_each_row_alone():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 99)
    layer = Int8Linear(linear)
    weight = layer.dequantized()
    assert (weight - linear.weight).abs().max() <= layer.scale.max() / 2 + 1e-6     # rounding to the nearest step
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_int8.abs().max() == 127
    x = torch.randn(16, 256)
    together = layer(x)
    assert torch.allclose(together, F.linear(x, weight, linear.bias), atol=1e-4)
    for n in (1, 2, 3, 7, 16):
        assert torch.equal(layer(x[:n]), together[:n])           # the same bits whatever rows come with it
    assert torch.equal(layer(x.reshape(2, 8, 256)), together.reshape(2, 8, 99))


def test_without_the_kernel_a_layer_still_multiplies_by_its_dequantized_weight(monkeypatch):
    torch.manual_seed(1)
    layer = Int8Linear(torch.nn.Linear(64, 24, bias=False))
    x = torch.randn(3, 64)
    monkeypatch.setattr(kernels, "product_int8", lambda *args: None)
    assert torch.allclose(layer(x), x @ layer.dequantized().T, atol=1e-5)


def test_an_int8_model_reads_a_quarter_of_the_bytes_and_says_so():
    model = copy.deepcopy(tiny_model("llama", hidden=64))
    fp32_once, _ = read_bytes(model)
    ids = torch.tensor([[3, 9, 27, 17, 51, 25, 11, 33]])
    with torch.inference_mode():
        before = model(ids).logits
        loaded = _quantized(LoadedModel("tiny", model, None), "int8")
        after = model(ids).logits
    assert loaded.dtype == "int8" and not any(type(m) is torch.nn.Linear for m in model.modules())
    assert read_bytes(model)[0] < 0.45 * fp32_once
    assert (before.argmax(-1) == after.argmax(-1)).float().mean() >= 0.9
    with pytest.raises(ModelLoadError, match="CUDA|CPU precision"):
        load_model("smollm2-135m", "int8", "cuda")


@pytest.mark.skipif(not kernels.available(), reason="bit for bit needs the rows kernel (no compiler here)")
def test_an_int8_model_verifies_each_token_bit_for_bit_as_plain_decoding_computes_it():
    model = gqa_model()
    _quantized(LoadedModel("target", model, None), "int8")
    for root in range(10, 16):
        assert torch.equal(*tree_and_sequential_logits(model, root))

