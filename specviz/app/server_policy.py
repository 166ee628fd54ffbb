"""What one app server lets its visitors do, set by its operator through environment variables.

The defaults are safe for a public Space: only the named presets load; custom model ids (a hub id, a
server path or a .gguf file typed by a visitor) are off until `SPECVIZ_ALLOW_CUSTOM_MODELS=1`, and
even then local paths load only from the directories in `SPECVIZ_MODEL_DIRS` and hub models only
below a size limit checked before anything is downloaded.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..profile.environment import env_number

NON_NEURAL = ("lookup", "trigram", "trigram:auto")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


class PolicyError(ValueError):
    """A request this server does not allow; the message is one line for the visitor."""


def custom_models_allowed() -> bool:
    return os.environ.get("SPECVIZ_ALLOW_CUSTOM_MODELS", "").strip().lower() in ("1", "true", "yes")


def model_dirs() -> list[Path]:
    """Directories whose models visitors may name by path (none by default)."""
    return [Path(d).expanduser().resolve() for d in os.environ.get("SPECVIZ_MODEL_DIRS", "").split(os.pathsep)
            if d.strip()]


def max_model_bytes() -> int:
    return int(env_number("SPECVIZ_MAX_MODEL_BYTES", 4e9))


def check_custom(target: str, drafts: list[str]) -> None:
    """Refuse custom specs this server does not allow, before any file or the hub is touched."""
    if not custom_models_allowed():
        raise PolicyError("Custom models are disabled on this server; pick a preset.")
    for spec in [target, *drafts]:
        if spec in NON_NEURAL:
            continue
        if _looks_like_path(spec):
            _check_path(spec)
        elif HUB_ID.match(spec):
            _check_hub_size(spec)
        else:
            raise PolicyError(f"{spec[:80]!r} is neither a hub id (org/name) nor a path.")


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or "\\" in spec or spec.endswith((".gguf", ".npz")) or spec.count("/") > 1


def _check_path(spec: str) -> None:
    allowed = model_dirs()
    if not allowed:
        raise PolicyError("Local model paths are disabled on this server; use a hub id or a preset.")
    path = Path(spec).expanduser().resolve()
    if not any(path == d or d in path.parents for d in allowed):
        raise PolicyError("That path is outside the model directories this server allows.")


def hub_weight_bytes(repo_id: str) -> int:
    """Bytes of a hub model's weight files, from the hub's file list (no download)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, files_metadata=True, timeout=10)
    return sum(f.size or 0 for f in info.siblings or [] if f.rfilename.endswith(WEIGHT_SUFFIXES))


def _check_hub_size(repo_id: str) -> None:
    limit = max_model_bytes()
    try:
        size = hub_weight_bytes(repo_id)
    except Exception as exc:   # noqa: BLE001 - offline, unknown repo, rate limits: one line for the visitor
        raise PolicyError(f"Could not check the size of {repo_id!r} on the hub ({type(exc).__name__}); "
                          "this server loads hub models only after checking their size.") from exc
    if size > limit:
        raise PolicyError(f"{repo_id!r} has {size / 1e9:.1f} GB of weights; this server allows at most "
                          f"{limit / 1e9:.1f} GB per model.")
