"""Two builds of specviz's attention (row_attention.c) side by side: each source directory (a copy of specviz/cpu/c,
e.g. from `git archive`) built with one instruction set, their calls interleaved in one process (so that machine noise
hits both alike), best of 30. Prints ms per forward (every layer's attention) for the Qwen2.5-Coder-1.5B's heads
(12 over 2 kv heads of 128) and the 0.5B's (14 over 2 of 64) after CTX committed entries (default 200), and the
largest difference between the builds' outputs (docs/BENCHMARKS.md, "Attention and SiLU vectorized").
    mkdir -p /tmp/old && git archive HEAD~1 specviz/cpu/c | tar -x -C /tmp/old
    python scripts/attention_ab.py /tmp/old/specviz/cpu/c,specviz/cpu/c avx2
ISA: avx2 or vnni (AVX512-VNNI).
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import torch

from specviz.cpu import build

FLAGS = {"avx2": build.X86, "vnni": build.X86 + build.VNNI["avx512_vnni"]}
# (name, query heads, kv heads, values a head, rows fed, layers)
CASES = [("1.5B", 12, 2, 128, 1, 28), ("1.5B", 12, 2, 128, 16, 28), ("0.5B", 14, 2, 64, 1, 24), ("0.5B", 14, 2, 64, 3, 24)]


def load(source: str, isa: str, out: str) -> ctypes.CDLL:
    common = [flag for flag in build.COMMON if not flag.startswith("-I")]
    subprocess.run(["cc", *common, f"-I{source}", *FLAGS[isa], "-fopenmp",
                    *(os.path.join(source, s) for s in build.X86_SOURCES), "-o", out, "-lm"], check=True)
    library = ctypes.CDLL(out)
    library.attend_rows.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_float, ctypes.c_int,
                                                                                   ctypes.c_void_p]
    return library


def main() -> None:
    sources, isa = sys.argv[1].split(","), sys.argv[2]
    committed = int(os.environ.get("CTX", 200))
    with tempfile.TemporaryDirectory() as scratch_dir:
        libraries = [load(source, isa, os.path.join(scratch_dir, f"build{i}.so")) for i, source in enumerate(sources)]
        torch.manual_seed(0)
        for name, heads, kv_heads, dim, n, layers in CASES:
            capacity = committed + n
            keys, values, query = torch.randn(kv_heads, capacity, dim), torch.randn(kv_heads, capacity, dim), torch.randn(n, heads, dim)
            visible = torch.ones(n, n, dtype=torch.bool).tril().to(torch.uint8)
            scratch = torch.empty(2 * capacity * (1 + heads // kv_heads), dtype=torch.int32)
            outs, best = [torch.empty(n, heads, dim) for _ in libraries], [float("inf")] * len(libraries)
            for _ in range(30):
                for i, library in enumerate(libraries):
                    started = time.perf_counter()
                    for _ in range(layers):
                        library.attend_rows(query.data_ptr(), keys.data_ptr(), values.data_ptr(), visible.data_ptr(),
                                            outs[i].data_ptr(), n, heads, kv_heads, dim, capacity, committed, n,
                                            dim ** -0.5, 2, scratch.data_ptr())
                    best[i] = min(best[i], time.perf_counter() - started)
            differ = max((out - outs[0]).abs().max().item() for out in outs)
            print(f"{name} heads, {n:2d} rows after {committed}: " + "  ".join(f"{s * 1e3:6.3f} ms" for s in best)
                  + f"  largest difference {differ:.1e}")


if __name__ == "__main__":
    main()
