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
# what measure_columns_from times: a Qwen2.5-1.5B layer's widest products (gate and up: Q4_K; down: Q6_K), by rows fed
TIMED_SHAPES = {"Q4_K": (1536, 8960), "Q6_K": (8960, 1536)}
# every count up to 6, a verified tree's commonest sizes: timed at 1, 2, 4, 8, a 2-core Emerald Rapids tied the paths at
# 4 and stored 8, and the target's forwards of 5-7 tokens ran 12-15% slower on the tiles than on the columns
TIMED_ROWS = (1, 2, 3, 4, 5, 6, 8, 16, 64)


def columns_from() -> dict[str, int]:
    """Per K-quant, the fewest rows that take the packed columns' path (specviz/cpu/c/blocks.c); {} where this build
    has no such path."""
    return {name: n for name, qtype in K_QUANTS.items() if (n := _kernel().block_columns_from(qtype))}


def set_columns_from(counts: dict[str, int]) -> None:
    """Take these counts (measure_columns_from's) for this process's products: speed only, the bits are the same."""
    for name, rows in counts.items():
        if name in K_QUANTS and isinstance(rows, int) and rows >= 1:
            _kernel().block_set_columns_from(K_QUANTS[name], rows)


def crossover(tiles: dict[int, float], columns: dict[int, float]) -> int:
    """The count of rows from which the columns serve best (seconds by rows fed for each path): the one whose choice
    loses least summed over the counts timed, each count's time taken relative to the faster path's there, so that
    each count weighs alike and one noisy count moves the answer by one step at most. One past the most rows timed:
    the columns never."""
    counts = sorted(tiles)

    def loss(start: int) -> float:
        return sum((columns[n] if n >= start else tiles[n]) / min(tiles[n], columns[n]) for n in counts)
    return min([*counts, counts[-1] + 1], key=loss)


def last_level_cache_bytes() -> int:
    """This CPU's largest cache as Linux reports it (0 where it does not: other systems, some containers)."""
    from pathlib import Path
    sizes = [0]
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = size.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        if text.rstrip("KM").isdigit():
            sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes)


def ring_copies(copy_bytes: int, batch: int) -> int:
    """How many copies of one product's weights (both paths', `copy_bytes`) make a ring that the last-level cache cannot
    hold: twice the cache (256 MB where unknown), at most 1 GB (a 1.5B's weights), and two batches at least."""
    ring_bytes = min(2 * (last_level_cache_bytes() or 1 << 27), 1 << 30)
    return max(2 * batch, -(-ring_bytes // copy_bytes))


def measure_columns_from(reps: int = 7, batch: int = 4) -> dict:
    """This machine's crossover per K-quant (crossover()) between the tiles and the packed columns, timed on
    TIMED_SHAPES by TIMED_ROWS, the paths and counts interleaved, best of `reps`: {"from": {name: rows}, "ms":
    {name: {path: {rows: ms per product}}}}.

    A model's forward reads a gigabyte of weights that no cache holds, and one row's product is then bound by memory,
    where the two paths differ: a Xeon's 260 MB L3 kept one product's 8 MB warm through a 64 MB flush, and the columns
    won there at one row, while in the model they ran 6% slower. So each timing runs `batch` products on consecutive
    copies of the weights from a ring larger than the last-level cache, as a model's layers follow one another."""
    from time import perf_counter

    from .reference import random_blocks
    chosen, ms = {}, {}
    kept = columns_from()
    try:
        for name in kept:
            K, N = TIMED_SHAPES[name]
            blocks = torch.from_numpy(random_blocks(K_QUANTS[name], N, K, np.random.default_rng(0)))
            packs = packed(K_QUANTS[name], blocks, K)
            copies = ring_copies(blocks.numel() + packs.numel(), batch)
            ring = [(blocks.clone(), packs.clone()) for _ in range(copies)]
            x = {n: torch.randn(n, K, generator=torch.Generator().manual_seed(n)) for n in TIMED_ROWS}
            best = {path: dict.fromkeys(TIMED_ROWS, float("inf")) for path in ("tiles", "columns")}
            at = 0
            for _ in range(reps):
                for n in TIMED_ROWS:
                    for path in best:
                        set_columns_from({name: 1 if path == "columns" else 1 << 30})
                        weights = [ring[(at + i) % copies] for i in range(batch)]
                        at = (at + batch) % copies
                        start = perf_counter()
                        for copy, copy_packs in weights:
                            product(K_QUANTS[name], copy, x[n], copy_packs)
                        best[path][n] = min(best[path][n], (perf_counter() - start) / batch)
            del ring
            chosen[name] = crossover(best["tiles"], best["columns"])
            ms[name] = {path: {str(n): round(s * 1e3, 3) for n, s in times.items()} for path, times in best.items()}
    finally:
        set_columns_from(kept)
    return {"from": chosen, "ms": ms}


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
