"""Where this machine's GGUF products switch from the tiles to the packed columns: timed once on the forwards of the
model being loaded, kept in the profile under its name, and taken up by every process that loads its blocks.

The crossover is a matter of speed alone (both paths give the same bits), and it differs between CPUs of one
instruction set, so no count fixed in the C sources suits them all. It is timed on the model's own forwards because
products timed alone did not stand for them: on an Emerald Rapids the gate and up products of a 1.5B timed alone tied
the two paths at one row, in one process the columns a little ahead, in another 11% behind, and fresh setups stored
Q4_K's columns from 1, 3, 4 or 5 rows, while the model's one-token forward ran 8% slower on the columns (42.2 against
38.6 ms, best of 25) and its 3-token one 4% faster."""
from __future__ import annotations

import torch

from ..cpu import blocks, kernels
from ..profile.cost_curve import CostSampler
from ..profile.store import Profile

# every count up to 6, a verified tree's commonest sizes, then 8 and 16: one past the most timed means the columns never
TIMED_ROWS = (1, 2, 3, 4, 5, 6, 8, 16)
REPS = 8
NEVER = 1 << 30


def key(model_name: str) -> str:
    """The profile's key for a model's crossover, named by what is timed so that one timed otherwise is timed again."""
    return f"block products of {model_name}: rows from which the packed columns pay (its forwards timed at 1-6 rows)"


def held(model: torch.nn.Module) -> list[str]:
    """The K-quants of the model's block products that this build can take through the columns, most bytes first."""
    held_bytes: dict[str, int] = {}
    paths = blocks.columns_from()
    for layer in model.modules():
        if isinstance(layer, blocks.BlockLinear) and blocks.TYPES[layer.qtype] in paths:
            name = blocks.TYPES[layer.qtype]
            held_bytes[name] = held_bytes.get(name, 0) + layer.weight.numel()
    return sorted(held_bytes, key=held_bytes.get, reverse=True)


def crossover(tiles: dict[int, float], columns: dict[int, float]) -> int:
    """The count of rows from which the columns serve best (seconds by rows fed for each path): the one whose choice
    loses least summed over the counts timed, each count's time taken relative to the faster path's there, so that
    each count weighs alike and one noisy count moves the answer by one step at most. One past the most rows timed:
    the columns never."""
    counts = sorted(tiles)

    def loss(start: int) -> float:
        return sum((columns[n] if n >= start else tiles[n]) / min(tiles[n], columns[n]) for n in counts)
    return min([*counts, counts[-1] + 1], key=loss)


def measure(model: torch.nn.Module, reps: int | None = None) -> dict:
    """The model's crossover per K-quant it holds: its forwards of TIMED_ROWS tokens after a 256-token context, each
    count on both paths one right after the other (a VM's speed drifts by tens of percent over seconds), best of
    `reps` (REPS where None). The quants in turn, the most bytes first, each timed with those before at their counts.
    Returns {"from": {name: rows}, "ms": {name: {path: {rows: ms per forward}}}}."""
    chosen, ms = {}, {}
    quants = held(model)
    if not quants:
        return {"from": chosen, "ms": ms}       # before the sampler's 256-token feed, which nothing would then use
    kept = blocks.columns_from()
    sampler = CostSampler([model], TIMED_ROWS)
    try:
        for name in quants:
            best = {path: dict.fromkeys(TIMED_ROWS, float("inf")) for path in ("tiles", "columns")}
            for _ in range(reps or REPS):
                for n in TIMED_ROWS:
                    for path, seconds in best.items():
                        blocks.set_columns_from({name: 1 if path == "columns" else NEVER})
                        seconds[n] = min(seconds[n], sampler.seconds(n))
            chosen[name] = crossover(best["tiles"], best["columns"])
            blocks.set_columns_from({name: chosen[name]})
            ms[name] = {path: {str(n): round(s * 1e3, 2) for n, s in times.items()} for path, times in best.items()}
    finally:
        blocks.set_columns_from(kept)
    return {"from": chosen, "ms": ms}


def take_up(profile: Profile, model_name: str, model: torch.nn.Module) -> dict | None:
    """The model's measured crossovers (measured first while prepare runs), now in this process's products; None where
    this build has no columns' path, the model holds no K-quant, or nothing is stored (tuning.h's counts stay). The
    counts are the process's own, so a process that loads two such models runs both at the last one's: speed only."""
    if not kernels.available() or not held(model):
        return None
    measured = profile.decided(key(model_name), lambda: measure(model))
    if not isinstance(measured, dict) or not isinstance(measured.get("from"), dict):
        return None
    blocks.set_columns_from(measured["from"])
    return measured


def describe(measured: dict) -> str:
    counts = ", ".join(f"{name} from {rows} row{'s' * (rows != 1)}" for name, rows in measured["from"].items())
    return f"the file's blocks take the packed columns' path: {counts}"
