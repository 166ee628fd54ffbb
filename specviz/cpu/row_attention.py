"""Attention one query at a time, so that a token's result never depends on what is fed with it.

Speculation is exact when verifying a token computes what plain decoding would have computed for
it. In float32 the differences between a one-token forward and a tree forward are rounding in the
last bits, too small to move an argmax in practice. A model whose linear layers round their inputs
to bfloat16 (specviz/cpu/int4.py) amplifies them: an input that lands on the other side of a bfloat16
rounding boundary moves by a whole bfloat16 step, and greedy outputs then differ now and then
(1 of 4 HumanEval prompts over 64 tokens with the Qwen2.5-Coder pair in int4).

Its 4-bit products are computed row by row (bit for bit the same whether a row comes alone or with
15 others), and so are norms, rotary embeddings and activations; attention is the one place where
tokens fed together meet. Here each query row attends alone, over exactly the cache entries it may
see, gathered into a tensor of the same shape plain decoding would give it, through the same SDPA
call: a tree forward then computes every token's logits bit for bit as plain decoding does.
Feeds longer than MAX_ROWS (a prompt, which every strategy feeds alike) take SDPA at once.

A quantized Llama-family model does not come here: specviz/cpu/decoder.py runs its forward, with the same rule
in C (row_attention.c) and without copying any entry. This serves the other families, and machines where
specviz's kernels do not build.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "specviz_rows"
MAX_ROWS = 64


def visible_entries(attention_mask: torch.Tensor | None, rows: int, entries: int) -> torch.Tensor:
    """bool [rows, entries]: which cache entries each new token sees. No mask: causal, aligned to the
    end (the new tokens are the last `rows` entries)."""
    if attention_mask is None:
        return torch.ones(rows, entries, dtype=torch.bool).tril(entries - rows)
    mask = attention_mask[0, 0, :, :entries]
    return (mask if mask.dtype == torch.bool else mask == 0).cpu()


def row_attention(module, query, key, value, attention_mask, **kwargs):
    rows, entries = query.shape[2], key.shape[2]
    if rows > MAX_ROWS or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    visible = visible_entries(attention_mask, rows, entries)
    outputs = []
    for row in range(rows):
        seen = visible[row].nonzero().squeeze(-1)
        if len(seen) == entries:
            k, v = key, value
        else:
            seen = seen.to(key.device)
            k, v = key.index_select(2, seen), value.index_select(2, seen)
        out, _ = sdpa_attention_forward(module, query[:, :, row:row + 1], k.contiguous(), v.contiguous(), None,
                                        **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(NAME, row_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_row_attention(model: torch.nn.Module) -> None:
    model.set_attn_implementation(NAME)
