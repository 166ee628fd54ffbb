"""Where this machine's GGUF products switch from the tiles to the packed columns (specviz/cpu/blocks.py:
measure_columns_from): measured once into the profile, and taken up by every process that loads a file's own blocks.
The crossover is a matter of speed alone (both paths give the same bits), and it differs between CPUs of one
instruction set, so no count fixed in the C sources suits them all."""
from __future__ import annotations

from ..cpu import blocks, kernels
from ..profile.store import Profile

# named by the counts timed, so that a profile timed at fewer counts is timed again
KEY = "block products: rows from which the packed columns pay (timed at 1-6 rows and more, the weights from memory)"


def take_up(profile: Profile) -> dict | None:
    """This machine's measured crossovers (measured first while prepare runs), now in this process's products; None
    where this build has no columns' path or nothing is stored (tuning.h's counts stay)."""
    if not kernels.available() or not blocks.columns_from():
        return None
    measured = profile.decided(KEY, blocks.measure_columns_from)
    if not isinstance(measured, dict) or not isinstance(measured.get("from"), dict):
        return None
    blocks.set_columns_from(measured["from"])
    return measured


def describe(measured: dict) -> str:
    counts = ", ".join(f"{name} from {rows} row{'s' * (rows != 1)}" for name, rows in measured["from"].items())
    return f"the file's blocks take the packed columns' path: {counts}"
