"""A drafter spec "trigram:auto": a Katz-backoff trigram built for the target's tokenizer on first use
and cached under the user cache directory, so any preset gets its stage-2 drafter without a download.
It counts Python source that ships with Python, plus the text the stack's draft model wrote where the
project ships some (assets/draft_text/, made by `python -m specviz.train draft-text`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import sysconfig
from pathlib import Path
from typing import Sequence

from ..decode.drafters.ngram import KatzTrigram
from .. import ASSETS, cache_dir

DRAFT_TEXT = ASSETS / "draft_text"
DRAFT_TEXT_WEIGHT = 16     # each draft-written text counts 16 times, the weight that guessed the draft best


def python_source_files(limit_bytes: int = 8_000_000) -> list[Path]:
    """Python's own standard library source: text every machine with Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        size = path.stat().st_size
        if total + size > limit_bytes:
            break
        files.append(path)
        total += size
    return files


def draft_text_path(spec: str) -> Path:
    """Where the text written by the draft model `spec` ships."""
    return DRAFT_TEXT / f"{Path(spec).name}.jsonl.gz"


def read_draft_text(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines if line.strip()]


def draft_texts(specs: Sequence[str]) -> list[Path]:
    """The shipped draft-written text files for these drafter specs."""
    return [p for p in map(draft_text_path, specs) if p.is_file()]


def auto_trigram(tokenizer, name: str, texts: Sequence[Path] = (), limit_bytes: int = 8_000_000,
                 weight: int = DRAFT_TEXT_WEIGHT):
    """A trigram for this tokenizer, built once from the standard library's source and the draft-written
    `texts` (each counted `weight` times), and cached under a name that changes with those texts."""
    vocab = len(tokenizer)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    texts_id = "-" + hashlib.sha256(b"".join(p.read_bytes() for p in texts) + bytes([weight])).hexdigest()[:12] \
        if texts else ""
    path = cache_dir() / "trigrams" / f"{safe}-{vocab}-{limit_bytes}{texts_id}.npz"
    if path.is_file():
        return KatzTrigram.load(path)
    sources = [p.read_text(encoding="utf-8", errors="replace") for p in python_source_files(limit_bytes)]
    written = [text for p in texts for text in read_draft_text(p)]
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]    # noqa: E731
    sequences = [encode(t) for t in sources] + [encode(t) for t in written] * weight
    model = KatzTrigram.build(sequences, vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")      # processes may build it side by side
    model.save(tmp)
    tmp.replace(path)
    return model
