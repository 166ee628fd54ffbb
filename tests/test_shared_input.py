"""Sibling 4-bit layers stacked into one product (specviz/cpu/shared_input.py): the same bits, fewer calls."""
import copy

import pytest
import torch
from test_int4 import gqa_model

from specviz.backends.choose import open_cache, parameter_bytes
from specviz.cpu import kernels
from specviz.cpu.int4 import Int4Linear
from specviz.cpu.shared_input import Slice, Stacked, stack_siblings
from specviz.models.load import LoadedModel, _quantized

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="no rows kernel here: int4 layers are PyTorch's, never stacked")


def quantized_pair():
    """The same random Qwen2 quantized twice: siblings stacked (as models load) and left apart."""
    stacked = gqa_model()
    _quantized(LoadedModel("stacked", stacked, None))
    apart = copy.deepcopy(stacked)
    for layer in apart.model.layers:          # undo the stacking: each sibling an Int4Linear of its own rows
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, Slice):
                    setattr(parent, name, _rows_of(child))
                elif isinstance(child, Stacked):
                    delattr(parent, name)
    return stacked, apart


def _rows_of(part: Slice) -> Int4Linear:
    whole, rows = part.stacked.layer, slice(part.start, part.end)
    tiles = tuple(getattr(whole, name)[rows].clone() for name in ("packed", "scales", "zeros"))
    return Int4Linear.of_tiles(tiles, whole.in_features, part.end - part.start,
                               None if whole.bias is None else whole.bias[rows].clone())


def test_stacked_siblings_compute_the_same_bits_in_fewer_calls(monkeypatch):
    stacked, apart = quantized_pair()
    attention = stacked.model.layers[0].self_attn
    assert all(isinstance(getattr(attention, n), Slice) for n in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(stacked.model.layers[0].mlp.up_proj, Slice)
    assert parameter_bytes(stacked) == parameter_bytes(apart)          # each weight counted once
    calls = []
    product = kernels.product_q4
    monkeypatch.setattr(kernels, "product_q4", lambda *a, **k: calls.append(1) or product(*a, **k))
    logits = {}
    with torch.inference_mode():
        for name, model in (("stacked", stacked), ("apart", apart)):
            calls.clear()
            kv = open_cache(model, name)
            kv.decoder.loop = None     # the products called one by one from Python (layer_loop.c needs them stacked)
            logits[name] = ([kv.feed_committed([(5 * i) % 256 for i in range(40)])]
                            + [kv.feed_committed([t]) for t in (7, 99, 3)])
            logits[name + " calls"] = len(calls)
    assert all(torch.equal(a, b) for a, b in zip(logits["stacked"], logits["apart"]))
    layers = len(stacked.model.layers)
    assert logits["apart calls"] - logits["stacked calls"] == 4 * 3 * layers        # 7 products a layer become 4
    assert all(m._last is None for m in stacked.modules() if isinstance(m, Stacked))  # no result kept after a forward


def test_only_4bit_layers_on_specvizs_kernel_with_one_input_width_are_stacked():
    model = gqa_model()
    _quantized(LoadedModel("int8", model, None), "int8")
    assert stack_siblings(model) == 0 and not any(isinstance(m, Slice) for m in model.modules())
