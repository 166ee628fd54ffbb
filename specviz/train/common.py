"""What every training command shares: where data and artifacts live, the target, logging, seeding."""
from __future__ import annotations

import gzip
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..models.load import load_model
from .. import ASSETS

DATA = ASSETS.parent / "data"            # intermediate data (gitignored)
TARGET = "smollm2-135m"


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


def read_json(path: Path) -> dict:
    """A JSON file (gzipped where its name ends in .gz), or {} where there is none."""
    if not path.exists():
        return {}
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def target_tokenizer():
    """The target's tokenizer. Loads the whole target: its tokenizer comes out of a GGUF file, and
    reading that alone takes as long as load_model with its de-quantised copy already cached."""
    return load_model(TARGET).tokenizer
