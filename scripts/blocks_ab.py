"""Two builds of specviz's kernels side by side on a GGUF file's own tensors: each source directory (a copy of
specviz/cpu/c, e.g. from `git archive`) built with one instruction set, their calls interleaved in one process (so
that machine noise hits both alike), best of REPS. Prints ms and G multiply-adds a second per group of products and
rows fed, whether the builds' outputs are the same bits, and writes JSON. FLUSH=1 writes 64 MB before each call, so that
its weights come from memory, as in a model's forward (else a group that fits the last-level cache may come from there).
    mkdir -p out/old && git archive HEAD~1 specviz/cpu/c | tar -x -C out/old
    python scripts/blocks_ab.py out/old/specviz/cpu/c,specviz/cpu/c avx2 out.json 1 4 8 16 32 64
ISA: avx2, vnni (AVX512-VNNI), amx or portable (C, no intrinsics); a source given as DIR@ISA takes its own (two
instruction sets of one source side by side: specviz/cpu/c@avx2,specviz/cpu/c@vnni). GGUF=path picks another file
(default: the 1.5B coder's); its groups are layer 0's Q4_K products, a Q6_K ffn_down and the output layer.
FORWARD=1 times every product of a forward instead, grouped by name (ffn_gate: that of every layer, one after another),
so that a group's weights come from memory as in the model; COLUMNS_FROM=Q4_K:4,Q6_K:8 takes a machine's stored rows
from which the packed columns pay (its profile's), where the builds would take their defaults.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader

from specviz.cpu import build
from specviz.cpu.blocks import K_QUANTS
from specviz import cache_dir

FLAGS = {"avx2": build.X86, "vnni": build.X86 + build.VNNI["avx512_vnni"],
         "amx": build.X86 + build.VNNI["avx512_vnni"] + build.AMX, "portable": ("-DSPECVIZ_PORTABLE",)}


def library(source: Path, flags, out: Path) -> ctypes.CDLL:
    common = [f for f in build.COMMON if not f.startswith("-I")]
    sources = build.PORTABLE_SOURCES if "-DSPECVIZ_PORTABLE" in flags else build.X86_SOURCES
    subprocess.run(["cc", *common, f"-I{source}", *flags, "-fopenmp", *(str(source / s) for s in sources),
                    "-o", str(out), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.packs = hasattr(lib, "block_pack")          # an older commit's sources may have no packed copy
    lib.block_product.argtypes = [ctypes.c_int, ctypes.c_void_p, *[ctypes.c_void_p] * lib.packs, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_void_p]
    if lib.packs:
        lib.block_packed_bytes.restype = ctypes.c_size_t
        lib.block_packed_bytes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.block_scratch_bytes.restype = ctypes.c_size_t
    lib.block_scratch_bytes.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.block_amx()
    if hasattr(lib, "block_set_columns_from"):       # an older commit's sources may not take a count
        lib.block_set_columns_from.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def packed(lib, qtype: int, blocks: torch.Tensor, K: int, N: int) -> list:
    """The argument a library's block_product takes for the blocks' packed copy: none, or its pointer (or NULL)."""
    if not lib.packs:
        return []
    size = lib.block_packed_bytes(qtype, K, N)
    if not size:
        return [None]
    copy = torch.empty(size, dtype=torch.uint8)
    lib.block_pack(qtype, ctypes.c_void_p(blocks.data_ptr()), K, N, ctypes.c_void_p(copy.data_ptr()), 2)
    lib.kept.append(copy)
    return [copy.data_ptr()]


def sample_names(tensors: dict) -> dict[str, list[str]]:
    q6 = next(name for name, t in tensors.items() if name.endswith("ffn_down.weight") and t.tensor_type.name == "Q6_K")
    return {"layer 0's Q4_K products": [f"blk.0.{n}.weight" for n in ("ffn_gate", "ffn_up", "attn_q", "attn_output")],
            "a Q6_K ffn_down": [q6], "the output layer": ["output.weight"]}


def forward_names(tensors: dict) -> dict[str, list[str]]:
    """Every product of a forward by name (that of every layer in turn), and the output layer or the tied embedding"""
    layers = sorted({int(name.split(".")[1]) for name in tensors if name.startswith("blk.")})
    kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    named = {kind: [f"blk.{layer}.{kind}.weight" for layer in layers] for kind in kinds}
    named["output"] = ["output.weight" if "output.weight" in tensors else "token_embd.weight"]
    return named


def groups(path: Path, forward: bool = False) -> dict[str, list]:
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    named = forward_names(tensors) if forward else sample_names(tensors)
    out = {}
    for group, names in named.items():
        out[group] = []
        for name in names:
            t = tensors[name]
            N, K = int(t.shape[1]), int(t.shape[0])
            blocks = torch.from_numpy(np.array(t.data)).view(torch.uint8).reshape(N, -1).contiguous()
            out[group].append((int(t.tensor_type), blocks, K, N))
    return out


def main(argv: list[str]) -> None:
    sources, isa, out_json, rows = argv[0].split(","), argv[1], argv[2], [int(a) for a in argv[3:]]
    reps = int(os.environ.get("REPS", 7))
    flush = torch.zeros(2**24) if os.environ.get("FLUSH") else None    # 64 MB, more than a CPU's last-level cache
    path = Path(os.environ.get("GGUF", cache_dir() / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    with tempfile.TemporaryDirectory() as scratch_dir:
        builds = [s.partition("@")[::2] for s in sources]          # (folder, its own ISA or "")
        libs = [library(Path(folder), FLAGS[own or isa], Path(scratch_dir) / f"ab{i}.so")
                for i, (folder, own) in enumerate(builds)]
        counts = filter(None, os.environ.get("COLUMNS_FROM", "").split(","))
        for name, rows_from in (pair.split(":") for pair in counts):
            for lib in (lib for lib in libs if hasattr(lib, "block_set_columns_from")):
                lib.block_set_columns_from(K_QUANTS[name], int(rows_from))
        scratch = torch.empty(libs[0].block_scratch_bytes(8960, max(rows)) + 2**22, dtype=torch.uint8)
        report = {"isa": isa, "sources": sources, "file": path.name, "groups": {}}
        for group, products in groups(path, bool(os.environ.get("FORWARD"))).items():
            xs = {n: {K: torch.randn(n, K) for _, _, K, _ in products} for n in rows}
            for lib in libs:
                lib.kept = []
            copies = {(i, N): packed(lib, qtype, blocks, K, N)
                      for i, lib in enumerate(libs) for qtype, blocks, K, N in products}
            outs = {(i, n): {N: torch.empty(n, N) for *_, N in products} for i in range(len(libs)) for n in rows}
            best = {(i, n): float("inf") for i in range(len(libs)) for n in rows}
            for _ in range(reps):
                for n in rows:
                    for i, lib in enumerate(libs):
                        if flush is not None:
                            # the caches filled with other bytes, as a model's forward leaves them
                            flush.add_(1)
                        started = time.perf_counter()
                        for qtype, blocks, K, N in products:
                            lib.block_product(qtype, blocks.data_ptr(), *copies[(i, N)], K, N, xs[n][K].data_ptr(), n,
                                              outs[(i, n)][N].data_ptr(), N, 2, scratch.data_ptr())
                        best[(i, n)] = min(best[(i, n)], time.perf_counter() - started)
            macs = {n: n * sum(K * N for _, _, K, N in products) for n in rows}
            same = all(torch.equal(outs[(0, n)][N], outs[(i, n)][N])
                       for n in rows for i in range(1, len(libs)) for *_, N in products)
            print(f"{group} ({isa}): ms (G multiply-adds/s); the same bits: {same}")
            for i, source in enumerate(sources):
                speeds = (f"{n}: {best[(i, n)] * 1e3:7.2f} ({macs[n] / best[(i, n)] / 1e9:3.0f})" for n in rows)
                print(f"  {source:40s}", " ".join(speeds))
            report["groups"][group] = {"same_bits": same, "ms": {s: {n: best[(i, n)] * 1e3 for n in rows}
                                                                   for i, s in enumerate(sources)}}
    Path(out_json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
