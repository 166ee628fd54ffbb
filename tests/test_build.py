"""specviz/cpu/build.py: the builds tried on each kind of machine, best first; every build this machine can run,
forced in turn, loads and computes the same bits; a build that fails hands over to the next and the status says why."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.cpu import build

REPO = Path(__file__).resolve().parents[1]
X86_AVX512 = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512vl"]


def names(builds) -> list[str]:
    return [b.name + ("" if b.openmp else ", no OpenMP") for b in builds]


def test_the_builds_tried_on_each_kind_of_machine():
    assert names(build.candidates("x86_64", X86_AVX512, "")) == [
        "AVX2 + AVX512-VNNI", "AVX2", "portable C", "AVX2 + AVX512-VNNI, no OpenMP", "AVX2, no OpenMP",
        "portable C, no OpenMP"]
    assert names(build.candidates("x86_64", ["avx2", "fma", "avx_vnni"], ""))[:2] == ["AVX2 + AVX-VNNI", "AVX2"]
    assert names(build.candidates("x86_64", X86_AVX512 + ["amx_tile", "amx_int8"], ""))[:3] == [
        "AVX2 + AVX512-VNNI + AMX", "AVX2 + AVX512-VNNI", "AVX2"]                           # Sapphire Rapids on
    avx_vnni_with_tiles = ["avx2", "fma", "avx_vnni", "amx_tile", "amx_int8"]
    assert names(build.candidates("x86_64", avx_vnni_with_tiles, ""))[0] == "AVX2 + AVX-VNNI"
    assert names(build.candidates("x86_64", X86_AVX512, "avx2"))[0] == "AVX2"
    assert names(build.candidates("x86_64", X86_AVX512 + ["amx_tile", "amx_int8"], "vnni"))[0] == "AVX2 + AVX512-VNNI"
    assert names(build.candidates("x86_64", ["sse4_2"], "")) == ["portable C", "portable C, no OpenMP"]   # no AVX2
    assert names(build.candidates("aarch64", ["asimd", "asimddp"], "")) == [
        "NEON + dot product", "NEON", "portable C", "NEON + dot product, no OpenMP", "NEON, no OpenMP",
        "portable C, no OpenMP"]
    assert names(build.candidates("arm64", ["asimd"], ""))[0] == "NEON"                   # a Raspberry Pi 4
    assert names(build.candidates("x86_64", X86_AVX512, "portable")) == ["portable C", "portable C, no OpenMP"]
    rows = {b.name: b.rows for b in build.candidates("x86_64", X86_AVX512, "")}
    assert rows == {"AVX2 + AVX512-VNNI": True, "AVX2": True, "portable C": False}        # x86's products need AVX2


RUN = ("import sys, json, torch, numpy as np; from specviz.cpu import blocks, kernels, reference; "
       "rng = np.random.default_rng(0); w = reference.random_blocks(reference.Q4_K, 8, 512, rng); "
       "x = torch.from_numpy(rng.standard_normal((12, 512)).astype(np.float32)); "
       "q = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1)); "
       "kv = torch.randn(2, 1, 8, 16, generator=torch.Generator().manual_seed(2)); "
       "out = (blocks.product(reference.Q4_K, torch.from_numpy(w), x), "
       "kernels.attend(q, kv[0], kv[1], torch.ones(2, 2, dtype=torch.bool).tril(), 6, 0.25)); "
       "torch.save(out, sys.argv[1]); print(kernels.status())")


def forced(tmp_path, builds, cache: Path | None) -> tuple[str, tuple]:
    """The status and results of a fresh process whose build candidates are `builds`, its user cache `cache`
    (conftest's kernel_builds: fresh when the run starts; None: the user's, where setup built this machine's best)."""
    import torch
    code = ("import specviz.cpu.build as b; import pickle, sys; "
            "b.candidates = lambda *a: pickle.loads(bytes.fromhex(sys.argv[2])); " + RUN)
    import pickle
    out = tmp_path / "out.pt"
    env = {**os.environ, **({"SPECVIZ_CACHE": str(cache)} if cache else {})}
    done = subprocess.run([sys.executable, "-c", code, str(out), pickle.dumps(builds).hex()], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip(), torch.load(out)


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    return forced(tmp_path_factory.mktemp("best"), build.candidates()[:1], None)


def paths_to_force() -> list[int]:
    """Every instruction set this machine tries, with OpenMP, and the last without it (the same sources)."""
    builds = build.candidates()
    return [i for i, b in enumerate(builds) if b.openmp] + [len(builds) - 1]


@pytest.mark.slow
@pytest.mark.parametrize("which", paths_to_force())
def test_each_build_this_machine_runs_forced_gives_the_same_bits(tmp_path, best, kernel_builds, which):
    import torch
    chosen = build.candidates()[which]
    status, results = forced(tmp_path, [chosen], kernel_builds if which else None)
    assert status == f"{build.PREFIX}: {names([chosen])[0]}"
    assert all(torch.equal(a, b) for a, b in zip(results, best[1])), (status, best[0])


@pytest.mark.slow
def test_a_build_that_fails_hands_over_and_the_status_says_why(tmp_path, kernel_builds):
    broken = build.Build("AVX9", ("-mno-such-flag",), build.PORTABLE_SOURCES)
    portable = build.Build("portable C", ("-DSPECVIZ_PORTABLE",), build.PORTABLE_SOURCES)
    status, _ = forced(tmp_path, [broken, portable], kernel_builds)
    assert status.startswith(f"{build.PREFIX}: portable C (AVX9: ") and "no-such-flag" in status
    assert "\n" not in status
