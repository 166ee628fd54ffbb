"""specviz: staged speculative decoding (Spector & Ré, 2023), step by step.

The package root is the layer below every package, which any module may import: the version, where specviz
keeps files (the shipped assets, and the user cache for what it makes on first use), and how long OpenMP's idle
threads spin, which must be set before anything imports torch."""
from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.6.0"
ASSETS = Path(__file__).resolve().parent.parent / "assets"

# Between parallel regions libgomp's threads spin for 300,000 pauses (milliseconds) before they sleep. Alone, that
# spin lets the next region start at once; where processes compute at once on the same cores, each region waits for
# threads that the other processes' spinners keep off a core (three specviz processes on 2 cores ran 10x slower
# each). 10,000 pauses ran as fast alone and 3x faster together; 1,000 and none (OMP_WAIT_POLICY=PASSIVE) cost a run
# alone 10-20%. libgomp reads its settings once, as it loads, hence here, before torch.
OPENMP_SPIN = "10000"


def spin_briefly(environ=os.environ) -> bool:
    """Set libgomp's spin to OPENMP_SPIN unless the operator set the spin or the wait policy; whether it set it."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = OPENMP_SPIN
    return True


SPIN_SET_HERE = spin_briefly()


def operator_environment() -> dict[str, str]:
    """The environment as the operator set it, for the peers we time (llama.cpp): they run as their users run them."""
    environ = dict(os.environ)
    if SPIN_SET_HERE and environ.get("GOMP_SPINCOUNT") == OPENMP_SPIN:
        del environ["GOMP_SPINCOUNT"]
    return environ


def cache_dir() -> Path:
    root = os.environ.get("SPECVIZ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specviz")
    return Path(root)
