#!/usr/bin/env bash
# Build llama.cpp's plain and speculative decoders and its benchmark into DEST/bin (default .venv/llama.cpp),
# from the llama.cpp source that the PyPI sdist of llama-cpp-python carries (no prebuilt binary can be
# downloaded here). Only the programs the bench and the app run are built, statically, for this CPU
# (GGML_NATIVE): llama-completion (plain decoding), llama-speculative-simple (llama.cpp's own draft-model
# speculation), llama-bench (its cost curve) and llama-perplexity (its logits' KL divergence to a reference, for the
# quality table). 3.5-5 minutes on 2 cores; skipped when built already.
# On a CPU with AMX, GGML_NATIVE takes ggml's AMX backend, which crashed on our VMs (a segfault in
# ggml_backend_amx_mul_mat at the first token): there the build names this CPU's other instruction sets instead.
# LLAMA_CPP_ISA=avx2 builds for AVX2 alone (into another DEST), to bench against specviz held to AVX2.
set -euo pipefail
VERSION=0.3.36                      # llama-cpp-python's sdist; its vendor/llama.cpp is what we build
TARGETS=(llama-completion llama-speculative-simple llama-bench llama-perplexity)
dest=$(realpath -m "${1:-.venv/llama.cpp}")
python=${PYTHON:-python3}
stamp="$dest/BUILT-FROM"
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$cpu_flags" == *" $1 "* ]]; }
on() { has "$1" && echo ON || echo OFF; }
if [[ "${LLAMA_CPP_ISA:-}" == avx2 ]]; then     # AVX2 only, as on most laptops: to compare with specviz held to AVX2
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2="$(on bmi2)"
         -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    flavour="AVX2 only"
elif has amx_int8; then
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2="$(on avx2)" -DGGML_FMA="$(on fma)" -DGGML_F16C="$(on f16c)"
         -DGGML_BMI2="$(on bmi2)" -DGGML_AVX_VNNI="$(on avx_vnni)" -DGGML_AVX512="$(on avx512f)"
         -DGGML_AVX512_VBMI="$(on avx512vbmi)" -DGGML_AVX512_VNNI="$(on avx512_vnni)" -DGGML_AVX512_BF16="$(on avx512_bf16)"
         -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    flavour="this CPU without AMX"
else
    isa=(-DGGML_NATIVE=ON)
    flavour="this CPU"
fi
built() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "llama-cpp-python $VERSION, ${TARGETS[*]}, for $flavour" ]] || return 1
    for t in "${TARGETS[@]}"; do [[ -x "$dest/bin/$t" ]] || return 1; done
}
if built; then
    echo "llama.cpp: already built in $dest/bin"
    exit 0
fi
for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "llama.cpp: not built ($tool is missing; bash scripts/setup.sh --with-browser installs it)"; exit 0; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "llama.cpp: fetching the source (llama-cpp-python $VERSION sdist, 77 MB) ..."
"$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
tar xzf "$work"/llama_cpp_python-$VERSION.tar.gz -C "$work" "llama_cpp_python-$VERSION/vendor/llama.cpp"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
echo "llama.cpp: configuring (static, for $flavour) ..."
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF "${isa[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log"; exit 1; }
echo "llama.cpp: building ${TARGETS[*]} on $(nproc) cores (3.5-5 minutes on 2) ..."
start=$SECONDS
cmake --build "$work/build" -j"$(nproc)" --target "${TARGETS[@]}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
mkdir -p "$dest/bin"
for t in "${TARGETS[@]}"; do install -m 755 "$work/build/bin/$t" "$dest/bin/$t"; done
cp "$src/LICENSE" "$dest/LICENSE"
echo "llama-cpp-python $VERSION, ${TARGETS[*]}, for $flavour" >"$stamp"
echo "llama.cpp: built in $((SECONDS - start)) s into $dest/bin"
