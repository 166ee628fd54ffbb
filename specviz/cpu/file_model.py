"""A GGUF file's own model (`--dtype gguf`): its quantized blocks, memory-mapped and multiplied where they lie.

transformers builds the architecture from the file's metadata; then every linear layer is a `BlockLinear` over its
tensor's blocks, the input embedding a `BlockEmbedding`, and the norms and biases the file's float32 tensors. No
weight is de-quantised or copied but a Llama's q and k rows, which llama.cpp's converter reorders for its rotary
layout and which are put back in transformers' order here (whole rows of blocks move; their bytes do not change).

Making a tokenizer of a file's 152k-token vocabulary takes a few seconds (specviz/cpu/gguf_metadata.py), so the first
read keeps the file's config, tokenizer and table of tensors (name, type, shape, where its bytes lie) in the user
cache; later loads map the file and are ready in about a second.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from . import gguf_metadata, reference
from .blocks import GGUF, TYPES, BlockEmbedding, BlockLinear
from .int4 import mark_precision
from .. import cache_dir
from .row_attention import use_row_attention

FAMILIES = ("llama", "qwen2")                # the architectures whose tensors are named below
LINEAR = {"attn_q": ("self_attn", "q_proj"), "attn_k": ("self_attn", "k_proj"), "attn_v": ("self_attn", "v_proj"),
          "attn_output": ("self_attn", "o_proj"), "ffn_gate": ("mlp", "gate_proj"), "ffn_up": ("mlp", "up_proj"),
          "ffn_down": ("mlp", "down_proj")}
NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


class FileModelError(ValueError):
    """A GGUF file the `gguf` precision cannot read as it is; the message is one line."""


def metadata_dir(path: Path) -> Path:
    """Where the file's config, tokenizer and table of tensors are kept once read (a few MB)."""
    return cache_dir() / "gguf_meta" / f"{path.stem}-{path.stat().st_size}"


TABLE = "tensors.json"


def read_metadata(path: Path) -> Path:
    """The file's metadata directory, read from the file and kept on first use."""
    kept = metadata_dir(path)
    if (kept / TABLE).is_file():
        return kept
    try:
        header = gguf_metadata.read_header(path)
    except gguf_metadata.HeaderError as exc:
        raise FileModelError(str(exc)) from None
    if header.architecture not in FAMILIES:
        raise FileModelError(f"{path.name} is a {header.architecture} model; the gguf precision reads "
                             f"{', '.join(FAMILIES)} files (use --dtype float32)")
    config = gguf_metadata.config_of(header)
    scratch = kept.with_name(f"{kept.name}.tmp{os.getpid()}")
    config.save_pretrained(scratch)
    gguf_metadata.tokenizer_of(path, config).save_pretrained(scratch)
    (scratch / TABLE).write_text(json.dumps(header.tensors))
    kept.parent.mkdir(parents=True, exist_ok=True)
    if kept.is_dir() and not (kept / TABLE).is_file():      # left by an interrupted or older read
        shutil.rmtree(kept, ignore_errors=True)
    try:
        os.replace(scratch, kept)
    except OSError:                  # another process kept it first; its copy is as good
        shutil.rmtree(scratch, ignore_errors=True)
    return kept


def tensors(path: Path) -> dict[str, tuple[int, np.ndarray]]:
    """name -> (ggml type, its data as a read-only view of the mapped file)."""
    table = json.loads((read_metadata(path) / TABLE).read_text())
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    return {name: (t["type"], mapped[t["offset"]:t["offset"] + t["bytes"]].view(t["dtype"]).reshape(t["shape"]))
            for name, t in table.items()}


def config_and_tokenizer(path: Path):
    """The file's transformers config and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    kept = read_metadata(path)
    return AutoConfig.from_pretrained(str(kept)), AutoTokenizer.from_pretrained(str(kept))


def rotary_order(rows: int, heads: int) -> np.ndarray:
    """The file's row for each of transformers' rows of a Llama's q or k weight (llama.cpp's converter interleaves each
    head's two rotary halves; transformers' GGUF loader undoes it the same way)."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def load(path: Path):
    """(model, tokenizer) of a GGUF file, its linear layers on the file's blocks."""
    from transformers import AutoModelForCausalLM

    config, tokenizer = config_and_tokenizer(path)
    if config.model_type not in FAMILIES:
        raise FileModelError(f"{path.name} is a {config.model_type} model; the gguf precision reads "
                             f"{', '.join(FAMILIES)} files (use --dtype float32)")
    stored = tensors(path)

    def array(name: str) -> np.ndarray:
        if name not in stored:
            raise FileModelError(f"{path.name} has no tensor {name}")
        return stored[name][1]

    def floats(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(array(name), dtype=np.float32))

    def blocks(name: str, order: np.ndarray | None = None) -> tuple[int, torch.Tensor]:
        qtype = stored[name][0] if name in stored else None
        if qtype not in TYPES:
            import gguf
            kind = gguf.GGMLQuantizationType(qtype).name if name in stored else "missing"
            raise FileModelError(f"{path.name}: {name} is {kind}; the gguf precision reads {', '.join(TYPES.values())} "
                                 "blocks (use --dtype float32)")
        data = array(name) if order is None else np.ascontiguousarray(array(name)[order])
        with warnings.catch_warnings():          # a read-only view of the file: nothing ever writes to it
            warnings.simplefilter("ignore", UserWarning)
            return qtype, torch.from_numpy(data)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    body = model.model
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for i, layer in enumerate(body.layers):
        for short, (part, name) in LINEAR.items():
            key = f"blk.{i}.{short}"
            order = None
            if config.model_type == "llama" and short in ("attn_q", "attn_k"):
                order = rotary_order(array(f"{key}.weight").shape[0], heads if short == "attn_q" else kv_heads)
            qtype, data = blocks(f"{key}.weight", order)
            module = getattr(layer, part)
            bias = floats(f"{key}.bias") if getattr(module, name).bias is not None else None
            setattr(module, name, BlockLinear(qtype, data, getattr(module, name).in_features, bias))
        for short, name in NORMS.items():
            getattr(layer, name).weight = torch.nn.Parameter(floats(f"blk.{i}.{short}.weight"), requires_grad=False)
    body.norm.weight = torch.nn.Parameter(floats("output_norm.weight"), requires_grad=False)
    qtype, data = blocks("token_embd.weight")
    body.embed_tokens = BlockEmbedding(qtype, data, config.hidden_size)
    if "output.weight" in stored:
        model.lm_head = BlockLinear(*blocks("output.weight"), config.hidden_size)
    else:                                        # tied: the output layer reads the embedding's blocks
        model.lm_head = BlockLinear(qtype, body.embed_tokens.weight, config.hidden_size)
    body.rotary_emb = type(body.rotary_emb)(config=config)           # its frequencies, computed on the CPU
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FileModelError(f"{path.name}: no tensor in the file for {', '.join(left[:3])}")
    model.eval()
    use_row_attention(model)
    mark_precision(model, GGUF)
    return model, tokenizer


def requantizable(loaded):
    """The model with each BlockLinear a float32 nn.Linear of the weights its blocks hold (as the `gguf` package
    de-quantises them), to be re-quantised by specviz/cpu/int4.py or int8.py: one layer at a time, in memory."""
    for parent in list(loaded.model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, BlockLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                         device="meta")
                linear.weight = torch.nn.Parameter(child.dequantized(), requires_grad=False)
                if child.bias is not None:
                    linear.bias = torch.nn.Parameter(child.bias.detach().clone(), requires_grad=False)
                setattr(parent, name, linear)
    return loaded


def random_blocks(model: torch.nn.Module, qtype: int = reference.Q4_K, seed: int = 0) -> torch.nn.Module:
    """A model's linear layers replaced by random blocks of `qtype` of their shapes (a Q4_K_M file is mostly Q4_K),
    marked as a `gguf` model: for timing its products (precision.probe_seconds), whatever the blocks hold."""
    rng = np.random.default_rng(seed)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                blocks = torch.from_numpy(reference.random_blocks(qtype, child.out_features, child.in_features, rng))
                bias = None if child.bias is None else child.bias.detach().float().clone()
                setattr(parent, name, BlockLinear(qtype, blocks, child.in_features, bias))
    use_row_attention(model)
    mark_precision(model, GGUF)
    return model
