"""The C kernels trust their arguments, so every entry point checks them first (specviz/cpu/kernels.py,
specviz/cpu/layer_loop.py): a wrong shape, dtype or layout is a one-line KernelInputError, never a read or write past
a tensor's end."""

import pytest
import torch
from tiny import tiny_int4_model

from specviz.cpu import kernels
from specviz.cpu.decoder import LlamaForward
from specviz.cpu.int4 import Int4Linear
from specviz.cpu.kernels import KernelInputError

pytestmark = pytest.mark.skipif(not kernels.rows_available(), reason="no C compiler or no AVX2: torch's products run")


def one_line_error(call, match: str) -> None:
    with pytest.raises(KernelInputError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_the_4bit_product_refuses_what_its_tiles_cannot_hold():
    layer = Int4Linear(torch.nn.Linear(128, 8))
    packed, scales, zeros = layer.packed, layer.scales, layer.zeros
    rows = torch.randn(3, 128)
    ok = kernels.product_q4(packed, scales, zeros, rows, 8)
    assert ok.shape == (3, 8) and torch.isfinite(ok).all()
    one_line_error(lambda: kernels.product_q4(packed, scales, zeros, rows, 6), "tiles of 4")     # a ragged N
    one_line_error(lambda: kernels.product_q4(packed[:, :32].contiguous(), scales, zeros, rows, 8),
                   "packed weights has shape")
    # odd blocks
    one_line_error(lambda: kernels.product_q4(packed, scales, zeros, torch.randn(3, 96), 8), "multiple of 64")
    one_line_error(lambda: kernels.product_q4(packed, scales.float(), zeros, rows, 8), "bfloat16")
    one_line_error(lambda: kernels.product_q4(packed, scales, zeros, rows.double(), 8), "float32")
    wide = torch.empty(8, 128, dtype=torch.uint8)[:, :64]                      # right shape, wrong layout
    one_line_error(lambda: kernels.product_q4(wide, scales, zeros, rows, 8), "contiguous")
    rows[1, 7] = float("nan")
    one_line_error(lambda: kernels.product_q4(packed, scales, zeros, rows, 8), "not finite")


def test_attention_refuses_entries_past_its_cache():
    query, keys = torch.randn(2, 4, 16), torch.randn(2, 8, 16)
    visible = torch.ones(2, 2, dtype=torch.bool)
    assert kernels.attend(query, keys, keys.clone(), visible, 6, 0.25).shape == (2, 4, 16)
    one_line_error(lambda: kernels.attend(query, keys, keys.clone(), visible, 7, 0.25), "do not fit")
    one_line_error(lambda: kernels.attend(query, keys, keys.clone(), visible.to(torch.uint8), 6, 0.25), "bool")
    one_line_error(lambda: kernels.attend(query, keys, keys[:, :4].clone(), visible, 2, 0.25), "values has shape")
    one_line_error(lambda: kernels.attend(torch.randn(2, 3, 16), keys, keys.clone(), visible, 6, 0.25), "kv heads")
    one_line_error(lambda: kernels.attend(query, keys, keys.transpose(0, 1).contiguous().transpose(0, 1), visible, 6,
                                              0.25), "contiguous")


def test_the_rms_norm_refuses_a_weight_of_another_width():
    x = torch.randn(3, 16)
    assert kernels.rms_norm(x, torch.ones(16), 1e-6).shape == (3, 16)
    one_line_error(lambda: kernels.rms_norm(x, torch.ones(8), 1e-6), "norm weight has shape")
    one_line_error(lambda: kernels.rms_norm(torch.randn(3, 12), torch.ones(12), 1e-6), "multiple of 8")


def test_the_layer_loop_refuses_entries_past_its_cache():
    model = tiny_int4_model()
    decoder = LlamaForward(model)
    assert decoder.loop is not None
    entries = decoder.entries()
    capacity = entries.keys.shape[2]
    x = torch.randn(2, 64)
    cos = sin = torch.ones(2, decoder.head_dim)
    visible = torch.ones(2, 2, dtype=torch.bool)
    assert decoder.loop.run(x.clone(), cos, sin, entries.keys, entries.values, 0, visible, 0).shape == (2, 64)
    one_line_error(lambda: decoder.loop.run(x.clone(), cos, sin, entries.keys, entries.values, capacity - 1, visible,
                                            capacity - 1), "do not fit")
    one_line_error(lambda: decoder.loop.run(x.clone(), cos, sin, entries.keys[:, :1].contiguous(), entries.values, 0,
                                            visible, 0), "keys has shape")
    one_line_error(lambda: decoder.loop.run(x.double(), cos, sin, entries.keys, entries.values, 0, visible, 0),
                   "float32")
