"""The `gguf` precision's products (specviz/cpu/c/blocks.c) against their definition (specviz/cpu/reference.py, numpy)
bit for bit, for every block format a file of ours holds, on every instruction set this CPU runs (each built from the
same source, as a user's machine would build it), alone and in batches of any size; against de-quantise-then-multiply
within the activations' rounding; and at the boundary (shapes, types, NaN)."""
import ctypes
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specviz.cpu import blocks, kernels, reference
from specviz.cpu.__init__ import cpu_info
from specviz.cpu.build import C as BLOCKS
from specviz.cpu.kernels import KernelInputError

TYPES = list(reference.BLOCK)
SIMD = cpu_info()[1]
BUILDS = {"portable": ("-DSPECVIZ_PORTABLE",), "avx2": ("-mavx2", "-mfma", "-mf16c"),
          "avx512-vnni": ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")}
BUILDS["amx"] = BUILDS["avx512-vnni"] + ("-mamx-tile", "-mamx-int8")
RUNS_HERE = {"portable": True, "avx2": {"avx2", "fma", "f16c"} <= set(SIMD),
             "avx512-vnni": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(SIMD)}
RUNS_HERE["amx"] = RUNS_HERE["avx512-vnni"] and {"amx_tile", "amx_int8"} <= set(SIMD)


def build(tmp_path, flags, source: str | None = None) -> ctypes.CDLL:
    """blocks.c (or a changed copy of its text) built alone with these flags."""
    c_file = tmp_path / "blocks.c"
    c_file.write_text(source if source is not None else (BLOCKS / "blocks.c").read_text())
    library = tmp_path / f"blocks-{abs(hash(flags))}.so"
    subprocess.run(["cc", "-O2", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off", f"-I{BLOCKS}", *flags,
                    str(c_file), "-o", str(library)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(library))
    lib.block_product.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p]
    lib.block_scratch_bytes.restype = ctypes.c_size_t
    lib.block_packed_bytes.restype = ctypes.c_size_t
    lib.block_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    if "-mamx-int8" in flags:
        assert lib.block_amx() == 1, "the CPU has AMX but the OS did not allow its tiles to this process"
    return lib


def run(lib, qtype, w, x, threads=2, packed=True):
    """The product by this library, many rows taking the packed blocks where its build has them (packed=False:
    never)."""
    n, K = x.shape
    y = np.full((n, len(w)), np.nan, np.float32)
    scratch = np.zeros(lib.block_scratch_bytes(K, n), np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    copy = np.zeros(lib.block_packed_bytes(qtype, K, len(w)) if packed else 0, np.uint8)
    if copy.size:
        assert lib.block_pack(qtype, w.ctypes.data, K, len(w), copy.ctypes.data, threads) == 0
    assert lib.block_product(qtype, w.ctypes.data, copy.ctypes.data if copy.size else None, K, len(w), x.ctypes.data,
                             n, y.ctypes.data, len(w), threads, scratch.ctypes.data) == 0
    return y


def case(qtype, rows, outputs, seed, blocks_per_row=2):
    rng = np.random.default_rng(seed)
    K = reference.BLOCK[qtype][0] * blocks_per_row
    x = rng.standard_normal((rows, K)).astype(np.float32) * rng.uniform(0.01, 10)
    x[rng.random(x.shape) < 0.05] = 0.0                     # zeros, and a whole block of them sometimes
    return reference.random_blocks(qtype, outputs, K, rng), x


def sink_case(qtype, rows, outputs, seed, blocks_per_row=2):
    """As case(), with every third row an attention sink's: one value thousands of times the rest, which int8 rounding
    would crush the rest of its block against, so that the row is rounded twice."""
    w, x = case(qtype, rows, outputs, seed, blocks_per_row)
    rng = np.random.default_rng(seed)
    for r in range(0, rows, 3):
        x[r, rng.integers(x.shape[1])] = rng.choice([-1, 1]) * rng.uniform(500, 5000) * np.abs(x[r]).max()
    return w, x


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.fail("no C compiler: scripts/setup.sh installs one")
    return {name: build(tmp_path_factory.mktemp(name), flags) for name, flags in BUILDS.items() if RUNS_HERE[name]}


@pytest.mark.parametrize("qtype", TYPES, ids=reference.NAMES.values())
def test_every_build_computes_the_definition_bit_for_bit(libraries, qtype):
    assert "portable" in libraries and ("avx2" in libraries or "avx2" not in SIMD)
    # ragged outputs too; each side of the AVX2 columns' 3 and 5 rows and of the AVX-512 columns' 6 and 8 (in rows of
    # 17 blocks; 32 in short ones); past one group of 16 rows for the AMX tiles, and past the 128 rows a tile of
    # outputs keeps
    shapes = [(1, 4, 2), (2, 13, 2), (3, 8, 2), (4, 11, 2), (5, 6, 2), (6, 19, 2), (7, 9, 2), (7, 16, 17), (8, 21, 17),
              (16, 33, 2), (31, 5, 2), (32, 5, 2), (40, 17, 2), (130, 3, 2)]
    for seed, (rows, outputs, blocks_per_row) in enumerate(shapes):
        w, x = case(qtype, rows, outputs, seed, blocks_per_row)
        expected = reference.product(qtype, w, x)
        for name, lib in libraries.items():
            for packed in (True, False):
                assert np.array_equal(run(lib, qtype, w, x, packed=packed), expected), (name, rows, outputs, packed)


@pytest.mark.parametrize("qtype", TYPES, ids=reference.NAMES.values())
def test_a_row_that_rounding_crushes_is_rounded_twice_on_every_build(libraries, qtype):
    """An attention sink's row (one value thousands of times the others) loses the rest of its block to int8: every
    build rounds its remainder again and adds that product, as the definition does, and only for such rows."""
    for seed, (rows, outputs, blocks_per_row) in enumerate([(1, 5, 2), (4, 9, 2), (7, 16, 17), (40, 6, 2)]):
        w, x = sink_case(qtype, rows, outputs, seed, blocks_per_row)
        coarse = reference.coarse_rows(qtype, x, reference.quantize_rows(qtype, x))
        assert list(coarse) == [r % 3 == 0 for r in range(rows)]
        expected = reference.product(qtype, w, x)
        for name, lib in libraries.items():
            for packed in (True, False):
                assert np.array_equal(run(lib, qtype, w, x, packed=packed), expected), (name, rows, packed)
    # and rounding twice is what brings the sink's row back to the file's model: int16's precision, not int8's (Q4_1
    # keeps Q8_1's sum of the row's block as a half, whose rounding then dominates)
    exact = x.astype(np.float64) @ reference.dequantize(qtype, w).T
    once = reference._rounded_product(qtype, w, x, reference.quantize_rows(qtype, x))
    gain = 3 if qtype == reference.Q4_1 else 20
    assert np.abs(expected - exact)[0].max() < np.abs(once - exact)[0].max() / gain


def test_the_header_and_the_definition_agree_on_the_rounding_rule():
    from specviz.cpu import build
    assert reference.ROUNDING_LOSS_LIMIT == build.CONSTANTS["ROUNDING_LOSS_LIMIT"]


def test_a_rule_applied_by_batch_instead_of_by_row_fails_these_tests(tmp_path):
    """The invariance test can fail for the rounding rule too: rounding every row of a batch twice once any of them
    needs it gives an ordinary row other bits beside a sink's row than alone."""
    source = (BLOCKS / "blocks.c").read_text()
    marker = "    *rows = (Rows){q, d, sx, bsum, sum, coarse, K, blocks, count};"
    assert source.count(marker) == 1
    mutated = source.replace(marker, "    if (count) memset(coarse, 1, n), count = n;\n" + marker)
    lib = build(tmp_path, BUILDS["portable"], mutated)
    w, x = sink_case(reference.Q4_K, 3, 8, seed=2)
    assert np.array_equal(run(lib, reference.Q4_K, w, x[1:2])[0], reference.product(reference.Q4_K, w, x[1:2])[0])
    assert np.array_equal(run(lib, reference.Q4_K, w, x[:1])[0], reference.product(reference.Q4_K, w, x[:1])[0])
    assert not np.array_equal(run(lib, reference.Q4_K, w, x)[1], reference.product(reference.Q4_K, w, x)[1])


@given(qtype=st.sampled_from(TYPES), rows=st.integers(1, 32), outputs=st.integers(1, 24), seed=st.integers(0, 2**16),
       sinks=st.booleans())
def test_a_row_gets_the_same_bits_alone_or_with_up_to_31_others(qtype, rows, outputs, seed, sinks):
    w, x = (sink_case if sinks else case)(qtype, rows, outputs, seed)
    w_ = torch.from_numpy(w)
    together = blocks.product(qtype, w_, torch.from_numpy(x), blocks.packed(qtype, w_, x.shape[1]))
    for r in {0, rows // 2, rows - 1}:
        alone = blocks.product(qtype, torch.from_numpy(w), torch.from_numpy(x[r:r + 1]))
        assert torch.equal(alone[0], together[r])


def test_a_kernel_that_sums_in_another_order_for_many_rows_fails_these_tests(tmp_path):
    """The invariance test can fail: the same kernel with one float product regrouped where a tile meets more rows
    than one group of registers gives rows other bits in a batch than alone."""
    source = (BLOCKS / "blocks.c").read_text()
    marker = "finish_k_quant(type, &u->k, R, wide, x, b, r0, acc);"
    assert source.count(marker) == 1
    mutated = source.replace(marker, marker + "\n"
                             "    for (int r = 0; r < R; r++) acc[r] = f4_mul(acc[r], f4_dup(1.0f + 1e-7f));")
    lib = build(tmp_path, BUILDS["portable"], mutated)
    w, x = case(reference.Q4_K, 12, 8, seed=1)
    assert np.array_equal(run(lib, reference.Q4_K, w, x[:1])[0], reference.product(reference.Q4_K, w, x[:1])[0])
    assert not np.array_equal(run(lib, reference.Q4_K, w, x)[0], reference.product(reference.Q4_K, w, x)[0])


@pytest.mark.parametrize("name, vector, blocks_per_row", [("avx2", "_mm256", 4), ("avx512-vnni", "_mm512", 17)])
def test_a_columns_product_that_sums_in_another_order_fails_these_tests(tmp_path, name, vector, blocks_per_row):
    """The same for the columns of K-quant blocks (columns.h, on their packed copy): the AVX2 build's 8 outputs at a
    time (Q4_K from one row, Q6_K from 4), the AVX512-VNNI build's 16 (Q4_K from one row, Q6_K from 5). One float
    product regrouped there gives a batch's rows other bits than the definition, while the tiles (no packed copy)
    still give them."""
    if not RUNS_HERE[name]:
        pytest.skip(f"an x86 build: this CPU does not run {name}")
    source = (BLOCKS / "blocks.c").read_text().replace('#include "columns.h"', (BLOCKS / "columns.h").read_text())
    marker = f"acc[r] = {vector}_add_ps(acc[r], "
    assert source.count(marker) == 2
    regrouped = f"acc[r] = {vector}_add_ps({vector}_mul_ps(acc[r], {vector}_set1_ps(1.0f + 1e-7f)), "
    mutated = source.replace(marker, regrouped)
    lib = build(tmp_path, BUILDS[name], mutated)
    for qtype in (reference.Q4_K, reference.Q6_K):
        w, x = case(qtype, 12, 8, seed=1, blocks_per_row=blocks_per_row)
        assert np.array_equal(run(lib, qtype, w, x, packed=False), reference.product(qtype, w, x))
        assert not np.array_equal(run(lib, qtype, w, x)[0], reference.product(qtype, w, x)[0])


def test_an_amx_product_that_sums_in_another_order_fails_these_tests(tmp_path):
    """The same for the AMX tiles' path (many rows of a K-quant): one float product regrouped there gives a row in a
    batch other bits than alone (alone, a row takes the VNNI path). Built on every x86 machine; run where AMX is."""
    source = (BLOCKS / "blocks.c").read_text()
    marker = "fz_store(acc[o], fz_add(fz_load(acc[o]), t));"
    assert source.count(marker) == 1
    mutated = source.replace(marker, "fz_store(acc[o], fz_add(fz_load(acc[o]), fz_mul(t, fz_dup(1.0f + 1e-7f))));")
    if not RUNS_HERE["amx"]:
        # the mutant still has to compile (the AMX source stays built on every x86 CI machine)
        subprocess.run(["cc", "-O2", "-fopenmp", "-fsyntax-only", f"-I{BLOCKS}", *BUILDS["amx"], "-x", "c", "-"],
                       input=mutated, text=True, check=True, capture_output=True)
        return
    lib = build(tmp_path, BUILDS["amx"], mutated)
    for qtype, rows in [(reference.Q4_K, 12), (reference.Q6_K, 12)]:
        w, x = case(qtype, rows, 8, seed=1)
        assert np.array_equal(run(lib, qtype, w, x[:1])[0], reference.product(qtype, w, x[:1])[0])
        assert not np.array_equal(run(lib, qtype, w, x)[0], reference.product(qtype, w, x)[0])


@pytest.mark.parametrize("qtype", TYPES, ids=reference.NAMES.values())
def test_the_codes_are_the_files_weights_and_the_product_is_theirs_within_the_rounding_of_the_inputs(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w, x = case(qtype, 6, 40, seed=7, blocks_per_row=4)
    weights = reference.dequantize(qtype, w)
    assert np.array_equal(weights.astype(np.float32), dequantize(w, GGMLQuantizationType(qtype)).reshape(weights.shape))
    exact = x.astype(np.float64) @ weights.T
    got = blocks.product(qtype, torch.from_numpy(w), torch.from_numpy(x)).numpy()
    # each input rounded to 1/254 of its block's largest magnitude: the error is a sum of K such steps, weighted
    bound = np.abs(x).max(1, keepdims=True) / 127 * np.abs(weights).sum(1)[None, :]
    assert np.all(np.abs(got - exact) <= bound)
    assert np.abs(got - exact).mean() < 0.1 * bound.mean()


def test_a_layer_of_the_files_blocks_gives_the_c_layer_loop_its_packed_copy():
    """Builds whose many-row products read a packed copy (AVX2, and AVX512-VNNI without AMX) get one for each K-quant
    layer, made once, and the layer loop's products point to it; the layer's products stay the definition's."""
    from specviz.cpu.layer_loop import _product
    w, x = case(reference.Q4_K, 8, 40, seed=5)
    layer = blocks.BlockLinear(reference.Q4_K, torch.from_numpy(w), x.shape[1])
    size = blocks._kernel().block_packed_bytes(reference.Q4_K, x.shape[1], 40)
    assert (size > 0) == (blocks.simd() in ("AVX2", "AVX2 + AVX512-VNNI"))
    copy = layer.packed_blocks()
    assert layer.packed_blocks() is copy and (copy is None if not size else copy.numel() == size)
    assert _product(layer).packed == (None if copy is None else copy.data_ptr())
    assert torch.equal(layer(torch.from_numpy(x)), torch.from_numpy(reference.product(reference.Q4_K, w, x)))


def test_bad_inputs_stop_with_one_line():
    w, x = case(reference.Q4_K, 2, 8, seed=3)
    w, x = torch.from_numpy(w), torch.from_numpy(x)
    for bad, fragment in [((99, w, x), "block type 99"), ((reference.Q4_K, w, x[:, :100]), "multiple"),
                          ((reference.Q4_K, w[:, :-1], x), "shape"), ((reference.Q4_K, w, x.double()), "float32"),
                          ((reference.Q4_K, w, x[0]), r"\[n, in\]")]:
        with pytest.raises(KernelInputError, match=fragment) as error:
            blocks.product(*bad)
        assert "\n" not in str(error.value)
    x[1, 5] = float("nan")
    with pytest.raises(KernelInputError, match="not finite"):
        blocks.product(reference.Q4_K, w, x)


def test_the_library_reports_the_instruction_set_it_was_built_for():
    from specviz.cpu import build
    assert kernels.available() and blocks.simd() == build.library()[1].name and blocks.simd() in kernels.status()


def test_the_library_is_named_by_its_sources_and_flags_not_by_where_the_checkout_lies(tmp_path, monkeypatch):
    """A clone elsewhere finds the library, and the machine profile keyed by its name, that setup made here."""
    import shutil

    from specviz.cpu import build
    chosen = build.library()[1]
    here = build.library_name("gcc", chosen)
    moved = shutil.copytree(build.C, tmp_path / "elsewhere" / "c")
    monkeypatch.setattr(build, "C", moved)
    monkeypatch.setattr(build, "COMMON", tuple(f"-I{moved}" if f.startswith("-I") else f for f in build.COMMON))
    assert str(moved) in " ".join(chosen.command("gcc", tmp_path / "out"))
    assert build.library_name("gcc", chosen) == here
    assert build.library_name("clang", chosen) != here                  # another command is another library
    source = moved / chosen.sources[0]
    source.write_bytes(source.read_bytes() + b"\n")
    assert build.library_name("gcc", chosen) != here                    # and so is a changed source


def test_the_header_and_the_definition_agree_on_the_formats():
    from specviz.cpu import build
    for name, qtype in build.CONSTANTS.items():
        if name.startswith("GGUF_"):
            assert reference.NAMES[qtype] == name.removeprefix("GGUF_")
            kernel = blocks._kernel()
            assert (kernel.block_weights(qtype), kernel.block_bytes(qtype)) == reference.BLOCK[qtype]
    assert {build.CONSTANTS[f"GGUF_{n}"] for n in reference.NAMES.values()} == set(reference.BLOCK)


CROSS = "aarch64-linux-gnu-gcc"
ARM_BUILDS = {"neon": "armv8-a", "neon-dotprod": "armv8.2-a+dotprod"}     # a Raspberry Pi 4; Apple Silicon, Graviton


def test_arm64_builds_compute_the_definition_bit_for_bit_under_emulation(tmp_path):
    """ARM64's NEON helpers (with and without the dot-product extension) give the same bits as the definition, and so
    as x86, on every format, and attention gives the bits this machine's build gives: the kernels cross-compiled with a
    test driver (tests/block_driver.c) and run by qemu."""
    native = platform.machine() in ("aarch64", "arm64")           # on an ARM64 machine: built and run as they are
    compiler, runner = ("cc", []) if native else (CROSS, ["qemu-aarch64", "-cpu", "max"])
    if shutil.which(compiler) is None or (runner and shutil.which(runner[0]) is None):
        pytest.fail("no ARM64 cross compiler or qemu-user: scripts/setup.sh --with-browser installs them")
    driver = Path(__file__).with_name("block_driver.c")
    sources = [str(BLOCKS / "blocks.c"), str(BLOCKS / "row_attention.c"), str(driver)]
    here = tmp_path / "here"
    subprocess.run(["cc", "-O2", "-ffp-contract=off", "-Wno-unknown-pragmas", f"-I{BLOCKS}", *sources, "-o", str(here),
                    "-lm"], check=True, capture_output=True)
    attention = subprocess.run([str(here), "attend"], capture_output=True, text=True, check=True).stdout
    for name, arch in ARM_BUILDS.items():
        program = tmp_path / name
        subprocess.run([compiler, "-O2", *([] if native else ["-static"]), f"-march={arch}", "-ffp-contract=off",
                        "-Wno-unknown-pragmas", f"-I{BLOCKS}", *sources, "-o", str(program), "-lm"], check=True,
                       capture_output=True)
        attended = subprocess.run([*runner, str(program), "attend"], capture_output=True, text=True).stdout
        assert attended == attention, name
        for seed, qtype in enumerate(TYPES):
            w, x = sink_case(qtype, rows=5, outputs=11, seed=seed)         # rows 0 and 3 rounded twice
            given, got = tmp_path / "in.bin", tmp_path / "out.bin"
            header = np.array([qtype, x.shape[1], len(w), len(x)], np.int32)
            given.write_bytes(header.tobytes() + w.tobytes() + x.tobytes())
            run = subprocess.run([*runner, str(program), str(given), str(got)], capture_output=True, text=True)
            assert run.returncode == 0 and run.stderr.strip() == ("NEON + dot product" if "dotprod" in name else "NEON")
            product = np.fromfile(got, np.float32).reshape(len(x), len(w))
            assert np.array_equal(product, reference.product(qtype, w, x)), (name, reference.NAMES[qtype])
