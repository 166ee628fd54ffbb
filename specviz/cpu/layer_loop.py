"""A quantized model's decoder layers run by one C call per forward (layer_loop.c), for specviz/cpu/decoder.py.

It applies where every product of every layer is a BlockLinear on a GGUF file's blocks (`--dtype gguf`, q/k/v and
gate/up each apart, their outputs written side by side), or an Int4Linear on specviz's kernel with q/k/v and gate/up
stacked (specviz/cpu/shared_input.py), as `--dtype int4` loads Llama-family models wherever the kernel builds.
The C structures hold pointers into the model's own tensors, which this object keeps alive.
"""
from __future__ import annotations

import ctypes

import torch

from . import build, kernels
from .blocks import ERRORS, BlockLinear
from .int4 import ColumnsProduct, Int4Linear

NO_MEMORY = build.CONSTANTS["LAYERS_NO_MEMORY"]     # decode_layers' answer where its scratch could not be allocated
COLUMNS = build.CONSTANTS["Q4_COLUMNS"]             # a Product's type: 4-bit tiles summed many outputs at a time


class _Product(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("N", ctypes.c_int), ("w", ctypes.c_void_p), ("d", ctypes.c_void_p),
                ("z", ctypes.c_void_p), ("group", ctypes.c_int), ("bias", ctypes.c_void_p), ("packed", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("q", _Product), ("k", _Product), ("v", _Product),
                ("output", _Product), ("post_norm", ctypes.c_void_p), ("gate", _Product), ("up", _Product),
                ("down", _Product)]


def _readable(products: list) -> bool:
    """Siblings the C loop multiplies: BlockLinears, or one (stacked) Int4Linear on specviz's kernel returning all its
    rows, or such a layer's ColumnsProduct (its outputs a multiple of 8); biases (if any) contiguous float32."""
    if len(products) == 1 and isinstance(products[0], ColumnsProduct):
        return _readable([products[0].product]) and products[0].product.out_features % 8 == 0
    if not all(p.bias is None or _floats(p.bias) for p in products):
        return False
    if all(isinstance(p, BlockLinear) and p.weight.is_contiguous() for p in products):
        return True
    return len(products) == 1 and isinstance(products[0], Int4Linear) and products[0].own and \
        products[0].kept == products[0].out_features


def _floats(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.is_contiguous()


def _product(layer) -> _Product:
    if isinstance(layer, ColumnsProduct):
        product = _product(layer.product)
        product.type = COLUMNS
        return product
    bias = None if layer.bias is None else layer.bias.data_ptr()
    if isinstance(layer, BlockLinear):
        packed = layer.packed_blocks()
        return _Product(layer.qtype, layer.out_features, layer.weight.data_ptr(), None, None, 0, bias,
                        None if packed is None else packed.data_ptr())
    return _Product(0, layer.out_features, layer.packed.data_ptr(), layer.scales.data_ptr(), layer.zeros.data_ptr(),
                    layer.group, bias)


def _parts(products: list, count: int) -> list[_Product]:
    """The siblings' products, then empty ones up to `count`."""
    return [_product(p) for p in products] + [_Product()] * (count - len(products))


class LayerLoop:
    def __init__(self, layers: list, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float, scale: float):
        self.held = layers           # the tensors the pointers below point into
        self.layers = (_Layer * len(layers))(*[
            _Layer(layer.input_norm.data_ptr(), *_parts(layer.attention_in, 3), _product(layer.output),
                   layer.post_norm.data_ptr(), *_parts(layer.mlp_in, 2), _product(layer.down)) for layer in layers])
        self.count, self.hidden, self.intermediate = len(layers), hidden, intermediate
        self.heads, self.kv_heads, self.head_dim, self.eps, self.scale = heads, kv_heads, head_dim, eps, scale

    def with_layers(self, layers: list) -> "LayerLoop":
        """The same loop over other products of the same layers (a draft's prompt read: prompt_reader.py)."""
        return LayerLoop(layers, self.hidden, self.intermediate, self.heads, self.kv_heads, self.head_dim, self.eps,
                         self.scale)

    @staticmethod
    def applies(layers: list) -> bool:
        """Every product one the C loop multiplies, the norms' weights contiguous float32."""
        return bool(layers) and all(
            all(_readable(p) for p in (layer.attention_in, [layer.output], layer.mlp_in, [layer.down]))
            and _floats(layer.input_norm) and _floats(layer.post_norm) for layer in layers)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            start: int, visible: torch.Tensor, committed: int) -> torch.Tensor:
        """x [n, hidden] embeddings -> the last layer's output (in place); cos, sin [n, head_dim]; keys and values
        the whole cache [layers, kv_heads, capacity, head_dim], the new entries written at `start`."""
        n = x.shape[0]
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        capacity, cols = keys.shape[2] if keys.dim() == 4 else 0, visible.shape[1]
        kernels.require(0 <= committed <= start and start + n <= capacity and committed + cols <= capacity
                        and start + n == committed + cols,
                        f"{n} new entries at {start} after {committed} committed ({cols} visible) do not fit a cache "
                        f"of {capacity}")
        kernels.require_tensor("hidden states", x, torch.float32, (n, self.hidden))
        for name, t in (("cos", cos), ("sin", sin)):
            kernels.require_tensor(name, t, torch.float32, (n, self.head_dim))
        for name, t in (("keys", keys), ("values", values)):
            kernels.require_tensor(name, t, torch.float32, (self.count, self.kv_heads, capacity, self.head_dim))
        kernels.require_tensor("visible", visible, torch.bool, (n, cols))
        mask = visible.to(torch.uint8).contiguous()
        failed = kernels.library().decode_layers(
            ctypes.addressof(self.layers), self.count, x.data_ptr(), n, self.hidden, self.heads, self.kv_heads,
            self.head_dim, self.intermediate, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(),
            keys.shape[2], start, mask.data_ptr(), committed, visible.shape[1], self.scale, self.eps,
            torch.get_num_threads())
        if failed == NO_MEMORY:
            raise MemoryError(f"{kernels.KERNEL}: no memory for the layers' scratch ({n} rows)")
        kernels.require(not failed, f"a layer's product was given {ERRORS.get(failed, failed)}")
        return x
