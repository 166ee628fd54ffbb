"""A causal LM with its KV cache: feed a tree of tokens, then keep only the accepted path.

The cache always starts with `committed` entries that every new token may attend to. A tree
forward appends one entry per fed token after those (its "slot"); `commit(slots)` then gathers the
chosen slots to sit contiguously after the committed prefix and drops everything else. Cropping
alone would be wrong: accepted nodes need not be a suffix of what was fed.

The static mode (for torch.compile and CUDA graphs, which need fixed shapes and fixed addresses)
preallocates `static_len` entries, pads each feed to a bucket size, attends over the whole buffer
under a mask, and commits by moving the chosen slots in place.
"""
from __future__ import annotations

import copy
import functools
import inspect
from time import perf_counter

import torch

from .backend import BUCKETS, ForwardLog, bucket
from .cpu.matmul import MAX_ROWS, engine_products, install, rows_product
from .cpu.decoder import LlamaForward
from .cpu.decoder import supported as decoder_supports
from .cpu.prompt_reader import READ_ROWS, reader_of
from .cpu.blocks import BlockLinear
from .cpu.int4 import Int4Linear, is_quantized
from .cpu.int8 import Int8Linear

# output layers whose rows for a vocabulary are a layer of their own
QUANTIZED_HEADS = (Int8Linear, Int4Linear, BlockLinear)


def cache_layers(cache) -> list:
    """transformers' per-layer cache objects (each with `keys` and `values` tensors [batch, heads,
    entries, dim]; a static one also with `cumulative_length`): the one place this module reaches
    into transformers' cache internals (transformers 5.x)."""
    return cache.layers


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's weights in memory (a tied weight counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def read_bytes(model: torch.nn.Module, output_vocab: torch.Tensor | None = None) -> tuple[int, int]:
    """What one forward reads of the weights: (bytes read however many tokens are fed, bytes per token
    fed). An input embedding that is not tied to the output layer is read a row per token, not whole;
    with `output_vocab` the output layer is read for those tokens' rows only."""
    once, per_token = parameter_bytes(model), 0
    embedding, output = model.get_input_embeddings().weight, model.get_output_embeddings()
    if embedding is not getattr(output, "weight", None):      # untied (or a 4-bit output layer)
        once -= embedding.numel() * embedding.element_size()
        per_token = embedding.shape[1] * embedding.element_size()
    if output_vocab is not None:
        rows = output.out_features
        once -= (rows - len(output_vocab)) * parameter_bytes(output) // rows
    return once, per_token


def output_rows(layer: torch.nn.Module, ids: torch.Tensor):
    """The output layer for the tokens `ids` only: a quantized layer of those rows, or their float weight rows."""
    return layer.output_rows(ids) if isinstance(layer, QUANTIZED_HEADS) else layer.weight[ids].contiguous()


def restricts_output(layer: torch.nn.Module) -> bool:
    """Whether an output layer can be computed for some tokens only (float and int8 layers, int4 ones on
    specviz's kernel)."""
    return isinstance(layer, (Int8Linear, BlockLinear, torch.nn.Linear)) or \
        (isinstance(layer, Int4Linear) and layer.own)


class KVModel:
    """A backend (specviz/backend.py) for transformers' models and specviz's CPU forwards.

    `output_vocab` (token ids): compute logits for these tokens only and give every other token
    -inf. For a draft trained over a subset of the vocabulary this skips most of its output layer,
    which dominates a small model's cost; its distribution stays a proper one (over the subset)."""

    def __init__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None,
                 static_len: int | None = None, compiled=None, prompt_products: list[dict] | None = None):
        """static_len: preallocate a static cache of this many entries. compiled: a compiled copy
        of the model (or of its body, with output_vocab) for bucket-sized feeds; needs static_len.
        prompt_products: a quantized draft's products for long committed feeds (prompt_reader.copies)."""
        if compiled is not None and static_len is None:
            raise ValueError("a compiled model needs a static cache (static_len)")
        self.model = model
        self.static_len = static_len
        self.compiled = compiled
        self.name = name
        self.device = next(model.parameters()).device
        # what its activations and KV cache hold: float32 for a quantized model, whatever its weights' bytes are
        self.dtype = torch.float32 if is_quantized(model) else next(model.parameters()).dtype
        self.weight_bytes, self.token_bytes = read_bytes(model, output_vocab)    # read per forward, per token
        self.fast = compiled is None and install(model)     # see specviz/cpu/matmul.py
        # a quantized Llama-family model runs its own forward (specviz/cpu/decoder.py), with its own KV cache
        own = static_len is None and compiled is None and decoder_supports(model)
        self.decoder = LlamaForward(model) if own else None
        # long committed feeds (a prompt read) through other products of its layers, where given (prompt_reader.py)
        self.reader = reader_of(self.decoder, prompt_products) \
            if self.decoder is not None and prompt_products is not None else None
        self.head = None                 # an output layer computed here, not by the model
        self.output_vocab = None
        if (self.fast or self.decoder is not None) and output_vocab is None:
            layer = model.get_output_embeddings()
            self.head = layer if isinstance(layer, QUANTIZED_HEADS) else layer.weight
        elif output_vocab is not None:
            self.output_vocab = output_vocab.to(self.device)
            self.head = output_rows(model.get_output_embeddings(), self.output_vocab)
        config = model.config
        layers = getattr(config, "num_hidden_layers", None) or config.n_layer
        heads = getattr(config, "num_attention_heads", None) or config.n_head
        self.kv_heads = getattr(config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.kv_bytes_per_entry = 2 * layers * self.kv_heads * self.head_dim * self.dtype.itemsize
        self.log = ForwardLog()
        self.seconds = 0.0           # spent in forward() since this cache was made, prompt reads included
        self.reset()

    def costs(self) -> tuple[int, int, int]:
        """(weight bytes read per forward, KV bytes per cached entry, weight bytes per token fed)."""
        return self.weight_bytes, self.kv_bytes_per_entry, self.token_bytes

    def reset(self) -> None:
        from transformers import DynamicCache, StaticCache
        if self.decoder is not None:
            self.cache = self.decoder.entries()
        elif self.static_len is None:
            self.cache = DynamicCache(config=self.model.config)
        elif isinstance(getattr(self, "cache", None), StaticCache):
            self.cache.reset()      # zeroed in place: CUDA graphs keep reading the addresses they recorded
        else:
            self.cache = StaticCache(config=self.model.config, max_cache_len=self.static_len)
            self.cache.early_initialization(1, self.kv_heads, self.head_dim, self.dtype, self.device)
        self.committed = 0          # cache entries that are committed tokens
        self.pending = 0            # tree entries fed since the last commit

    @property
    def length(self) -> int:
        return self.committed + self.pending

    def forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor,
                keep: int | None = None) -> torch.Tensor:
        """Feed tokens; return their logits [n, vocab], or the last `keep` tokens' logits only.

        visible: bool [n, pending + n], which uncommitted entries (earlier tree slots and the new
        tokens themselves) each new token attends to; the committed prefix is always visible.
        keep: the output layer multiplies only these rows, as transformers' generate does with
        `logits_to_keep` (a prompt's other rows are never read: 0.55 s of the 1.5B's 130-token read here).
        """
        started = perf_counter()
        try:
            return self._forward(tokens, positions, visible, keep)
        finally:
            self.seconds += perf_counter() - started

    def _forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor,
                 keep: int | None) -> torch.Tensor:
        n = len(tokens)
        keep = n if keep is None else keep
        if not 1 <= keep <= n:
            raise ValueError(f"keep must be in [1, {n}], got {keep}")
        if self.static_len is not None:
            return self._static_forward(tokens, positions, visible)[-keep:]
        if self.decoder is not None:
            decoder = self.reader if self.reader is not None and n >= READ_ROWS else self.decoder
            hidden = decoder.forward(tokens, positions, visible, self.committed, self.cache, keep)
            self._logged(n)
            return self._scores(hidden)
        ids = torch.tensor([tokens], device=self.device)
        pos = torch.tensor([positions], device=self.device)
        rows = {"logits_to_keep": keep} if self.head is None and self._keeps_logits else {}
        with engine_products(self.fast):
            out = self._body(input_ids=ids, position_ids=pos, attention_mask=self._mask(visible),
                             past_key_values=self.cache, use_cache=True, **rows)
        self._logged(n)
        return self._logits(out, n, keep)

    @functools.cached_property
    def _keeps_logits(self) -> bool:
        """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs do)."""
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    @property
    def _body(self):
        return self.model if self.head is None else self.model.base_model

    def _logged(self, n: int) -> None:
        self.log.tokens.append(n)
        self.log.kv_entries.append(self.committed + self.pending + n)
        self.pending += n

    def _logits(self, out, n: int, keep: int | None = None) -> torch.Tensor:
        """The logits of the last `keep` (default all) of the n real tokens fed."""
        rows = n if keep is None else keep
        if self.head is None:
            return out.logits[0, :n][-rows:]
        return self._scores(out.last_hidden_state[0, n - rows:n])

    def _scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer computed here: logits [rows, vocab] of final hidden states [rows, hidden]."""
        rows = hidden.shape[0]
        if isinstance(self.head, QUANTIZED_HEADS):
            scores = self.head(hidden)
        else:
            scores = rows_product(self.head, hidden) if self.fast and rows <= MAX_ROWS else hidden @ self.head.T
        if self.output_vocab is None:
            return scores
        logits = torch.full((rows, self.model.config.vocab_size), float("-inf"), dtype=self.dtype, device=self.device)
        logits.index_copy_(1, self.output_vocab, scores)     # as logits[:, vocab] = scores, in two thirds of the time
        return logits

    def _static_forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor) -> torch.Tensor:
        """Pad the feed to its bucket (pad tokens repeat the last one and see only the prefix and
        themselves), write it after the cache's length, then set the length past the real tokens:
        the next feed overwrites the padding, and the mask never shows it."""
        n, size = len(tokens), bucket(len(tokens))
        start = self.committed + self.pending
        if start + size > self.static_len:
            raise ValueError(f"{self.name}: {start + size} cache entries needed, the static cache holds "
                             f"{self.static_len}")
        allowed = torch.zeros(size, self.static_len, dtype=torch.bool)
        allowed[:, :self.committed] = True
        allowed[:n, self.committed:start + n] = visible
        pads = torch.arange(n, size)
        allowed[pads, start + pads] = True
        ids = torch.tensor([tokens + tokens[-1:] * (size - n)], device=self.device)
        pos = torch.tensor([positions + positions[-1:] * (size - n)], device=self.device)
        run = self.compiled if self.compiled is not None and size in BUCKETS else self._body
        if run is self.compiled:    # a new step for CUDA graphs: earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        out = run(input_ids=ids, position_ids=pos, attention_mask=self._additive(allowed),
                  past_key_values=self.cache, use_cache=True)
        self._logged(n)
        self._set_length(self.committed + self.pending)
        logits = self._logits(out, n)
        # CUDA graphs write every replay's output into the same memory, and a drafter keeps the logits
        # of earlier feeds for later levels: keep a copy, not a view of the graph's output
        return logits.clone() if run is self.compiled else logits

    def compile_buckets(self) -> None:
        """Feed every bucket size once, so the compiled model compiles now rather than mid-run."""
        self.feed_committed([0])
        for size in BUCKETS:
            self.forward([0] * size, [1] * size, torch.ones(size, size, dtype=torch.bool).tril())
            self.commit([])

    def _set_length(self, length: int) -> None:
        for layer in cache_layers(self.cache):
            layer.cumulative_length.fill_(length)

    def _mask(self, visible: torch.Tensor) -> torch.Tensor | None:
        """Additive float mask [1, 1, n, cache + n] (eager attention adds it, so it cannot be
        boolean), or None when it would be plain causal: then attention takes its fast path
        (no mask tensor, and no copy of the KV heads for grouped-query attention)."""
        n = visible.shape[0]
        if torch.equal(visible, torch.ones(visible.shape, dtype=torch.bool).tril(self.pending)):
            return None
        allowed = torch.ones(n, self.committed + self.pending + n, dtype=torch.bool)
        allowed[:, self.committed:] = visible
        return self._additive(allowed)

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """[1, 1, n, entries] float mask: 0 where allowed, the dtype's minimum elsewhere."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device)

    def read_prompt(self, prompt_ids: list[int]) -> None:
        """Feed a prompt but its last token, which the first round feeds; the prompt's logits are never read."""
        if len(prompt_ids) > 1:
            self.feed_committed(prompt_ids[:-1], keep=1)

    def feed_committed(self, tokens: list[int], keep: int | None = None) -> torch.Tensor:
        """Feed tokens that are already part of the output (causal); they join the committed prefix.
        keep: return the last `keep` tokens' logits only (see forward)."""
        assert self.pending == 0, "commit the tree before feeding committed tokens"
        n = len(tokens)
        logits = self.forward(tokens, list(range(self.committed, self.committed + n)),
                              torch.ones(n, n, dtype=torch.bool).tril(), keep)
        self.committed += n
        self.pending = 0
        return logits

    def copy_committed(self, other: KVModel) -> None:
        """Start from a copy of another KVModel's committed entries (the same model, dynamic caches)."""
        assert other.model is self.model and other.pending == 0 and self.length == 0 and self.static_len is None
        self.cache = other.cache.copy() if self.decoder is not None else copy.deepcopy(other.cache)
        self.committed = other.committed

    def commit(self, slots: list[int]) -> None:
        """Keep the committed prefix plus the given tree slots, in order. A slot is a position among the
        entries fed since the last commit (0-based after the prefix): the engine feeds a tree's nodes in
        id order, so node n sits in slot n - 1 and the accepted path's node ids give the slots to keep."""
        if self.decoder is not None:
            self.cache.keep(self.committed, slots)
        elif self.static_len is not None:
            self._keep_static(slots)
        else:
            self._keep_dynamic(slots)
        self.committed += len(slots)
        self.pending = 0

    def _keep_static(self, slots: list[int]) -> None:
        """Move the kept entries down in place: a static cache keeps its addresses (CUDA graphs read them)."""
        end = self.committed + len(slots)
        if slots != list(range(len(slots))):
            index = torch.tensor([self.committed + s for s in slots], device=self.device)
            for layer in cache_layers(self.cache):
                layer.keys[:, :, self.committed:end] = layer.keys[:, :, index]
                layer.values[:, :, self.committed:end] = layer.values[:, :, index]
        self._set_length(end)

    def _keep_dynamic(self, slots: list[int]) -> None:
        """Cut the tensors to the kept entries (a view when the slots are a chain from the start)."""
        if slots == list(range(len(slots))):
            keep = slice(0, self.committed + len(slots))

            def select(t: torch.Tensor) -> torch.Tensor:
                return t[:, :, keep]
        else:
            index = torch.tensor(list(range(self.committed)) + [self.committed + s for s in slots], device=self.device)

            def select(t: torch.Tensor) -> torch.Tensor:
                return t.index_select(-2, index)
        for layer in cache_layers(self.cache):
            layer.keys, layer.values = select(layer.keys), select(layer.values)
