"""`python -m specviz.bench.floors`: the two limits of this machine that bound a forward on the CPU.

- **Memory**: how fast two threads read a 1 GiB buffer (a one-token forward reads every weight once, so its time
  cannot be below the weights' bytes over this).
- **Compute**: how many u8 x s8 multiply-adds per second two threads reach with chained integer dot products, on
  AVX2 (`vpmaddubsw` + `vpmaddwd` + `vpaddd`, 32 per 3 instructions) and, where the CPU has it, AVX512-VNNI
  (`vpdpbusd` on 512-bit registers, 64 per instruction), and AMX tiles where the CPU and the OS allow them (`tdpbusd`,
  16 x 16 x 64 per instruction): every row fed to a quantized product costs at least its weights over the fastest.

Each is a small C program built here with the machine's compiler, run with 2 threads, best of 5. Prints both and,
with --model, what they mean for a GGUF file's layers: the floor of one token, and of each extra row. --out writes
JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ..cpu import cpu_info

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static double memory(void) {
    const size_t n = (size_t)1 << 30;
    char *p = aligned_alloc(64, n);
    memset(p, 1, n);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = omp_get_wtime();
        long long sink = 0;
        #pragma omp parallel num_threads(2) reduction(+:sink)
        {
            __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
            #pragma omp for
            for (size_t i = 0; i < n; i += 64) {
                a = _mm256_add_epi8(a, _mm256_load_si256((const __m256i *)(p + i)));
                b = _mm256_add_epi8(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
            }
            sink += _mm256_extract_epi64(_mm256_add_epi8(a, b), 0);
        }
        t = omp_get_wtime() - t;
        if (sink == 42) puts("");
        if (n / t > best) best = n / t;
    }
    free(p);
    return best;
}

#define CHAINS 12               /* independent accumulators: enough to hide each instruction's latency */
#define STEPS 20000000L

/* The chains unrolled, so that the accumulators stay in registers: a loop over them in memory measures how fast the
 * core stores and reloads them, not its multipliers (on a Zen 4, 204 G/s for VNNI where the multipliers reach 470) */
#define UNROLL_CHAINS _Pragma("GCC unroll 16")

/* one run of a chained dot-product loop on two threads; the weights are made opaque at each use, so that no two
 * products fold into one */
static long long avx2_run(void) {
    long long sink = 0;
    #pragma omp parallel num_threads(2) reduction(+:sink)
    {
        __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-5), ones = _mm256_set1_epi16(1), acc[CHAINS];
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_setzero_si256();
        for (long s = 0; s < STEPS; s++)
            UNROLL_CHAINS for (int c = 0; c < CHAINS; c++) {
                __asm__("" : "+x"(w));
                acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
            }
        for (int c = 0; c < CHAINS; c++) sink += _mm256_extract_epi32(acc[c], 0);
    }
    return sink;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
static long long vnni512_run(void) {
    long long sink = 0;
    #pragma omp parallel num_threads(2) reduction(+:sink)
    {
        __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-5), acc[CHAINS];
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_setzero_si512();
        for (long s = 0; s < STEPS; s++)
            UNROLL_CHAINS for (int c = 0; c < CHAINS; c++) {
                __asm__("" : "+v"(w));
                acc[c] = _mm512_dpbusd_epi32(acc[c], w, x);
            }
        for (int c = 0; c < CHAINS; c++) sink += _mm512_reduce_add_epi32(acc[c]);
    }
    return sink;
}
#endif

#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define AMX_STEPS (STEPS / 8)
/* four accumulator tiles, each product 16 x 16 x 64 multiply-adds, chained on two threads */
static long long amx_run(void) {
    long long sink = 0;
    #pragma omp parallel num_threads(2) reduction(+:sink)
    {
        struct { unsigned char palette, start, reserved[14]; unsigned short colsb[16]; unsigned char rows[16]; }
            __attribute__((aligned(64))) cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
        _tile_loadconfig(&cfg);
        signed char a[16 * 64] __attribute__((aligned(64)));
        int c[16 * 16] __attribute__((aligned(64)));
        memset(a, 3, sizeof a);
        _tile_loadd(4, a, 64); _tile_loadd(5, a, 64); _tile_loadd(6, a, 64); _tile_loadd(7, a, 64);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long s = 0; s < AMX_STEPS; s++) {
            _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
        }
        _tile_stored(0, c, 64);
        sink += c[0];
        _tile_release();
    }
    return sink;
}
#endif

/* u8 x s8 multiply-adds per second of a run (macs: those of one run on both threads), best of 5 */
static double rate(long long (*run)(void), double macs) {
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = omp_get_wtime();
        if (run() == 42) puts("");
        t = omp_get_wtime() - t;
        if (macs / t > best) best = macs / t;
    }
    return best;
}

int main(void) {
    printf("{\"read_bytes_per_s\": %.6g", memory());
    printf(", \"avx2_macs_per_s\": %.6g", rate(avx2_run, 2.0 * STEPS * CHAINS * 32));
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    printf(", \"avx512_vnni_macs_per_s\": %.6g", rate(vnni512_run, 2.0 * STEPS * CHAINS * 64));
#endif
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0)
        printf(", \"amx_macs_per_s\": %.6g", rate(amx_run, 2.0 * AMX_STEPS * 4 * 16 * 16 * 64));
#endif
    puts("}");
    return 0;
}
"""


def measure() -> dict:
    simd = cpu_info()[1]
    flags = ["-O2", "-mavx2", "-fopenmp"]
    flags += ["-mavx512f", "-mavx512bw", "-mavx512vnni"] if "avx512_vnni" in simd else []
    flags += ["-mamx-tile", "-mamx-int8"] if {"amx_tile", "amx_int8"} <= set(simd) else []
    with tempfile.TemporaryDirectory() as folder:
        source, program = Path(folder) / "floors.c", Path(folder) / "floors"
        source.write_text(SOURCE)
        subprocess.run(["cc", *flags, str(source), "-o", str(program)], check=True, capture_output=True)
        return json.loads(subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout)


def file_floors(model: str, floors: dict) -> dict:
    """A GGUF file's decoder layers: their bytes and multiply-adds per row, and the floors those give."""
    from ..cpu.file_model import tensors
    from ..models.load import resolve
    location, gguf_file = resolve(model)
    layers = {name: data for name, (qtype, data) in tensors(Path(location) / gguf_file).items()
              if name.startswith("blk.") and name.endswith(".weight") and qtype not in (0, 1)}
    weight_bytes = sum(data.nbytes for data in layers.values())
    import gguf
    macs = 0
    for name, data in layers.items():
        qtype = tensors(Path(location) / gguf_file)[name][0]
        per, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        macs += data.size // size * per
    best_macs = max(v for k, v in floors.items() if k.endswith("macs_per_s"))
    return {"model": model, "layer_bytes": weight_bytes, "macs_per_row": macs,
            "one_token_floor_ms": 1e3 * weight_bytes / floors["read_bytes_per_s"],
            "extra_row_floor_ms": 1e3 * macs / best_macs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.bench.floors", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="a GGUF model spec, or '' for none")
    parser.add_argument("--out", help="a JSON file")
    args = parser.parse_args(argv)
    try:
        floors = measure()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: the micro-benchmarks did not build or run here: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"machine: {cpu_info()[0]}, SIMD {' '.join(cpu_info()[1])}")
    print(f"memory read, 2 threads: {floors['read_bytes_per_s'] / 1e9:.1f} GB/s")
    print(f"u8 x s8 multiply-adds, 2 threads, AVX2: {floors['avx2_macs_per_s'] / 1e9:.0f} G/s"
          + (f"; AVX512-VNNI (512-bit): {floors['avx512_vnni_macs_per_s'] / 1e9:.0f} G/s"
             if "avx512_vnni_macs_per_s" in floors else "")
          + (f"; AMX tiles: {floors['amx_macs_per_s'] / 1e9:.0f} G/s" if "amx_macs_per_s" in floors else ""))
    report = {"floors": floors}
    if args.model:
        model = file_floors(args.model, floors)
        report["model"] = model
        print(f"{args.model}'s layers: {model['layer_bytes'] / 1e9:.2f} GB, {model['macs_per_row'] / 1e9:.2f} G "
              f"multiply-adds a row: one token >= {model['one_token_floor_ms']:.1f} ms, each extra row >= "
              f"{model['extra_row_floor_ms']:.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
