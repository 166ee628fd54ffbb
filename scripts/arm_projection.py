"""A projection of the gguf products' speed on ARM64, from instruction counts (no ARM machine here to time them).

Builds tests/block_driver.c with specviz's C library for ARM64 (NEON with and without the dot product) and for x86
(AVX2), runs each under qemu-user with one instruction per translated block, counts the instructions executed
(`-d exec`), and takes the difference between 128 and 64 outputs so that start-up and reading the inputs cancel out.
That gives instructions per weight per row, for 1 row (decoding) and 8 (a verification). The projection scales the
AVX2 build's measured cost (docs/BENCHMARKS.md's cost curve on this machine) by the ratio of instructions, which
assumes an ARM core retires these instructions as fast as this x86 core retires AVX2's: a projection, not a
measurement.
    .venv/bin/python scripts/arm_projection.py [--out docs/benchmarks/arm_projection.json]
"""
import argparse
import json
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specviz.cpu import reference  # noqa: E402
from specviz.cpu.build import C, PORTABLE_SOURCES  # noqa: E402

BUILDS = {"x86 AVX2": ("gcc", "qemu-x86_64", ("-mavx2", "-mfma", "-mf16c")),
          "ARM64 NEON + dot product": ("aarch64-linux-gnu-gcc", "qemu-aarch64", ("-march=armv8.2-a+dotprod",)),
          "ARM64 NEON": ("aarch64-linux-gnu-gcc", "qemu-aarch64", ("-march=armv8-a",))}
K, ROWS = 1536, (1, 8)
AVX2_CURVE = ROOT / "docs/benchmarks/cost_curve_qwen_gguf_avx2_build.json"   # the AVX2 build on this machine


def instructions(qemu: str, driver: Path, case: Path, work: Path) -> int:
    log = work / "exec.log"
    subprocess.run([qemu, "-singlestep", "-d", "exec,nochain", "-D", str(log), str(driver), str(case), str(work / "y")],
                   check=True, capture_output=True)
    return sum(1 for line in log.open() if line.startswith("Trace"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs/benchmarks/arm_projection.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arm-projection-"))
    rng = np.random.default_rng(0)
    cases = {}
    for N in (64, 128):
        for n in ROWS:
            w = reference.random_blocks(reference.Q4_K, N, K, rng)
            x = rng.standard_normal((n, K)).astype(np.float32)
            cases[N, n] = work / f"in-{N}-{n}.bin"
            cases[N, n].write_bytes(struct.pack("4i", reference.Q4_K, K, N, n) + w.tobytes() + x.tobytes())
    per_weight = {}
    for name, (compiler, qemu, flags) in BUILDS.items():
        driver = work / re.sub(r"\W+", "-", name)
        subprocess.run([compiler, "-O3", "-static", "-ffp-contract=off", f"-I{C}", *flags,
                        *(str(C / s) for s in PORTABLE_SOURCES), str(ROOT / "tests/block_driver.c"), "-o", str(driver),
                        "-lm"], check=True, capture_output=True)
        per_weight[name] = {n: (instructions(qemu, driver, cases[128, n], work) - instructions(qemu, driver, cases[64, n], work))
                            / (64 * K * n) for n in ROWS}
    curve = {int(k): v * 1e3 for k, v in json.loads(AVX2_CURVE.read_text())["seconds_per_forward"].items()}
    extra_avx2 = (curve[16] - curve[8]) / 8
    x86 = per_weight["x86 AVX2"]
    report = {"what": "instructions per weight per row of a Q4_K product (K=1536), counted under qemu-user; the projection "
                      "scales the AVX2 build's measured extra-token cost by the instruction ratio at 8 rows",
              "label": "projection", "instructions_per_weight_per_row": per_weight,
              "avx2_extra_token_ms_measured": round(extra_avx2, 1),
              "projected_extra_token_ms": {name: round(extra_avx2 * v[8] / x86[8], 1) for name, v in per_weight.items()}}
    print(f"{'build':<26} {'instr/weight, 1 row':>20} {'per row, 8 rows':>16} {'extra token (ms)':>18}")
    for name, v in per_weight.items():
        tag = "measured" if name == "x86 AVX2" else "projected"
        print(f"{name:<26} {v[1]:>20.3f} {v[8]:>16.3f} {report['projected_extra_token_ms'][name]:>11.1f} {tag}")
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
