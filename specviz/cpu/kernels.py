"""specviz's C kernels as Python calls: each entry point checks its inputs, then calls the library that
specviz/cpu/build.py built for this machine.

The library holds: the products of a GGUF file's own blocks (c/blocks.c, `blocks.py` calls them), attention and RMS
norm each row alone (c/row_attention.c), a whole model's layers in one call (c/layer_loop.c), and on x86 with AVX2
the few-row products of float32, int8 and specviz's 4-bit weights (c/rows_kernel.c). Decoding feeds one token per
forward and verifying a tree 2-16, so every linear layer multiplies a wide weight matrix by a few rows, and its cost
is reading the weights: on our 2-core AVX2 machines MKL's products read a Qwen2.5-1.5B's float32 layers at 9-19
GB/s, the rows kernel at 13-42 GB/s (timed with `scripts/linear_layer_speeds.py`). Every kernel computes each
row by the same sequence of operations whatever rows come with it, so a tree's forward computes each token exactly
as plain decoding does, bit for bit. Where the library did not build, or has no rows kernel (a CPU without AVX2),
`product` and `product_int8` return None and the caller keeps PyTorch's product; `status()` says which, for reports.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from . import build

SWITCH = build.SWITCH
KERNEL = build.PREFIX
_ROW_STEP = 8                        # the kernels read 8 floats at a time: rows must be a multiple wide
# the 4-bit weights' layout (c/specviz_cpu.h; specviz/cpu/int4.py's tiled() writes it)
_GROUP, _WIDE_GROUP = build.CONSTANTS["Q4_GROUP"], build.CONSTANTS["Q4_WIDE_GROUP"]
_TILE, _CHUNK = build.CONSTANTS["Q4_TILE"], build.CONSTANTS["Q4_CHUNK"]


@functools.cache
def _loaded() -> ctypes.CDLL | None:
    """The library with its entry points typed, or None."""
    library, built, _ = build.library()
    if library is None:
        return None
    if built.rows:
        for entry in (library.rows_matmul_f32, library.rows_matmul_q8):
            entry.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
            entry.restype = None
        for entry in (library.rows_matmul_q4, library.rows_matmul_q4_columns):
            entry.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 4
                              + [ctypes.c_void_p])
            entry.restype = None
    library.attend_rows.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 7
                                    + [ctypes.c_float, ctypes.c_int, ctypes.c_void_p])
    library.attend_rows.restype = None
    library.rms_norm_rows.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_float]
    library.rms_norm_rows.restype = None
    library.decode_layers.argtypes = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 6
                                      + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 + [ctypes.c_void_p]
                                      + [ctypes.c_int] * 2 + [ctypes.c_float] * 2 + [ctypes.c_int])
    library.decode_layers.restype = ctypes.c_int
    return library


def status() -> str:
    return build.library()[2]


def version() -> str:
    """The built library's name: a digest of its sources and flags, so that what was timed on one build is not taken
    for another's (specviz/profile/store.py: machine)."""
    loaded = build.library()[0]
    return Path(loaded._name).stem if loaded is not None else "none"


def available() -> bool:
    """The library built here: a GGUF file's blocks, attention, norms and the layer loop run on it."""
    return _loaded() is not None


def rows_available() -> bool:
    """x86's few-row float32, int8 and int4 products are in it."""
    return available() and build.library()[1].rows


class KernelInputError(ValueError):
    """An input a kernel cannot read as given; the message is one line. The C code trusts its arguments, so
    every entry point below checks dtype, device, contiguity and shapes first: a wrong one must stop here, not
    read or write past a tensor's end or compute garbage."""


def require(ok: bool, what: str) -> None:
    if not ok:
        raise KernelInputError(f"{KERNEL}: {what}")


def require_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple) -> None:
    """t is a contiguous CPU tensor of `dtype` and exactly `shape` (None: any size in that dimension)."""
    require(t.dtype == dtype and t.device.type == "cpu",
            f"{name} must be a CPU {dtype} tensor, got {t.dtype} on {t.device}")
    require(t.dim() == len(shape) and all(want is None or want == got for want, got in zip(shape, t.shape)),
            f"{name} has shape {tuple(t.shape)}, expected {tuple('any' if d is None else d for d in shape)}")
    require(t.is_contiguous(), f"{name} must be contiguous")


def q4_blocks(K: int) -> int:
    """A row's 32-wide blocks (Q4_GROUP) of K inputs, padded to chunks of 8 (Q4_CHUNK)."""
    return (K // _GROUP + _CHUNK - 1) // _CHUNK * _CHUNK


def q4_groups(K: int, group: int = _GROUP) -> int:
    """Scales (and zeros) per row of a 4-bit weight of K inputs in groups of 32 or 64: a chunk's 8 or 4."""
    return q4_blocks(K) * _GROUP // group


def _applies(weight: torch.Tensor, rows: torch.Tensor) -> bool:
    return (rows.dtype == torch.float32 and weight.device.type == "cpu" and rows.device.type == "cpu"
            and rows.shape[1] % _ROW_STEP == 0 and weight.is_contiguous() and rows_available())


def _run(entry, weight: torch.Tensor, scale: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    rows = rows.contiguous()
    out = torch.empty(rows.shape[0], weight.shape[0])
    entry(rows.data_ptr(), weight.data_ptr(), 0 if scale is None else scale.data_ptr(), out.data_ptr(),
          rows.shape[0], rows.shape[1], weight.shape[0], torch.get_num_threads())
    return out


def product(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """rows @ weight.T ([n, in] and [out, in] float32 -> [n, out]) by the kernel, or None where it does not apply."""
    if weight.dtype != torch.float32 or not _applies(weight, rows):
        return None
    return _run(_loaded().rows_matmul_f32, weight, None, rows)


def product_int8(weight: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """rows @ (scale[:, None] * weight).T for an int8 weight [out, in] and float32 scales [out], by the
    kernel (weights converted to float32 as they are read), or None where it does not apply."""
    if weight.dtype != torch.int8 or not _applies(weight, rows):
        return None
    return _run(_loaded().rows_matmul_q8, weight, scale.float().contiguous(), rows)


def product_q4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, rows: torch.Tensor,
               out_features: int, columns: bool = False, group: int = 32) -> torch.Tensor:
    """rows @ W.T ([n, in] float32 -> [n, out]) for 4-bit weights in the layout of specviz/cpu/int4.py's
    tiled() (a scale and zero per `group` inputs: 32 or 64), each row rounded to int8 per 256 values as it is read.
    The caller checks rows_available().
    columns: sum 8 outputs at a time, 16 with AVX512-VNNI where out is a multiple of 16 (rows_matmul_q4_columns:
    faster for many rows, other bits; out a multiple of 8)."""
    rows = rows.contiguous()
    require(rows.dim() == 2, f"rows must be [n, in], got shape {tuple(rows.shape)}")
    n, K = rows.shape
    require(K % (2 * _GROUP) == 0 and K > 0,
            f"the 4-bit product reads inputs in pairs of {_GROUP}-wide blocks: {K} is not a multiple of {2 * _GROUP}")
    require(out_features % _TILE == 0 and out_features > 0,
            f"the 4-bit product writes outputs in tiles of {_TILE}: {out_features} is not a multiple")
    require(group in (_GROUP, _WIDE_GROUP),
            f"the 4-bit product takes groups of {_GROUP} or {_WIDE_GROUP} inputs, not {group}")
    require_tensor("rows", rows, torch.float32, (n, K))
    require_tensor("packed weights", packed, torch.uint8, (out_features, K // 2))
    for name, t in (("scales", scales), ("zeros", zeros)):
        require_tensor(name, t, torch.bfloat16, (out_features, q4_groups(K, group)))
    require(bool(torch.isfinite(rows).all()),
            "the 4-bit product was given an input that is not finite (NaN or infinity)")
    out = torch.empty(n, out_features)
    # the rows in int8, and per block two floats
    scratch = torch.empty(n * (K + 8 * q4_blocks(K)), dtype=torch.uint8)
    require(not columns or out_features % (2 * _TILE) == 0,
            f"the 4-bit columns product writes {2 * _TILE} outputs at a time: {out_features} is not a multiple")
    product = _loaded().rows_matmul_q4_columns if columns else _loaded().rows_matmul_q4
    product(rows.data_ptr(), packed.data_ptr(), scales.data_ptr(), zeros.data_ptr(), group, out.data_ptr(), n, K,
            out_features, torch.get_num_threads(), scratch.data_ptr())
    return out


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, committed: int,
           scale: float) -> torch.Tensor:
    """Each query row's attention over the committed entries and the uncommitted ones it sees, alone
    (row_attention.c): query [n, heads, D] float32, keys and values one layer's cache [kv_heads, capacity, D],
    visible bool [n, cols] over the entries after the committed ones. Returns [n, heads, D]. The caller
    checks available()."""
    require(query.dim() == 3 and keys.dim() == 3 and visible.dim() == 2, "attend takes query [n, heads, D], "
            "keys and values [kv_heads, capacity, D] and visible [n, cols]")
    n, heads, D = query.shape
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    cols = visible.shape[1]
    require(D % 8 == 0 and kv_heads > 0 and heads % kv_heads == 0, f"heads of {D} values (a multiple of 8), "
            f"{heads} query heads over {kv_heads} kv heads (a multiple): not so here")
    require(0 <= committed and committed + cols <= capacity, f"{committed} committed and {cols} new entries do not fit "
            f"a cache of {capacity}")
    require_tensor("query", query.contiguous(), torch.float32, (n, heads, D))
    for name, t in (("keys", keys), ("values", values)):
        require_tensor(name, t, torch.float32, (kv_heads, capacity, D))
    require_tensor("visible", visible, torch.bool, (n, cols))
    entries, threads = committed + cols, torch.get_num_threads()
    out = torch.empty(n, heads, D)
    scratch = torch.empty(threads * entries * (1 + heads // kv_heads), dtype=torch.int32)
    query, mask = query.contiguous(), visible.to(torch.uint8).contiguous()      # held: the C call reads them
    _loaded().attend_rows(query.data_ptr(), keys.data_ptr(), values.data_ptr(), mask.data_ptr(),
                             out.data_ptr(), n, heads, kv_heads, D, capacity, committed, cols, scale, threads,
                             scratch.data_ptr())
    return out


def library() -> ctypes.CDLL:
    """The built library (the caller checks available())."""
    return _loaded()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight for rows x [n, K] float32 (K a multiple of 8), each row alone
    (row_attention.c). The caller checks available()."""
    x = x.contiguous()
    require(x.dim() == 2 and x.shape[1] % 8 == 0,
            f"RMS norm takes rows [n, K], K a multiple of 8: got {tuple(x.shape)}")
    require_tensor("rows", x, torch.float32, (None, x.shape[1]))
    require_tensor("norm weight", weight, torch.float32, (x.shape[1],))
    out = torch.empty_like(x)
    _loaded().rms_norm_rows(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out
