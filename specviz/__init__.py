"""specviz: staged speculative decoding (Spector & Ré, 2023), step by step.

The package root is the layer below every package, which any module may import: the version, and where specviz
keeps files (the shipped assets, and the user cache for what it makes on first use)."""
from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.6.0"
ASSETS = Path(__file__).resolve().parent.parent / "assets"


def cache_dir() -> Path:
    root = os.environ.get("SPECVIZ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specviz")
    return Path(root)
