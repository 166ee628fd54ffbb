"""A quantized Llama-family model's forward (Llama, Qwen2, SmolLM2) run without transformers' modules.

On a 2-core CPU a one-token forward of the Qwen2.5-Coder-1.5B in 4 bits spent about 30 ms in its
products and 24 ms around them through transformers: module calls, a KV cache that grows by
concatenation (every entry copied on every token), a mask turned into index lists, and SDPA called
once per query row. Here each layer is the few tensor operations it needs, over a KV cache
allocated ahead, and attention is one C call for all rows (row_attention.c): each row over exactly
the entries it sees, in cache order, with no entry copied.

Every step computes a row alone (products: c/rows_kernel.c, c/blocks.c; norms, rotary and activations element-wise
or along a row; attention: row_attention.c), so a tree's forward gives each token the same bits as
plain decoding gives it. The weights are the model's own modules (the quantized linear layers and
their stacked siblings, the norms' weights, the rotary frequencies): nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import kernels
from .int4 import is_quantized
from .layer_loop import LayerLoop

FAMILIES = ("llama", "qwen2")
_START_CAPACITY = 256            # KV entries first allocated; doubled as needed


@dataclass
class Layer:
    input_norm: torch.Tensor
    # q, k, v's products (or their stacked one): hidden -> [n, (heads + 2 kv_heads) * head_dim]
    attention_in: list
    output: torch.nn.Module
    post_norm: torch.Tensor
    mlp_in: list                 # gate, up's products (or their stacked one): hidden -> [n, 2 * intermediate]
    down: torch.nn.Module


def _siblings(module: torch.nn.Module, stacked: str, names: tuple[str, ...]) -> list:
    """The siblings' products: their stacked layer (specviz/cpu/shared_input.py), else each."""
    return [getattr(module, stacked).layer] if hasattr(module, stacked) else [getattr(module, name) for name in names]


def _side_by_side(products: list, x: torch.Tensor) -> torch.Tensor:
    return products[0](x) if len(products) == 1 else torch.cat([p(x) for p in products], -1)


def supported(model: torch.nn.Module) -> bool:
    """A quantized model of a family this forward runs, with plain rotary embeddings and full attention, where
    specviz's kernels run."""
    config = model.config
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    return (is_quantized(model) and kernels.available() and config.model_type in FAMILIES
            and getattr(config, "hidden_act", "silu") == "silu" and rope in ("default", "linear", "llama3")
            and all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())
            and getattr(config, "pretraining_tp", 1) == 1
            and (config.head_dim if getattr(config, "head_dim", None)
                 else config.hidden_size // config.num_attention_heads) % 8 == 0)


class Entries:
    """The KV cache: per layer keys and values [kv_heads, capacity, head_dim], of which the first `length`
    are in use (the caller keeps the count)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = _START_CAPACITY):
        self.keys = torch.zeros(layers, kv_heads, capacity, head_dim)
        self.values = torch.zeros_like(self.keys)

    def reserve(self, length: int, needed: int) -> None:
        """Room for `needed` entries, keeping the first `length`."""
        capacity = self.keys.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
            new[:, :, :length] = old[:, :, :length]
            setattr(self, name, new)

    def keep(self, committed: int, slots: list[int]) -> None:
        """Move the entries at committed + slot (in the given order) to follow the committed ones."""
        if slots == list(range(len(slots))):
            return
        index = torch.tensor([committed + s for s in slots])
        for t in (self.keys, self.values):
            t[:, :, committed:committed + len(slots)] = t[:, :, index]

    def copy(self) -> "Entries":
        other = Entries.__new__(Entries)
        other.keys, other.values = self.keys.clone(), self.values.clone()
        return other


class LlamaForward:
    """The model's own forward, without transformers' modules (see the module's docstring): forward(tokens,
    positions, visible, committed, entries) -> the final hidden states, each row alone."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> "LlamaForward | None":
        """The model's own forward where this runs it (`supported`), else None: one question for the backend that
        chooses, so that opening a cache reads this module once."""
        return cls(model) if supported(model) else None

    def __init__(self, model: torch.nn.Module):
        self.model = model
        config, body = model.config, model.model
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embedding = body.embed_tokens
        self.final_norm = body.norm.weight
        self.inv_freq, self.rope_scale = body.rotary_emb.inv_freq.float(), body.rotary_emb.attention_scaling
        self.layers = [Layer(layer.input_layernorm.weight,
                             _siblings(layer.self_attn, "q_k_v_stacked", ("q_proj", "k_proj", "v_proj")),
                             layer.self_attn.o_proj, layer.post_attention_layernorm.weight,
                             _siblings(layer.mlp, "gate_up_stacked", ("gate_proj", "up_proj")), layer.mlp.down_proj)
                       for layer in body.layers]
        self.scale = self.head_dim ** -0.5
        # quantized layers run in one C call per forward (layer_loop.c); other layers step by step below
        self.loop = LayerLoop(self.layers, config.hidden_size, config.intermediate_size, self.heads, self.kv_heads,
                              self.head_dim, self.eps, self.scale) if LayerLoop.applies(self.layers) else None

    def entries(self) -> Entries:
        return Entries(len(self.layers), self.kv_heads, self.head_dim)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [n, 1, head_dim], as transformers' rotary embedding computes them."""
        freqs = positions[:, None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), -1)[:, None]
        return angles.cos() * self.rope_scale, angles.sin() * self.rope_scale

    def forward(self, tokens: list[int], positions: list[int], visible: torch.Tensor, committed: int,
                entries: Entries, keep: int) -> torch.Tensor:
        """Feed tokens after `committed` + visible.shape[1] - n cache entries (their keys and values are written
        there); visible: bool [n, cols], which uncommitted entries each token sees. Returns the last `keep`
        rows' final hidden states [keep, hidden]."""
        n, start = len(tokens), committed + visible.shape[1] - len(tokens)
        entries.reserve(start, start + n)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        cos, sin = self._rotary(torch.tensor(positions))
        x = self.embedding(torch.tensor(tokens)).float()
        if self.loop is not None:
            x = self.loop.run(x, cos[:, 0], sin[:, 0], entries.keys, entries.values, start, visible, committed)
            return kernels.rms_norm(x[n - keep:], self.final_norm, self.eps)
        for i, layer in enumerate(self.layers):
            h = kernels.rms_norm(x, layer.input_norm, self.eps)
            qkv = _side_by_side(layer.attention_in, h)
            qk = qkv[:, :(heads + kv_heads) * dim].view(n, heads + kv_heads, dim)
            low, high = qk.chunk(2, -1)
            qk = qk * cos + torch.cat((-high, low), -1) * sin
            entries.keys[i, :, start:start + n] = qk[:, heads:].transpose(0, 1)
            entries.values[i, :, start:start + n] = \
                qkv[:, (heads + kv_heads) * dim:].view(n, kv_heads, dim).transpose(0, 1)
            attended = kernels.attend(qk[:, :heads], entries.keys[i], entries.values[i], visible, committed, self.scale)
            x = x + layer.output(attended.view(n, heads * dim))
            h = kernels.rms_norm(x, layer.post_norm, self.eps)
            gate, up = _side_by_side(layer.mlp_in, h).chunk(2, -1)
            x = x + layer.down(F.silu(gate) * up)
        return kernels.rms_norm(x[n - keep:], self.final_norm, self.eps)
