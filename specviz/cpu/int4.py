"""Linear layers with 4-bit weights, for a model run on a CPU.

Decoding reads every weight once per forward, so on a small CPU a forward of a few tokens costs
what reading the weights costs. Stored in 4 bits (groups of 32 weights along the input, each with a
bfloat16 scale and offset, as GGUF's Q4 formats store them; a draft's groups are 64 wide: see WIDE_GROUP),
a model's linear layers are multiplied
by specviz's own kernel (`specviz/cpu/c/rows_kernel.c`, `rows_matmul_q4`): each input row rounded to int8 on one
scale per 256 values, as llama.cpp's Q8_K does, and integer dot products (VNNI where the CPU has it). On a
2-core AVX512 machine it reads a Qwen2.5-Coder-1.5B's 4-bit layers at about 37 GB/s for one token,
against about 17 GB/s for PyTorch's own `_weight_int4pack_mm_for_cpu`. Where the kernel cannot run
(no AVX2 or no C compiler) the layer takes PyTorch's kernel, which computes in bfloat16: the same
weights, another numerical model (`kernel()` says which). Only the linear layers change: embeddings,
norms and attention keep float32.

A draft's precision moves acceptance only, never the output, so a draft may always take this. A
target in `int4` is a different numerical model from the same target in float32: the exactness
promise is then against our baseline in `int4`, and holds bit for bit because both kernels compute
each row alone and an int4 model attends one token at a time (specviz/cpu/decoder.py,
specviz/cpu/row_attention.py).
"""
from __future__ import annotations

import torch

from . import build, kernels

GROUP = build.CONSTANTS["Q4_GROUP"]     # weights per scale and offset (GGUF's Q4_0/Q4_1/Q4_K blocks are 32 wide)
# A draft's: 4.5 bits a weight instead of 5, so a tenth less to read in each of its forwards (on 2 cores they are
# memory-bound). Staged on HumanEval/57-65 and 120-123 (64 greedy tokens) took 73 and 55 rounds with the 0.5B
# draft's groups 64 wide, 75 and 54 with 32, 84 and more with 128. A draft's precision moves acceptance only.
WIDE_GROUP = build.CONSTANTS["Q4_WIDE_GROUP"]
BLOCK = GROUP                           # the kernel's unit: weights packed and inputs rounded per 32 (c/rows_kernel.c)
TILE = build.CONSTANTS["Q4_TILE"]       # output rows the kernel reads as one stream (c/rows_kernel.c)
CHUNK = build.CONSTANTS["Q4_CHUNK"]     # blocks whose scales the kernel reads at once
INT4 = "int4"                 # the precision's name (`--dtype int4`)
_MARK = "_specviz_quantized"


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + b with W in 4-bit groups (32 or, on specviz's kernel, WIDE_GROUP inputs):
    w = (q - 8) * scale + zero, q in 0..15."""

    def __init__(self, linear: torch.nn.Linear, group: int = GROUP):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.own = kernels.rows_available() and self.in_features % (2 * BLOCK) == 0 and self.out_features % TILE == 0
        self.group = group if self.own else GROUP           # torch's kernel keeps groups of 32
        q, scale, zero = groups(linear.weight.detach(), self.group)
        self.kept = self.out_features           # outputs returned (output_rows pads the rows to whole tiles)
        if self.own:
            self.packed, self.scales, self.zeros = map(_frozen, tiled(q, scale, zero))
        else:
            self.packed = _frozen(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
            self.scales_and_zeros = _frozen(torch.stack([scale, zero], -1).permute(1, 0, 2).contiguous())
        self.bias = None if linear.bias is None else _frozen(linear.bias.detach().clone())

    def output_rows(self, ids: torch.Tensor) -> "Int4Linear":
        """A layer computing only the outputs `ids` (a draft's output vocabulary: specviz/backends/choose.py); specviz's
        kernel only (restricts_output)."""
        rows = torch.cat([ids, ids[-1:].repeat(-len(ids) % TILE)])         # whole tiles: the last row again
        per_chunk = chunk_values(self.group)
        return Int4Linear.of_tiles((retiled(self.packed, rows, BLOCK), retiled(self.scales, rows, per_chunk),
                                    retiled(self.zeros, rows, per_chunk)),
                                   self.in_features, len(ids), None if self.bias is None else self.bias[ids].clone(),
                                   self.group)

    @classmethod
    def of_tiles(cls, tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor], in_features: int, kept: int,
                 bias: torch.Tensor | None, group: int = GROUP) -> "Int4Linear":
        """A layer on specviz's kernel from tiled()'s (packed, scales, zeros) of `group`; it returns its first `kept`
        outputs."""
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.in_features, layer.out_features, layer.kept, layer.own = in_features, tiles[0].shape[0], kept, True
        layer.group = group
        layer.packed, layer.scales, layer.zeros = map(_frozen, tiles)
        layer.bias = None if bias is None else _frozen(bias)
        return layer

    def kernel(self) -> str:
        return "specviz q4 x q8" if self.own else "torch int4 (bfloat16)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.own:
            y = kernels.product_q4(self.packed, self.scales, self.zeros, rows.float(), self.out_features,
                                   group=self.group)[:, :self.kept]
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), self.packed, GROUP,
                                                           self.scales_and_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.kept)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] in float32 (for tests)."""
        if not self.own:
            eye = torch.eye(self.in_features)
            return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros.float()).T
        q, scale, zero = untiled(self.packed, self.scales, self.zeros, self.out_features, self.in_features, self.group)
        q, scale, zero = q[:self.kept], scale[:self.kept], zero[:self.kept]

        def spread(t: torch.Tensor) -> torch.Tensor:
            return t.float().repeat_interleave(self.group, 1)
        return (q.float() - 8) * spread(scale) + spread(zero)


class ColumnsProduct(torch.nn.Module):
    """An Int4Linear on specviz's kernel, its rows summed 8 or 16 outputs at a time (kernels.product_q4 with
    columns): the same weights, no copy of them, other bits (a draft's prompt read: specviz/cpu/prompt_reader.py).
    The C layer loop multiplies it so too (layer_loop.py)."""

    def __init__(self, product: torch.nn.Module):
        super().__init__()
        self.product = product

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.product
        y = kernels.product_q4(p.packed, p.scales, p.zeros, x.float(), p.out_features, columns=True,
                               group=p.group)[:, :p.kept]
        return y if p.bias is None else y + p.bias


def groups(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[out, in] float weight -> (q [out, in] uint8 in 0..15, scale and zero [out, in/group] bfloat16), the
    weight being (q - 8) * scale + zero per group. Each group's scale and zero are rounded to bfloat16
    first and its 4-bit values chosen against the rounded ones, so the rounding does not add to the error."""
    out_features, in_features = weight.shape
    grouped = weight.float().reshape(out_features, in_features // group, group)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = ((high - low) / 15).to(torch.bfloat16).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))     # a constant group: q = 8, w = zero
    zero = (low + 8 * scale).to(torch.bfloat16).float()
    q = torch.clamp(torch.round((grouped - zero) / scale) + 8, 0, 15).to(torch.uint8)
    return q.reshape(out_features, in_features), scale[..., 0].to(torch.bfloat16), zero[..., 0].to(torch.bfloat16)


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    """Parameters (frozen) rather than buffers, so that weight counts include them."""
    return torch.nn.Parameter(t, requires_grad=False)


def chunk_values(group: int) -> int:
    """Scales (and zeros) per chunk of CHUNK blocks and per output row"""
    return CHUNK * BLOCK // group


def tiled(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """groups() in the layout c/rows_kernel.c reads: per tile of 4 output rows, per pair of 32-wide blocks,
    each row's 32 bytes (low nibbles: q[0..15] of the pair's first block, then of its second; high nibbles:
    q[16..31] of each); the scales and zeros per tile, per chunk of 8 blocks (padded with zeros), each
    row's values for them (8 with groups of 32, 4 with groups of 64)."""
    out_features, in_features = q.shape
    per_chunk = chunk_values(in_features // scale.shape[1])
    # pairs: [..., block, half, 16]
    pairs = q.reshape(out_features // TILE, TILE, in_features // (2 * BLOCK), 2, 2, BLOCK // 2)
    packed = (pairs[..., 0, :].flatten(-2) | (pairs[..., 1, :].flatten(-2) << 4)).transpose(1, 2).contiguous()

    def chunked(t: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(t, (0, -t.shape[1] % per_chunk))
        return padded.reshape(out_features // TILE, TILE, -1, per_chunk).transpose(1, 2).contiguous()
    return (packed.reshape(out_features, -1), chunked(scale).reshape(out_features, -1),
            chunked(zero).reshape(out_features, -1))


def retiled(t: torch.Tensor, rows: torch.Tensor, width: int) -> torch.Tensor:
    """Of tiled()'s packed weights (width BLOCK) or scales or zeros (width chunk_values), the given rows (a multiple of
    TILE) in new tiles. A row's bytes in a tile do not depend on the other rows, so rows move without unpacking (a
    draft's output layer is cut to a vocabulary per prompt: unpacking its 152k rows took 0.2 s)."""
    tiles = t.reshape(t.shape[0] // TILE, -1, TILE, width)            # [tile, pair or chunk, row, width]
    picked = tiles[rows // TILE, :, rows % TILE]                      # [row, pair or chunk, width]
    return picked.reshape(-1, TILE, picked.shape[1], width).transpose(1, 2).reshape(len(rows), -1)


def untiled(packed, scales, zeros, out_features: int, in_features: int, group: int = GROUP):
    """tiled()'s inverse: (q, scale, zero) as groups() gave them."""
    pairs = packed.reshape(out_features // TILE, in_features // (2 * BLOCK), TILE, 2, BLOCK // 2).transpose(1, 2)
    q = torch.stack([pairs & 15, pairs >> 4], 4).reshape(out_features, in_features)     # [..., block, half, 16]
    groups_per_row, per_chunk = in_features // group, chunk_values(group)

    def unchunked(t: torch.Tensor) -> torch.Tensor:
        rows = t.reshape(out_features // TILE, -1, TILE, per_chunk).transpose(1, 2).reshape(out_features, -1)
        return rows[:, :groups_per_row]
    return q, unchunked(scales), unchunked(zeros)


def can_quantize(linear: torch.nn.Module) -> bool:
    """The kernel's shapes: inputs in whole groups, outputs a multiple of 16."""
    return (isinstance(linear, torch.nn.Linear) and linear.in_features % GROUP == 0
            and linear.out_features % 16 == 0 and linear.weight.device.type == "cpu")


def quantize_model(model: torch.nn.Module, keep: tuple[torch.nn.Module, ...] = (), layer=Int4Linear,
                   precision: str = INT4) -> torch.nn.Module:
    """Replace the model's linear layers but those in `keep` (the output layer included, untied from
    the input embedding, which stays as it is) by `layer` (Int4Linear, or int8.Int8Linear), in place;
    marks the model with the precision's name; returns the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if can_quantize(child) and not any(child is k for k in keep):
                setattr(parent, name, layer(child))
    mark_precision(model, precision)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False      # the output layer is its own (quantized) copy now
    return model


def mark_precision(model: torch.nn.Module, precision: str) -> None:
    """Name the precision a model's linear layers compute in (quantize_model's, or the file's own blocks: `gguf`)."""
    setattr(model, _MARK, precision)


def quantized_precision(model: torch.nn.Module) -> str | None:
    """`int4`, `int8` or `gguf` for a model whose linear layers are quantized, else None."""
    return getattr(model, _MARK, None)


def is_quantized(model: torch.nn.Module) -> bool:
    return quantized_precision(model) is not None
