"""A quantized draft model's prompt read, through other products where this machine multiplies many rows faster so.

A draft model reads the whole prompt once, in its first round, through the products it decodes with. specviz's 4-bit
products are built for a few rows: on our 2-core AVX512+AMX CPU the Qwen2.5-Coder-0.5B read a 160-token prompt in
608 ms that way, as long as the 1.5B target's read on AMX tiles. So a draft may read prompts through other products
of the same layers: float copies of its own (the weights they multiply by, de-quantised in memory, multiplied by
PyTorch), or its own 4-bit weights summed 8 outputs at a time (16 with AVX512-VNNI; rows_kernel.c's
rows_matmul_q4_columns: no copy, other bits). The same layers, norms, rotary embedding and attention write the same
KV cache (specviz/cpu/decoder.py's step-by-step forward for float copies; its C layer loop, layer_loop.c, for the
columns: 128 tokens 304-320 -> 277-285 ms with AVX512-VNNI, 403 -> 378-395 with AVX2 only); only the products
differ. With AMX, in bfloat16 (on AMX tiles through oneDNN), 128 tokens took 174-203 ms against 385-473 ms. A draft's
numerics move acceptance only, never the output.

Which way reads fastest is measured once per machine and draft by `python -m specviz.prepare`, on the machine at rest,
and kept in its profile (specviz/profile/store.py); where nothing is stored the draft reads with its own products. So is
the length from which the chosen way reads faster (`crossover`): on this Zen 5 the columns won from 8 tokens with AVX2
only (16 tokens 33 against 42 ms), bfloat16 copies from 48-64 with AVX-512, whose own products are twice as wide.
Shorter feeds (a round's nodes, catching up on a few tokens) take the draft's own products; READ_ROWS where nothing is
stored.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from statistics import median
from time import perf_counter

import torch
import torch.nn.functional as F

from .decoder import LlamaForward
from .layer_loop import LayerLoop
from .int4 import ColumnsProduct, Int4Linear

READ_ROWS = 32                     # tokens a feed must have to go through the reader, where no crossover is stored
LENGTHS = (8, 12, 16, 24, 32, 48, 64, 96)   # feed lengths a crossover is looked for at (fewer: a round's own feeds)
PROMPT = 128                       # tokens of the prompt read that is timed
COLUMNS = "columns"                # the draft's own 4-bit weights, summed 8 (or 16) outputs at a time
CANDIDATES = ("bfloat16", "float32", COLUMNS)
OWN = "own"                        # the choice of the draft's own products
ROUNDS = 3                         # reads of each way compared, interleaved (timed_rounds)


class FloatProduct(torch.nn.Module):
    """y = x @ W.T + b in a float dtype, from and to float32: W the weight a quantized product multiplies by."""

    def __init__(self, product: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.weight = product.dequantized().to(dtype)
        self.bias = None if product.bias is None else product.bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


def copies(model: torch.nn.Module, name: str) -> list[dict] | None:
    """Per decoder layer of a quantized model, its products as `name` (a CANDIDATES entry) computes them, as
    decoder.Layer holds them: float copies (the weights its own products multiply by, de-quantised in memory: no file
    is read), or its own 4-bit weights summed 8 outputs at a time. None where the model's products cannot."""
    layers = LlamaForward(model).layers
    products = [p for layer in layers for p in (*layer.attention_in, layer.output, *layer.mlp_in, layer.down)]
    if name == COLUMNS:
        if not all(isinstance(p, Int4Linear) and p.own and p.out_features % 8 == 0 for p in products):
            return None
        make = ColumnsProduct
    elif all(hasattr(p, "dequantized") for p in products):
        make = lambda product: FloatProduct(product, getattr(torch, name))      # noqa: E731
    else:
        return None
    return [{"attention_in": [make(p) for p in layer.attention_in], "output": make(layer.output),
             "mlp_in": [make(p) for p in layer.mlp_in], "down": make(layer.down)}
            for layer in layers]


def reader_of(decoder: LlamaForward, products: list[dict]) -> LlamaForward:
    """A copy of `decoder` (the quantized model's) whose products are `products` (copies() of the same model): what a
    cache given them (backends/own.py) reads long feeds through."""
    reader = copy.copy(decoder)
    reader.layers = [replace(layer, **floats) for layer, floats in zip(decoder.layers, products)]
    # the columns in the C layer loop where the decoder has one (about 15% of a 128-token read spent between the
    # products in Python with AVX512-VNNI); float copies step by step, their products PyTorch's modules
    runs_in_c = decoder.loop is not None and LayerLoop.applies(reader.layers)
    reader.loop = decoder.loop.with_layers(reader.layers) if runs_in_c else None
    return reader


def time_read(model: torch.nn.Module, products: list[dict] | None = None, tokens: int = PROMPT) -> float:
    """Seconds for one read of a `tokens`-token prompt through the draft's layers as a cache of it given `products`
    would read them (its own products where None), its KV cache written as decoding does."""
    decoder = LlamaForward(model)
    reads = decoder if products is None else reader_of(decoder, products)
    vocab = model.get_input_embeddings().weight.shape[0]
    prompt, causal = [(7 * i) % vocab for i in range(tokens)], torch.ones(tokens, tokens, dtype=torch.bool).tril()
    with torch.inference_mode():
        started = perf_counter()
        reads.forward(prompt, list(range(tokens)), causal, 0, decoder.entries(), 1)
        return perf_counter() - started


def timed_rounds(model: torch.nn.Module, ways: dict[str, list[dict] | None], tokens: int = PROMPT) -> dict[str, list]:
    """Each way's seconds (its products, as time_read takes them) for ROUNDS reads, interleaved: a read of each way a
    round, in an order rotated each round, so that the VM's swings from minute to minute hit every way alike. Timed
    way by way (best of 3 each), the 0.5B's own products read 128 tokens in 557 ms and the columns in 640, so the
    draft took its own; interleaved on the same Zen 4 (AVX2 only), the columns won all of 10 rounds, median 589
    against 827 ms."""
    names = list(ways)
    seconds: dict[str, list] = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds[name].append(time_read(model, ways[name], tokens))
    return seconds


def against_own(seconds: dict[str, list], name: str) -> float:
    """The median over rounds of way `name`'s seconds over the own products' in the same round."""
    return median(mine / own for mine, own in zip(seconds[name], seconds[OWN]))


def choose(model: torch.nn.Module, candidates: dict[str, list[dict]] | None = None) -> dict:
    """Time the draft's prompt read through its own products and through each candidate's (`candidates`: their
    copies(), made here where not given), interleaved (timed_rounds); the candidate fastest against the own products
    round by round wins where it is 10% faster than them (the median of its rounds). Returns {"choice": a candidate or
    OWN, "seconds": {name: the median s}}."""
    candidates = candidate_products(model) if candidates is None else candidates
    seconds = timed_rounds(model, {OWN: None, **candidates})
    ratios = {name: against_own(seconds, name) for name in candidates}
    best = min(ratios, key=ratios.get, default=None)
    choice = best if best is not None and ratios[best] < 0.9 else OWN
    chosen = {"choice": choice, "seconds": {name: round(median(s), 4) for name, s in seconds.items()}}
    if choice != OWN:
        chosen["from"] = crossover(model, candidates[choice])
    return chosen


def crossover(model: torch.nn.Module, products: list[dict]) -> int:
    """The fewest tokens from which `products` read faster than the draft's own: the shortest of LENGTHS at which they
    win (round by round, as choose() judges), and at every longer one (timed in turn, the longest first), else PROMPT
    (where they were chosen)."""
    start = PROMPT
    for tokens in reversed(LENGTHS):
        if against_own(timed_rounds(model, {OWN: None, "reader": products}, tokens), "reader") >= 1.0:
            break
        start = tokens
    return start


def candidate_products(model: torch.nn.Module) -> dict[str, list[dict]]:
    """Each candidate's products for this model, where it has them (copies())."""
    made = {name: copies(model, name) for name in CANDIDATES}
    return {name: products for name, products in made.items() if products is not None}


def chooser(model: torch.nn.Module):
    """choose() for this draft as prepare calls it, the candidates' copies made on the first call only: where other
    work spoils a timing, prepare times the same copies again rather than de-quantising the draft anew."""
    made: dict[str, list[dict]] = {}

    def measure() -> dict:
        if not made:
            made.update(candidate_products(model))
        return choose(model, made)
    return measure


def key(draft_name: str, draft_dtype: str) -> str:
    return f"prompt read: {draft_name} ({draft_dtype})"


NAMES = {OWN: "its own products", COLUMNS: "its own weights many outputs at a time"}


def describe(choice: dict) -> str:
    seconds = ", ".join(f"{NAMES.get(name, name)} {s * 1e3:.0f} ms" for name, s in choice["seconds"].items())
    how = NAMES.get(choice["choice"], f"{choice['choice']} copies of its weights")
    start = f", from {choice['from']} tokens" if "from" in choice else ""       # choose() stores it for a reader only
    return f"the draft reads prompts through {how}{start} ({PROMPT} tokens: {seconds})"
