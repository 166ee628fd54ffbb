"""A float32 product of a few rows with a weight matrix, in C with AVX2 + FMA (`rows_kernel.c`).

Decoding feeds one token per forward and verifying a tree 2-16, so every linear layer multiplies a
wide weight matrix by a few rows, and its cost is reading the weights. On our 2-core AVX2 machines
MKL's products read them at 9-19 GB/s and this kernel at 13-42 GB/s (the fewer rows, the faster)
(all linear layers of a Qwen2.5-1.5B, 6.2 GB of float32, milliseconds for 1, 2, 4, 8, 16 rows:
`W @ rows.T` 314-336, 309-329, 302, 530-538, 704-730; here 148-210, 181-232, 224-249, 291-324,
456-460; `scripts/linear_layer_speeds.py`, docs/BENCHMARKS.md). It also
computes each row by the same sequence of operations whatever rows come with it, so the linear
layers of a tree's forward compute each token exactly as plain decoding does, bit for bit.

It is compiled on first use with the machine's C compiler into the user cache, under a name made
from the source and flags, and loaded with ctypes; it runs on torch's own OpenMP threads (the
library links the `libgomp.so.1` torch has already loaded). Where there is no compiler, no AVX2
and FMA, or `SPECVIZ_ROWS_KERNEL=0` is set, `product` returns None and the caller keeps torch's
product; `status()` says which, for reports.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from .paths import cache_dir

SOURCE = Path(__file__).with_name("rows_kernel.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
SWITCH = "SPECVIZ_ROWS_KERNEL"       # "0" turns the kernel off (to measure torch's product instead)
_ROW_STEP = 8                        # the kernel reads 8 floats at a time: rows must be a multiple wide


@functools.cache
def _loaded() -> tuple[object | None, str]:
    """(the kernel's entry point or None, a few words saying which product runs)."""
    if os.environ.get(SWITCH, "1") == "0":
        return None, f"torch (the rows kernel is off: {SWITCH}=0)"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None, "torch (this CPU has no AVX2)"
    compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        return None, "torch (no C compiler to build the rows kernel)"
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]
    library = cache_dir() / "kernels" / f"rows_kernel-{digest}.so"
    try:
        if not library.exists():
            _build(compiler, library)
        entry = ctypes.CDLL(str(library)).rows_matmul
    except (OSError, subprocess.CalledProcessError) as error:
        return None, f"torch (the rows kernel did not build: {str(error).splitlines()[0][:120]})"
    entry.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    entry.restype = None
    return entry, "specviz AVX2 rows kernel"


def _build(compiler: str, library: Path) -> None:
    """Compile next to the target and rename into place, so concurrent first uses never load half a file."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = Path(scratch) / library.name
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True, text=True)
        os.replace(built, library)


def status() -> str:
    return _loaded()[1]


def product(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """rows @ weight.T ([n, in] and [out, in] -> [n, out]) by the kernel, or None where it does not apply."""
    n, width = rows.shape
    if (weight.dtype != torch.float32 or rows.dtype != torch.float32 or weight.device.type != "cpu"
            or rows.device.type != "cpu" or width % _ROW_STEP or not weight.is_contiguous()):
        return None
    entry = _loaded()[0]
    if entry is None:
        return None
    rows = rows.contiguous()
    out = torch.empty(n, weight.shape[0])
    entry(rows.data_ptr(), weight.data_ptr(), out.data_ptr(), n, width, weight.shape[0], torch.get_num_threads())
    return out
