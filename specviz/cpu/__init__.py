"""The CPU engine: specviz's own forward of a Llama-family model, products on quantized weights, and the build of its C
library; here, what this CPU is and which SIMD instructions it has (for reports, and for building
specviz/cpu/c/rows_kernel.c). It may import nothing of specviz but the package root."""
from __future__ import annotations

import platform
from pathlib import Path

SIMD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vl", "avx_vnni", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


def cpu_info() -> tuple[str, list[str]]:
    """(CPU model name, the SIMD flags of SIMD_FLAGS it has), from /proc/cpuinfo where there is one."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return name, [f for f in SIMD_FLAGS if f in flags]
