"""Numbers an operator sets through environment variables (the app server's limits, the recording size)."""
from __future__ import annotations

import os


def env_number(name: str, default: float) -> float:
    """An operator's numeric setting; a missing, malformed or non-positive value gives the default."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default
