"""The backends of specviz's models, and which one a model gets: `open_cache` is the `Backend`
(specviz/backends/interface.py) the stack, the bench and the tests hand the engine.

- a static cache where one is asked for (compiled models, fixed shapes: static.py);
- specviz's own forward for a quantized Llama-family model its kernels run (own.py);
- transformers' forward over a dynamic cache for every other model (dynamic.py).
"""
from __future__ import annotations

import torch

from .interface import BUCKETS, bucket
from ..cpu.decoder import LlamaForward
from ..cpu.prompt_reader import READ_ROWS
from .dynamic import DynamicKV
from .kv import KVModel, parameter_bytes, read_bytes, restricts_output
from .own import OwnForwardKV
from .static import StaticKV

__all__ = ["BUCKETS", "DynamicKV", "KVModel", "OwnForwardKV", "StaticKV", "bucket", "open_cache", "parameter_bytes",
           "read_bytes", "restricts_output"]


def open_cache(model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None,
               static_len: int | None = None, compiled=None, prompt_products: list[dict] | None = None,
               read_from: int = READ_ROWS) -> KVModel:
    """A fresh cache of `model`. output_vocab: the tokens it predicts (others get -inf); static_len: a static cache of
    this many entries; compiled: a compiled copy of the model (or of its body, with output_vocab) for bucket-sized
    feeds, which needs static_len; prompt_products: a quantized draft's products for feeds of `read_from` tokens or
    more (prompt_reader.py), used by specviz's own forward."""
    if compiled is not None and static_len is None:
        raise ValueError("a compiled model needs a static cache (static_len)")
    if static_len is not None:
        return StaticKV(model, name, output_vocab, static_len=static_len, compiled=compiled)
    forward = own_forward(model)
    if forward is not None:
        return OwnForwardKV(forward, name, output_vocab, prompt_products, read_from)
    return DynamicKV(model, name, output_vocab)


def own_forward(model: torch.nn.Module) -> LlamaForward | None:
    """specviz's own forward of the model, where it runs it (a quantized Llama-family model its kernels run)."""
    return LlamaForward.of(model)
