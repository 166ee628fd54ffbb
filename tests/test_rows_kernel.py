"""specviz's few-row float32 kernel (specviz/cpu/kernels.py): the linear product up to float rounding,
each row's bits independent of the rows fed with it, and torch's product wherever it cannot run."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specviz.cpu import cpu_info, kernels
from specviz.cpu.matmul import rows_product

REPO = Path(__file__).resolve().parents[1]
CAN_BUILD = (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
             and any(shutil.which(c) for c in ("cc", "gcc", "clang")))


def test_it_runs_wherever_a_compiler_and_avx2_are_here():
    assert kernels.rows_available() == CAN_BUILD, kernels.status()
    vnni = any(f in cpu_info()[1] for f in ("avx512_vnni", "avx_vnni"))
    assert kernels.status().startswith(f"{kernels.KERNEL}: AVX2" + (" + " if vnni else "")) == CAN_BUILD


@pytest.mark.parametrize("out_features", [1, 2, 3, 7, 8, 9, 24, 250])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16])
def test_each_row_is_the_linear_product_whatever_rows_come_with_it(n, out_features):
    if not CAN_BUILD:
        pytest.skip("no compiler or no AVX2 here: the product is torch's (tested in tests/test_cpu_matmul.py)")
    torch.manual_seed(n * 1000 + out_features)
    weight, rows = torch.randn(out_features, 72), torch.randn(n, 72)
    out = kernels.product(weight, rows)
    assert torch.allclose(out, F.linear(rows, weight), atol=1e-4)
    for r in range(n):                     # bit for bit what this row alone gets, as plain decoding feeds it
        assert torch.equal(kernels.product(weight, rows[r:r + 1]), out[r:r + 1])
    assert torch.equal(kernels.product(weight, torch.randn(72, n).T.copy_(rows)), out)   # any row layout


def test_shapes_and_types_it_does_not_take_go_to_torch():
    weight, rows = torch.randn(16, 72), torch.randn(3, 72)
    assert kernels.product(torch.randn(16, 70), torch.randn(3, 70)) is None         # width not a multiple of 8
    assert kernels.product(weight.bfloat16(), rows.bfloat16()) is None
    assert kernels.product(torch.randn(72, 16).T, rows) is None                     # a transposed weight
    for case in [(torch.randn(16, 70), torch.randn(3, 70)), (torch.randn(72, 16).T, rows)]:
        assert torch.allclose(rows_product(*case), F.linear(case[1], case[0]), atol=1e-4)


def _status_in_a_fresh_process(env: dict) -> str:
    code = ("import torch; from specviz.cpu import kernels, matmul; w, x = torch.randn(40, 64), torch.randn(2, 64); "
            "assert torch.allclose(matmul.rows_product(w, x), x @ w.T, atol=1e-4); print(kernels.status())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_switched_off_or_without_a_compiler_it_says_so_and_torch_multiplies(tmp_path):
    off = "torch (specviz's kernels are off: SPECVIZ_ROWS_KERNEL=0)"
    assert _status_in_a_fresh_process({kernels.SWITCH: "0"}) == off
    bare = tmp_path / "bin"                    # a PATH with python but no C compiler, and an empty cache
    bare.mkdir()
    status = _status_in_a_fresh_process({"PATH": str(bare), "SPECVIZ_CACHE": str(tmp_path / "cache")})
    assert status == "torch (no C compiler to build specviz's kernels)"
    assert not (tmp_path / "cache" / "kernels").exists()
    if CAN_BUILD:                              # a fresh cache: built on first use
        assert _status_in_a_fresh_process({"SPECVIZ_CACHE": str(tmp_path / "fresh")}).startswith(kernels.KERNEL)
        assert len(list((tmp_path / "fresh" / "kernels").glob("specviz-*.so"))) == 1
