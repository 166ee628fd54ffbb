"""A drafter spec "trigram:auto": a Katz-backoff trigram built for the target's tokenizer on first use
(from Python source that ships with Python, tokenised by that tokenizer) and cached under the user
cache directory, so any preset gets its stage-2 drafter without a download.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from .drafters.katz import KatzTrigram
from .paths import cache_dir


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


def auto_trigram(tokenizer, name: str, limit_bytes: int = 8_000_000):
    """A trigram for this tokenizer, built once from the standard library's source and cached."""
    vocab = len(tokenizer)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = cache_dir() / "trigrams" / f"{safe}-{vocab}-{limit_bytes}.npz"
    if path.is_file():
        return KatzTrigram.load(path)
    texts = (p.read_text(encoding="utf-8", errors="replace") for p in python_source_files(limit_bytes))
    sequences = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    model = KatzTrigram.build(sequences, vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")      # processes may build it side by side
    model.save(tmp)
    tmp.replace(path)
    return model
