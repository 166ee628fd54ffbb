"""A 4-bit model's decoder layers run by one C call per forward (layer_loop.c), for specviz/decoder.py.

It applies where every product of every layer is an Int4Linear on specviz's kernel, with q/k/v and gate/up
stacked (specviz/shared_input.py), as `--dtype int4` loads Llama-family models wherever the kernel builds.
The C structures hold pointers into the model's own tensors, which this object keeps alive.
"""
from __future__ import annotations

import ctypes

import torch

from . import rows_kernel
from .int4 import Int4Linear


class _Product(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("d", ctypes.c_void_p), ("z", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("qkv", _Product), ("output", _Product),
                ("post_norm", ctypes.c_void_p), ("gate_up", _Product), ("down", _Product)]


def _whole(layer) -> bool:
    """An Int4Linear on specviz's kernel returning all its rows, its bias (if any) contiguous float32."""
    return (isinstance(layer, Int4Linear) and layer.own and layer.kept == layer.out_features
            and (layer.bias is None or _floats(layer.bias)))


def _floats(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.is_contiguous()


def _product(layer: Int4Linear) -> _Product:
    bias = None if layer.bias is None else layer.bias.data_ptr()
    return _Product(layer.packed.data_ptr(), layer.scales.data_ptr(), layer.zeros.data_ptr(), bias)


class LayerLoop:
    def __init__(self, layers: list, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float, scale: float):
        self.held = layers           # the tensors the pointers below point into
        self.layers = (_Layer * len(layers))(*[
            _Layer(l.input_norm.data_ptr(), _product(l.qkv), _product(l.output), l.post_norm.data_ptr(),
                   _product(l.gate_up), _product(l.down)) for l in layers])
        self.count, self.hidden, self.intermediate = len(layers), hidden, intermediate
        self.heads, self.kv_heads, self.head_dim, self.eps, self.scale = heads, kv_heads, head_dim, eps, scale

    @staticmethod
    def applies(layers: list) -> bool:
        """Every product a whole Int4Linear on specviz's kernel, the norms' weights contiguous float32."""
        return bool(layers) and all(all(_whole(p) for p in (l.qkv, l.output, l.gate_up, l.down))
                                    and _floats(l.input_norm) and _floats(l.post_norm) for l in layers)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            start: int, visible: torch.Tensor, committed: int) -> torch.Tensor:
        """x [n, hidden] embeddings -> the last layer's output (in place); cos, sin [n, head_dim]; keys and values
        the whole cache [layers, kv_heads, capacity, head_dim], the new entries written at `start`."""
        n = x.shape[0]
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        capacity, cols = keys.shape[2] if keys.dim() == 4 else 0, visible.shape[1]
        rows_kernel.require(0 <= committed <= start and start + n <= capacity and committed + cols <= capacity
                            and start + n == committed + cols, f"{n} new entries at {start} after {committed} committed "
                            f"({cols} visible) do not fit a cache of {capacity}")
        rows_kernel.require_tensor("hidden states", x, torch.float32, (n, self.hidden))
        for name, t in (("cos", cos), ("sin", sin)):
            rows_kernel.require_tensor(name, t, torch.float32, (n, self.head_dim))
        for name, t in (("keys", keys), ("values", values)):
            rows_kernel.require_tensor(name, t, torch.float32, (self.count, self.kv_heads, capacity, self.head_dim))
        rows_kernel.require_tensor("visible", visible, torch.bool, (n, cols))
        mask = visible.to(torch.uint8).contiguous()
        failed = rows_kernel.library().decode_layers(
            ctypes.addressof(self.layers), self.count, x.data_ptr(), n, self.hidden, self.heads, self.kv_heads,
            self.head_dim, self.intermediate, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(),
            keys.shape[2], start, mask.data_ptr(), committed, visible.shape[1], self.scale, self.eps,
            torch.get_num_threads())
        if failed:
            raise MemoryError(f"{rows_kernel.KERNEL}: no memory for the layers' scratch ({n} rows)")
        return x
