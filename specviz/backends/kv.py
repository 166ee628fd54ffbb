"""A causal LM with its KV cache: feed a tree of tokens, then keep only the accepted path.

The cache always starts with `committed` entries that every new token may attend to. A tree
forward appends one entry per fed token after those (its "slot"); `commit(slots)` then gathers the
chosen slots to sit contiguously after the committed prefix and drops everything else. Cropping
alone would be wrong: accepted nodes need not be a suffix of what was fed.

`KVModel` holds what every backend shares: the counts of committed and pending entries, the forward log and clock,
the output layer where it is computed here (a restricted vocabulary, the engine's products) and what a forward reads.
Each backend feeds tokens and keeps slots its own way: transformers' forward over a dynamic cache (dynamic.py), a
static cache for compiled models (static.py), specviz's own forward of a quantized model (own.py);
`cache.open_cache` picks one.
"""
from __future__ import annotations

import copy
import threading
from time import perf_counter

import torch

from .interface import ForwardLog
from ..cpu.blocks import BlockLinear
from ..cpu.int4 import Int4Linear, is_quantized
from ..cpu.int8 import Int8Linear
from ..cpu.matmul import MAX_ROWS, rows_product

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


CUTS_KEPT = 2      # cut output layers a model keeps: a race's lanes and a bench's repeats of one prompt share one


class _Cuts:
    """One output layer's last CUTS_KEPT cuts, by vocabulary, behind a lock: app sessions make decoders of one shared
    model at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_vocabulary: dict[bytes, object] = {}


def output_rows(layer: torch.nn.Module, ids: torch.Tensor):
    """The output layer for the tokens `ids` only: a quantized layer of those rows, or their float weight rows. The
    last CUTS_KEPT cuts are kept on the layer, as the cut is read-only: cutting a 0.5B draft's 28k rows took 13 ms,
    a percent of a 64-token generation, for every decoder of the same prompt."""
    key = ids.cpu().numpy().tobytes()
    cuts = layer.__dict__.setdefault("_specviz_cuts", _Cuts())      # setdefault: one _Cuts even when threads race
    with cuts.lock:
        kept = cuts.by_vocabulary
        if key not in kept:
            while len(kept) >= CUTS_KEPT:
                kept.pop(next(iter(kept)))
            kept[key] = layer.output_rows(ids) if isinstance(layer, QUANTIZED_HEADS) else layer.weight[ids].contiguous()
        return kept[key]


def restricts_output(layer: torch.nn.Module) -> bool:
    """Whether an output layer can be computed for some tokens only (float and int8 layers, int4 ones on
    specviz's kernel)."""
    return isinstance(layer, (Int8Linear, BlockLinear, torch.nn.Linear)) or \
        (isinstance(layer, Int4Linear) and layer.own)


class KVModel:
    """`output_vocab` (token ids): compute logits for these tokens only and give every other token
    -inf. For a draft trained over a subset of the vocabulary this skips most of its output layer,
    which dominates a small model's cost; its distribution stays a proper one (over the subset)."""
    static_len: int | None = None        # a static cache's entries (static.py)
    fast = False                         # whether the output layer is multiplied by the engine's products

    def __init__(self, model: torch.nn.Module, name: str, output_vocab: torch.Tensor | None = None,
                 scores_here: bool = False):
        """scores_here: compute the output layer here, not by the model (the backend runs a forward of its own)."""
        self.model = model
        self.name = name
        self.device = next(model.parameters()).device
        # what its activations and KV cache hold: float32 for a quantized model, whatever its weights' bytes are
        self.dtype = torch.float32 if is_quantized(model) else next(model.parameters()).dtype
        self.weight_bytes, self.token_bytes = read_bytes(model, output_vocab)    # read per forward, per token
        self.head = None                 # an output layer computed here, not by the model
        self.output_vocab = None
        if scores_here and output_vocab is None:
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
        """An empty cache (a backend makes its own, then calls this)."""
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
            n = len(tokens)
            keep = n if keep is None else keep
            if not 1 <= keep <= n:
                raise ValueError(f"keep must be in [1, {n}], got {keep}")
            return self._feed(tokens, positions, visible, keep)
        finally:
            self.seconds += perf_counter() - started

    def _feed(self, tokens: list[int], positions: list[int], visible: torch.Tensor, keep: int) -> torch.Tensor:
        """The backend's forward: the last `keep` tokens' logits; it logs the feed (_logged)."""
        raise NotImplementedError

    def _logged(self, n: int) -> None:
        self.log.tokens.append(n)
        self.log.kv_entries.append(self.committed + self.pending + n)
        self.pending += n

    @property
    def _body(self):
        """What transformers runs: the model, or its body where the output layer is computed here."""
        return self.model if self.head is None else self.model.base_model

    def _logits(self, out, n: int, keep: int | None = None) -> torch.Tensor:
        """The logits of the last `keep` (default all) of the n real tokens fed, from transformers' output."""
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
        self.cache = copy.deepcopy(other.cache)
        self.committed = other.committed

    def commit(self, slots: list[int]) -> None:
        """Keep the committed prefix plus the given tree slots, in order. A slot is a position among the
        entries fed since the last commit (0-based after the prefix): the engine feeds a tree's nodes in
        id order, so node n sits in slot n - 1 and the accepted path's node ids give the slots to keep."""
        self._keep(slots)
        self.committed += len(slots)
        self.pending = 0

    def _keep(self, slots: list[int]) -> None:
        """The backend's commit: keep the prefix and these slots in its cache."""
        raise NotImplementedError
