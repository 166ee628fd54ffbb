"""A quantized draft model's prompt read, on its float weights where this machine multiplies many rows faster so.

A draft model reads the whole prompt once, in its first round, through the products it decodes with. specviz's 4-bit
products are built for a few rows: on our 2-core AVX512+AMX CPU the Qwen2.5-Coder-0.5B read a 160-token prompt in
608 ms that way, as long as the 1.5B target's read on AMX tiles. So a draft may read prompts through float copies of
its products (the weights they multiply by, de-quantised in memory): the same layers, norms, rotary embedding and
attention (specviz/cpu/decoder.py's step-by-step forward), writing the same KV cache, only the products in another
precision. There, in bfloat16 (PyTorch's products, on AMX tiles through oneDNN), 128 tokens took 174-203 ms against
385-473 ms. A draft's numerics move acceptance only, never the output.

Which precision reads fastest is measured once per machine and draft, at the moments meant to be at rest (setup, the
bench, the app before its first race, as the tree plan), and stored (specviz/auto_choice.py); where nothing is stored
the draft reads with its own products. Feeds shorter than READ_ROWS (a round's nodes, catching up on a few tokens)
always take the draft's own products.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import replace
from time import perf_counter

import torch
import torch.nn.functional as F

from .decoder import Decoder

READ_ROWS = 32                     # tokens a committed feed must have to go through the reader
PROMPT = 128                       # tokens of the prompt read that is timed
CANDIDATES = ("bfloat16", "float32")
OWN = "own"                        # the choice of the draft's own products
_READERS: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()


class FloatProduct(torch.nn.Module):
    """y = x @ W.T + b in a float dtype, from and to float32: W the weight a quantized product multiplies by."""

    def __init__(self, product: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.weight = product.dequantized().to(dtype)
        self.bias = None if product.bias is None else product.bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


def float_layers(model: torch.nn.Module, dtype: torch.dtype) -> list[dict] | None:
    """Per decoder layer of a quantized model, float copies of its products as decoder.Layer holds them (the weights
    its own products multiply by, de-quantised in memory: no file is read); None where a product cannot say its
    weight."""
    layers = Decoder(model).layers
    products = [p for layer in layers for p in (*layer.attention_in, layer.output, *layer.mlp_in, layer.down)]
    if not all(hasattr(p, "dequantized") for p in products):
        return None
    return [{"attention_in": [FloatProduct(p, dtype) for p in layer.attention_in],
             "output": FloatProduct(layer.output, dtype),
             "mlp_in": [FloatProduct(p, dtype) for p in layer.mlp_in], "down": FloatProduct(layer.down, dtype)}
            for layer in layers]


def attach(model: torch.nn.Module, products: list[dict] | None) -> None:
    """From now on every KVModel of `model` (a quantized draft) reads feeds of READ_ROWS tokens or more through these
    products (float_layers of the same model); None: through its own again."""
    if products is None:
        _READERS.pop(model, None)
    else:
        _READERS[model] = products


def reader_of(decoder, model: torch.nn.Module):
    """A copy of `decoder` (the quantized model's) whose products are the float ones attached to `model`, or None."""
    products = _READERS.get(model)
    if products is None:
        return None
    reader = copy.copy(decoder)
    reader.loop = None              # the step-by-step forward: its products are modules
    reader.layers = [replace(layer, **floats) for layer, floats in zip(decoder.layers, products)]
    return reader


def time_read(model: torch.nn.Module, tokens: int = PROMPT, reps: int = 3) -> float:
    """Seconds for the fastest of `reps` reads of a `tokens`-token prompt through the draft's layers as a KVModel of it
    would read them (the reader where one is attached), its KV cache written as decoding does."""
    decoder = Decoder(model)
    reads = reader_of(decoder, model) or decoder
    vocab = model.get_input_embeddings().weight.shape[0]
    prompt, causal = [(7 * i) % vocab for i in range(tokens)], torch.ones(tokens, tokens, dtype=torch.bool).tril()
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            entries = decoder.entries()
            started = perf_counter()
            reads.forward(prompt, list(range(tokens)), causal, 0, entries, 1)
            best = min(best, perf_counter() - started)
    return best


def choose(model: torch.nn.Module) -> dict:
    """Time the draft's prompt read through its own products and through float copies of them in each candidate
    precision; the fastest wins where it is 10% faster than the draft's own products. Returns {"choice": a candidate
    or OWN, "seconds": {name: s}}."""
    attach(model, None)
    seconds = {OWN: time_read(model)}
    for name in CANDIDATES:
        products = float_layers(model, getattr(torch, name))
        if products is None:
            break
        attach(model, products)
        try:
            seconds[name] = time_read(model)
        finally:
            attach(model, None)
    best = min(seconds, key=seconds.get)
    choice = best if seconds[best] < 0.9 * seconds[OWN] else OWN
    return {"choice": choice, "seconds": {name: round(s, 4) for name, s in seconds.items()}}


def key(draft_name: str, draft_dtype: str) -> str:
    return f"prompt read: {draft_name} ({draft_dtype})"


def describe(choice: dict) -> str:
    seconds = ", ".join(f"{'its own products' if name == OWN else name} {s * 1e3:.0f} ms"
                        for name, s in choice["seconds"].items())
    how = "its own products" if choice["choice"] == OWN else f"{choice['choice']} copies of its weights"
    return f"the draft reads prompts through {how} ({PROMPT} tokens: {seconds})"
