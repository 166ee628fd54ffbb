"""Building specviz's C library (specviz/cpu/c/) on first use, for this machine, with the best flags that build.

The builds are tried in order and the first that compiles is kept, so a compiler without some flag costs speed, never
the kernels:
- x86 with AVX2 and FMA: every source, with AMX tiles where the CPU has them and AVX512-VNNI (GCC before 11 has no
  `-mamx-int8`), then with VNNI where the CPU has it (AVX512-VNNI or AVX-VNNI; nor `-mavxvnni`); then without VNNI;
  then without OpenMP (Apple's clang has no `-fopenmp`); then portable C.
- ARM64: NEON with the dot-product extension where the CPU has it (`asimddp`), then NEON, then without OpenMP, then
  portable C.
- any other CPU: portable C, then without OpenMP.
Builds other than x86's leave out rows_kernel.c (x86's float32, int8 and int4 products): there `int4` and `int8` take
PyTorch's products, while a GGUF file's own blocks, attention and the layer loop run on the library. Each build is
compiled with `-Wall` into the user cache, under a name made from the sources, headers and flags, and renamed into
place, so concurrent first uses never load half a file. `status()` names the build taken and, where a better one
failed, the compiler's first error line. SPECVIZ_ROWS_KERNEL: "0" builds nothing (PyTorch's products everywhere),
"avx2" starts without VNNI, "vnni" without AMX (an AVX512-VNNI machine of the Ice Lake kind), "portable" starts at
portable C.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import cpu_info
from .. import cache_dir

C = Path(__file__).with_name("c")                     # every C source and header of the library
PORTABLE_SOURCES = ("blocks.c", "row_attention.c", "layer_loop.c")
X86_SOURCES = ("rows_kernel.c", *PORTABLE_SOURCES)
# in the library's name too: a change rebuilds it
HEADERS = ("simd.h", "simd_neon.h", "specviz_cpu.h", "blocks.h", "columns.h", "rounding.h", "tuning.h")
# the headers whose numbers Python reads (CONSTANTS): each name there has one value on every build (tuning.h's vary by
# instruction set, and Python needs none of them)
SHARED = ("specviz_cpu.h", "blocks.h")
# -ffp-contract=off: a product and a sum written apart stay apart (layer_loop.c rotates as transformers does)
COMMON = ("-O3", "-Wall", "-shared", "-fPIC", "-ffp-contract=off", f"-I{C}")
X86 = ("-mavx2", "-mfma", "-mf16c", "-DSPECVIZ_ROWS_KERNEL")
# 8-bit dot products in one instruction where the CPU has them (the integer sums are the same either way)
VNNI = {"avx512_vnni": ("-mavx512f", "-mavx512bw", "-mavx512vnni", "-mavx512vl"), "avx_vnni": ("-mavxvnni",)}
# many rows of the file's K-quant blocks on AMX tiles (Sapphire Rapids on); the OS must allow them, asked at run time
AMX = ("-mamx-tile", "-mamx-int8")
SWITCH = "SPECVIZ_ROWS_KERNEL"
PREFIX = "specviz kernels"


def _constants() -> dict[str, int]:
    """The `#define NAME number` lines of the SHARED headers: the layouts, sizes and answers Python and C share."""
    found: dict[str, int] = {}
    for header in SHARED:
        for line in (C / header).read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "#define" and parts[2].lstrip("-").isdigit():
                if found.setdefault(parts[1], int(parts[2])) != int(parts[2]):
                    raise ValueError(f"{header} gives {parts[1]} a second value, {parts[2]} (first {found[parts[1]]})")
    return found


CONSTANTS = _constants()


@dataclass(frozen=True)
class Build:
    name: str                   # the instruction set, for the status line
    flags: tuple[str, ...]
    sources: tuple[str, ...]
    openmp: bool = True

    @property
    def rows(self) -> bool:
        """Whether x86's float32 / int8 / int4 products are in it."""
        return "rows_kernel.c" in self.sources

    def command(self, compiler: str, out: Path) -> list[str]:
        return [compiler, *COMMON, *self.flags, *(["-fopenmp"] if self.openmp else []),
                *(str(C / s) for s in self.sources), "-o", str(out), "-lm"]


def candidates(machine: str | None = None, simd: list[str] | None = None, switch: str | None = None) -> list[Build]:
    """The builds to try on this machine, best first (see the module's docstring)."""
    machine = (machine or platform.machine()).lower()
    simd = cpu_info()[1] if simd is None else simd
    switch = os.environ.get(SWITCH, "") if switch is None else switch
    best: list[Build] = []
    if machine in ("x86_64", "amd64") and {"avx2", "fma"} <= set(simd):
        vnni = next((name for name in VNNI
                     if name in simd and (name != "avx512_vnni" or {"avx512vl", "avx512bw"} <= set(simd))), None)
        if vnni == "avx512_vnni" and {"amx_tile", "amx_int8"} <= set(simd) and switch not in ("avx2", "vnni"):
            best.append(Build("AVX2 + AVX512-VNNI + AMX", X86 + VNNI[vnni] + AMX, X86_SOURCES))
        if vnni and switch != "avx2":
            best.append(Build("AVX2 + " + ("AVX512-VNNI" if vnni == "avx512_vnni" else "AVX-VNNI"), X86 + VNNI[vnni],
                              X86_SOURCES))
        best.append(Build("AVX2", X86, X86_SOURCES))
    elif machine in ("aarch64", "arm64"):
        if "asimddp" in simd:
            best.append(Build("NEON + dot product", ("-march=armv8.2-a+dotprod",), PORTABLE_SOURCES))
        best.append(Build("NEON", ("-march=armv8-a",), PORTABLE_SOURCES))
    if switch == "portable":
        best = []
    best.append(Build("portable C", ("-DSPECVIZ_PORTABLE",), PORTABLE_SOURCES))
    return best + [Build(b.name, b.flags, b.sources, openmp=False) for b in best]


@functools.cache
def library() -> tuple[ctypes.CDLL | None, Build | None, str]:
    """(the loaded library or None, its build, the status line)."""
    if os.environ.get(SWITCH) == "0":
        return None, None, f"torch (specviz's kernels are off: {SWITCH}=0)"
    compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        return None, None, "torch (no C compiler to build specviz's kernels)"
    failed = []
    for build in candidates():
        try:
            path = _built(compiler, build)
            loaded = ctypes.CDLL(str(path))
        except (OSError, subprocess.CalledProcessError) as error:
            failed.append(f"{build.name}{'' if build.openmp else ' without OpenMP'}: {_first_error(error)}")
            continue
        note = f" ({failed[0]})" if failed else ""
        if AMX[0] in build.flags and not loaded.block_amx():
            note += " (the OS did not allow AMX tiles: their products run on VNNI)"
        return loaded, build, f"{PREFIX}: {build.name}{'' if build.openmp else ', no OpenMP'}{note}"
    return None, None, f"torch (specviz's kernels did not build: {failed[0] if failed else 'no build for this CPU'})"


def _first_error(error: Exception) -> str:
    text = getattr(error, "stderr", None) or str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["failed"])[0][:160]


def library_name(compiler: str, build: Build) -> str:
    """The build's file name: a digest of its sources and its command. The command names the sources by this
    checkout's path; the digest does not, so that the library, and the machine profile keyed by its name
    (specviz/profile/store.py: machine), stay the same wherever the repository lies."""
    contents = b"".join((C / name).read_bytes() for name in build.sources + HEADERS)
    command = " ".join(build.command(compiler, Path("out"))).replace(str(C), "c")
    return f"specviz-{hashlib.sha256(contents + command.encode()).hexdigest()[:12]}.so"


def _built(compiler: str, build: Build) -> Path:
    """The build's library in the user cache, compiled there first where it is not yet."""
    library = cache_dir() / "kernels" / library_name(compiler, build)
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
            out = Path(scratch) / library.name
            subprocess.run(build.command(compiler, out), check=True, capture_output=True, text=True)
            os.replace(out, library)
    return library
