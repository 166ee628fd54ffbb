"""Linear layers with 4-bit weights, for a model run on a CPU without bf16 units.

Decoding reads every weight once per forward, so on a small CPU a forward of a few tokens costs
what reading the weights costs. Stored in 4 bits (groups of 32 weights along the input, each with a
scale and an offset, as GGUF's Q4 formats store them) a Qwen2.5-Coder-0.5B's linear layers are
read 3.8x faster than in float32 on our 2-core AVX2 machines (1 token: 42 ms against 160 ms; 16
tokens: 282 ms against 321 ms), through PyTorch's own CPU kernel (`_weight_int4pack_mm_for_cpu`,
which computes in bfloat16). Only the linear layers change: embeddings, norms and attention keep
float32.

A draft's precision moves acceptance only, never the output, so a draft may always take this. A
target in `int4` is a different numerical model from the same target in float32: the exactness
promise is then against our baseline in `int4`, and holds bit for bit because the kernel computes
each row alone and an int4 model attends one token at a time (specviz/row_attention.py).
"""
from __future__ import annotations

import torch

GROUP = 32                    # weights per scale and offset (GGUF's Q4_0/Q4_1/Q4_K blocks are 32 wide)
INT4 = "int4"                 # the precision's name (`--dtype int4`)
_MARK = "_specviz_quantized"


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + b with W in 4-bit groups: w = (q - 8) * scale + zero, q in 0..15."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed, scales_and_zeros = quantize(linear.weight.detach())
        # Parameters (frozen) rather than buffers, so that weight counts include them
        self.packed = torch.nn.Parameter(packed, requires_grad=False)
        self.scales_and_zeros = torch.nn.Parameter(scales_and_zeros, requires_grad=False)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in] in float32 (for tests; the kernel's float32 path)."""
        eye = torch.eye(self.in_features)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros.float()).T


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float weight -> (the kernel's packed 4-bit weight, bf16 scales and zeros [in/32, out, 2]).
    Each group's scale and zero are rounded to bfloat16 first and its 4-bit values chosen against
    the rounded ones, so the rounding does not add to the error."""
    out_features, in_features = weight.shape
    groups = weight.float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).to(torch.bfloat16).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))     # a constant group: q = 8, w = zero
    zero = (low + 8 * scale).to(torch.bfloat16).float()
    q = torch.clamp(torch.round((groups - zero) / scale) + 8, 0, 15).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(out_features, in_features), 1)
    scales_and_zeros = torch.cat([scale, zero], -1).permute(1, 0, 2).contiguous().to(torch.bfloat16)
    return packed, scales_and_zeros


def can_quantize(linear: torch.nn.Module) -> bool:
    """The kernel's shapes: inputs in whole groups, outputs a multiple of 16."""
    return (type(linear) is torch.nn.Linear and linear.in_features % GROUP == 0
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
    setattr(model, _MARK, precision)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False      # the output layer is its own (quantized) copy now
    return model


def quantized_precision(model: torch.nn.Module) -> str | None:
    """`int4` or `int8` for a model quantize_model changed, else None."""
    return getattr(model, _MARK, None)


def is_quantized(model: torch.nn.Module) -> bool:
    return quantized_precision(model) is not None
