"""A GGUF file's own quantized blocks as a model's layers: the `gguf` precision.

llama.cpp computes on the blocks its file stores (Q4_K, Q6_K, Q5_0, Q8_0, Q4_0, Q4_1, ...). Here too: a `BlockLinear`
holds a weight's blocks as the file stores them (a view of the memory-mapped file: nothing is converted or copied)
and multiplies them by specviz/cpu/c/blocks.c, which rounds each input row to int8 as llama.cpp's matching dot product
does and sums exact integers per block. So the model is the file's model, with llama.cpp's arithmetic, and each row's
outputs are the same bits whether it is fed alone or with others (what lets a tree verify exactly), on every CPU.
A `BlockEmbedding` de-quantises only the rows of the tokens it is asked for, as the `gguf` package does.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from . import build, kernels

GGUF = "gguf"                    # the precision's name (`--dtype gguf`)
# ggml type id -> name, for the formats the kernel reads
TYPES = {qtype: name.removeprefix("GGUF_") for name, qtype in build.CONSTANTS.items() if name.startswith("GGUF_")}
# their weights and bytes per block, as the C headers declare them (QK_K in a K-quant, QK_LEGACY in the others)
BLOCK = {qtype: (build.CONSTANTS["QK_K" if name.endswith("_K") else "QK_LEGACY"],
                 build.CONSTANTS[f"BLOCK_BYTES_{name}"]) for qtype, name in TYPES.items()}
ERRORS = {build.CONSTANTS["BLOCKS_BAD_TYPE"]: "a block type the kernel does not read",
          build.CONSTANTS["BLOCKS_BAD_SHAPE"]: "shapes the blocks do not fit",
          build.CONSTANTS["BLOCKS_NOT_FINITE"]: "an input that is not finite (NaN or infinity)",
          build.CONSTANTS["BLOCKS_NO_MEMORY"]: "too little memory to round a row twice"}


@functools.cache
def _kernel():
    library = kernels.library()
    library.block_product.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p]
    library.block_product.restype = ctypes.c_int
    library.block_packed_bytes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    library.block_packed_bytes.restype = ctypes.c_size_t
    library.block_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int]
    library.block_pack.restype = ctypes.c_int
    library.block_scratch_bytes.argtypes = [ctypes.c_int, ctypes.c_int]
    library.block_scratch_bytes.restype = ctypes.c_size_t
    library.block_simd.restype = ctypes.c_char_p
    library.block_columns_from.argtypes = [ctypes.c_int]
    library.block_set_columns_from.argtypes = [ctypes.c_int, ctypes.c_int]
    return library


def simd() -> str:
    """The instruction set the block products run on here."""
    return _kernel().block_simd().decode()


K_QUANTS = {name: qtype for qtype, name in TYPES.items() if name.endswith("_K")}


def columns_from() -> dict[str, int]:
    """Per K-quant, the fewest rows that take the packed columns' path (specviz/cpu/c/blocks.c); {} where this build
    has no such path."""
    return {name: n for name, qtype in K_QUANTS.items() if (n := _kernel().block_columns_from(qtype))}


def set_columns_from(counts: dict[str, int]) -> None:
    """Take these counts (a model's measured crossover, specviz/models/block_paths.py) for this process's products:
    speed only, the bits are the same."""
    for name, rows in counts.items():
        if name in K_QUANTS and isinstance(rows, int) and rows >= 1:
            _kernel().block_set_columns_from(K_QUANTS[name], rows)


def row_bytes(qtype: int, K: int) -> int:
    weights, size = BLOCK[qtype]
    return K // weights * size


def packed(qtype: int, blocks: torch.Tensor, K: int) -> torch.Tensor | None:
    """The blocks [N, row bytes] packed for products of many rows (specviz/cpu/c/columns.h: each 16 outputs' quads of
    weights side by side, once instead of at every forward), or None where this build's products read no such copy."""
    size = _kernel().block_packed_bytes(qtype, K, blocks.shape[0])
    if not size:
        return None
    out = torch.empty(size, dtype=torch.uint8)
    _kernel().block_pack(qtype, blocks.data_ptr(), K, blocks.shape[0], out.data_ptr(), torch.get_num_threads())
    return out


def product(qtype: int, blocks: torch.Tensor, rows: torch.Tensor,
            packed_blocks: torch.Tensor | None = None) -> torch.Tensor:
    """rows [n, K] float32 @ W.T -> [n, N], W the file's blocks [N, row bytes] of type `qtype` (and their packed copy,
    packed(), for many rows: the same bits, sooner)."""
    require = kernels.require
    require(qtype in TYPES, f"GGUF block type {qtype} is not one the kernel reads ({', '.join(TYPES.values())})")
    require(rows.dim() == 2, f"rows must be [n, in], got shape {tuple(rows.shape)}")
    n, K = rows.shape
    weights = BLOCK[qtype][0]
    require(K > 0 and K % weights == 0, f"{TYPES[qtype]} blocks hold {weights} inputs: {K} inputs is not a multiple")
    rows = rows.contiguous()
    kernels.require_tensor("rows", rows, torch.float32, (n, K))
    kernels.require_tensor("blocks", blocks, torch.uint8, (None, row_bytes(qtype, K)))
    out = torch.empty(n, blocks.shape[0])
    scratch = torch.empty(_kernel().block_scratch_bytes(K, n), dtype=torch.uint8)
    failed = _kernel().block_product(qtype, blocks.data_ptr(),
                                     None if packed_blocks is None else packed_blocks.data_ptr(),
                                     K, blocks.shape[0], rows.data_ptr(), n, out.data_ptr(), blocks.shape[0],
                                     torch.get_num_threads(), scratch.data_ptr())
    require(not failed, f"the {TYPES[qtype]} product was given {ERRORS.get(failed, failed)}")
    return out


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    """A parameter (frozen), so that weight counts include the blocks' bytes."""
    return torch.nn.Parameter(t, requires_grad=False)


class BlockLinear(torch.nn.Module):
    """y = x @ W.T + b, W a GGUF tensor's blocks [out, row bytes] of type `qtype` as the file stores them."""

    def __init__(self, qtype: int, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        self.qtype, self.in_features, self.out_features = qtype, in_features, blocks.shape[0]
        self.weight = blocks if isinstance(blocks, torch.nn.Parameter) else _frozen(blocks)
        self.bias = None if bias is None else _frozen(bias)
        self._packed: torch.Tensor | None | bool = False          # False: not made yet

    def packed_blocks(self) -> torch.Tensor | None:
        """The blocks packed for many rows (packed()), made at the first call: a layer never fed (a draft's whole
        output layer, replaced by its cut one) takes no memory for them."""
        if self._packed is False:
            self._packed = packed(self.qtype, self.weight, self.in_features)
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = product(self.qtype, self.weight, x.reshape(-1, self.in_features).float(), self.packed_blocks())
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def output_rows(self, ids: torch.Tensor) -> "BlockLinear":
        """A layer computing only the outputs `ids` (a draft's output vocabulary): their rows of blocks."""
        return BlockLinear(self.qtype, self.weight[ids].contiguous(), self.in_features,
                           None if self.bias is None else self.bias[ids].clone())

    def kernel(self) -> str:
        return f"specviz {TYPES[self.qtype]} x Q8 blocks ({simd()})"

    def dequantized(self) -> torch.Tensor:
        """The weight its blocks hold, [out, in] in float32, as the `gguf` package (and so transformers' GGUF loader)
        de-quantises it."""
        return _dequantized(self.qtype, self.weight.numpy()).reshape(self.out_features, self.in_features)

    def extra_repr(self) -> str:
        return f"{TYPES[self.qtype]}, in_features={self.in_features}, out_features={self.out_features}"


class BlockEmbedding(torch.nn.Module):
    """The input embedding of a GGUF file: its blocks [vocab, row bytes], each token's row de-quantised when asked for,
    by the `gguf` package (the same floats transformers' GGUF loader makes)."""

    def __init__(self, qtype: int, blocks: torch.Tensor, dim: int):
        super().__init__()
        self.qtype, self.embedding_dim = qtype, dim
        self.weight = blocks if isinstance(blocks, torch.nn.Parameter) else _frozen(blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = _dequantized(self.qtype, self.weight[ids.reshape(-1).cpu()].numpy())
        return rows.reshape(*ids.shape, self.embedding_dim)


def _dequantized(qtype: int, blocks: np.ndarray) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(np.ascontiguousarray(dequantize(blocks, GGMLQuantizationType(qtype)), np.float32))
