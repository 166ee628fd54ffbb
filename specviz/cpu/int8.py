"""Linear layers with 8-bit weights, multiplied by specviz's rows kernel (`specviz/cpu/kernels.py`).

Each output row of a weight matrix keeps one float32 scale (its largest magnitude / 127) and its
weights as int8, so a layer reads a quarter of float32's bytes. The rows kernel converts the weights
to float32 as it reads them and accumulates in float32. On our 2-core AVX2 machines a Qwen2.5-Coder-0.5B
forward of 8 tokens took 102-107 ms here, 141-146 in float32 and 141-155 with PyTorch's 4-bit kernel
(`_weight_int4pack_mm_for_cpu`, not specviz's own in `int4.py`); one token 52-54 ms, as with that kernel.
Meant for drafts, whose precision moves acceptance only; as a target, `int8` is its own numerical model,
exact against our int8 baseline (each row computed alone by the kernel, and one token at a time by
specviz/cpu/decoder.py or row_attention.py).
Without the kernel (no C compiler), the layer multiplies by its de-quantised weight: correct, slow.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kernels

INT8 = "int8"                 # the precision's name (`--dtype int8`)


class Int8Linear(torch.nn.Module):
    """y = x @ (scale[:, None] * q).T + b, q in -127..127."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        # Parameters (frozen) rather than buffers, so that weight counts include them
        self.weight_int8 = torch.nn.Parameter(torch.round(weight / scale[:, None]).to(torch.int8), requires_grad=False)
        self.scale = torch.nn.Parameter(scale, requires_grad=False)
        self.bias = None if linear.bias is None else \
            torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        y = kernels.product_int8(self.weight_int8, self.scale, rows)
        if y is None:
            y = F.linear(rows, self.dequantized())
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def output_rows(self, ids: torch.Tensor) -> "Int8Linear":
        """A layer computing only the outputs `ids` (a draft's output vocabulary: specviz/backends/choose.py)."""
        part = Int8Linear.__new__(Int8Linear)
        torch.nn.Module.__init__(part)
        part.in_features, part.out_features = self.in_features, len(ids)
        part.weight_int8 = torch.nn.Parameter(self.weight_int8[ids].contiguous(), requires_grad=False)
        part.scale = torch.nn.Parameter(self.scale[ids].contiguous(), requires_grad=False)
        part.bias = None if self.bias is None else torch.nn.Parameter(self.bias[ids].clone(), requires_grad=False)
        return part

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] in float32."""
        return self.weight_int8.float() * self.scale[:, None]
