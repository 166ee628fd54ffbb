"""Matrix products for a few tokens at a time on a CPU, at the speed of the memory.

Decoding and verifying feed 1-16 tokens, so each linear layer is a product of a wide weight matrix
with a few rows. nn.Linear computes rows @ W.T, which MKL runs at 9-19 GB/s of weights on our 2-core
AVX2 machines. The engine's forwards use specviz's own kernel instead (`specviz/cpu/kernels.py`: about twice
as fast up to 4 rows, and each row computed by the same operations whatever rows come with it). Where that
kernel cannot run, they compute W @ rows.T, which MKL streams at ~17 GB/s for 2-8 rows, and feed a
single row as two (the row twice). Either way plain decoding gets the same kernel as verification,
so a comparison between them measures speculation, not a kernel.

A model's linear layers become RowsLinear (`install`) when it loads (specviz/models/load.py): the same weights, no
copy, and nn.Linear's product unless a thread is inside `engine_products`. Only the engine's own forwards switch it on
(specviz/backends/dynamic.py): transformers' generate() on the same model objects, as HF peers run, keeps nn.Linear's
product. Opening a cache changes no model: models are shared between caches and threads.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from . import kernels
from .int4 import is_quantized

MAX_ROWS = 16            # more rows (a prompt) go to nn.Linear's own product
_ACTIVE = threading.local()
_INSTALL_LOCK = threading.Lock()


def rows_product(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """rows @ weight.T for a few rows [n, in] -> [n, out]: by the rows kernel, else as weight @ rows.T
    (a single row goes in twice, see the module's docstring)."""
    out = kernels.product(weight, rows)
    if out is not None:
        return out
    n = rows.shape[0]
    rows = rows.repeat(2, 1) if n == 1 else rows.contiguous()    # a [in, n] layout of rows is 3x slower
    return (weight @ rows.T).T[:n]


class RowsLinear(torch.nn.Linear):
    """An nn.Linear whose product of a few rows is rows_product while this thread is inside engine_products."""

    @classmethod
    def of(cls, linear: torch.nn.Linear) -> "RowsLinear":
        """The same layer, holding `linear`'s own weight and bias (no copy: tied weights stay tied)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(_ACTIVE, "on", False) or x.dim() != 3 or x.shape[0] != 1 or x.shape[1] > MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        out = rows_product(self.weight, x[0])
        if self.bias is not None:
            out = out + self.bias
        return out.unsqueeze(0)


def applies(model: torch.nn.Module) -> bool:
    """Float32 on a CPU: where the measurement above was made (bfloat16, int4 and GPUs keep their products)."""
    weight = next(model.parameters())
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and not is_quantized(model)


def install(model: torch.nn.Module) -> bool:
    """Replace the model's plain linear layers by RowsLinear ones, in place (again is a no-op); False where it does not
    apply. The model's other modules hold no reference to a linear layer, so the replaced ones are gone."""
    if not applies(model):
        return False
    with _INSTALL_LOCK:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, RowsLinear.of(child))
    return True


def installed(model: torch.nn.Module) -> bool:
    """Whether the model's linear layers are RowsLinear ones (install ran when it loaded)."""
    return any(isinstance(module, RowsLinear) for module in model.modules())


@contextmanager
def engine_products(on: bool = True):
    """Within this block, on this thread, installed linear layers use rows_product."""
    before = getattr(_ACTIVE, "on", False)
    _ACTIVE.on = on
    try:
        yield
    finally:
        _ACTIVE.on = before
