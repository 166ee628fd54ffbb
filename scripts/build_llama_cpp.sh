#!/usr/bin/env bash
# Build llama.cpp's plain and speculative decoders and its benchmark into DEST/bin (default .venv/llama.cpp),
# from the llama.cpp source that the PyPI sdist of llama-cpp-python carries (no prebuilt binary can be
# downloaded here). Only the three programs the bench and the app run are built, statically, for this CPU
# (GGML_NATIVE): llama-completion (plain decoding), llama-speculative-simple (llama.cpp's own draft-model
# speculation) and llama-bench (its cost curve). 3.5-5 minutes on 2 cores; skipped when built already.
set -euo pipefail
VERSION=0.3.36                      # llama-cpp-python's sdist; its vendor/llama.cpp is what we build
TARGETS=(llama-completion llama-speculative-simple llama-bench)
dest=$(realpath -m "${1:-.venv/llama.cpp}")
python=${PYTHON:-python3}
stamp="$dest/BUILT-FROM"
built() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "llama-cpp-python $VERSION" ]] || return 1
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
echo "llama.cpp: configuring (static, for this CPU) ..."
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log"; exit 1; }
echo "llama.cpp: building ${TARGETS[*]} on $(nproc) cores (3.5-5 minutes on 2) ..."
start=$SECONDS
cmake --build "$work/build" -j"$(nproc)" --target "${TARGETS[@]}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
mkdir -p "$dest/bin"
for t in "${TARGETS[@]}"; do install -m 755 "$work/build/bin/$t" "$dest/bin/$t"; done
cp "$src/LICENSE" "$dest/LICENSE"
echo "llama-cpp-python $VERSION" >"$stamp"
echo "llama.cpp: built in $((SECONDS - start)) s into $dest/bin"
