"""What `auto` chose on this machine: measured once, stored in the user cache, read by every later process.

`auto` picks, by timing probes, the precision a CPU reads a token fastest in, each draft model's precision and
(through the probe) the default model stack. A timing taken while the machine is busy says something else:
three `specviz generate` started at once on a 2-core machine timed the probe layer 1.5x slower, predicted the
1.5B too slow for this CPU and silently fell back to the offline stack (SmolLM2-135M), whose text read as
nonsense for the prompt; others picked int8 or float32 by noise. So each probe runs once per machine (setup runs
it, on an idle machine), its timings and picks are kept in `auto.json` beside the machine they were taken on,
and every later process reads them: the same command gives the same stack and text run after run.

A measurement is stored only where the machine was at rest while it ran: where other processes (or the hypervisor,
taking the cores back) used more than BUSY_SHARE of the cores meanwhile, the process uses what it measured and stores
nothing, and a later one measures again (a draft's prompt read timed while another job ran picked the slower reader,
0.40 -> 0.53 s a prompt, for every later bench on that machine).

A process on another machine (another CPU, core count, torch build or kernel build) measures anew. To measure
again here: `python -m specviz.prepare --remeasure`, or SPECVIZ_REMEASURE=1 for one process (which then stores
what it measured). Concurrent first uses measure one at a time (a lock file), so they do not slow each other's
timings.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from .paths import cache_dir

FILE = "auto.json"
TORCH_ISA = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")   # what torch's products may use
REMEASURE = "SPECVIZ_REMEASURE"      # "1": measure again in this process (and store the result)
BUSY_SHARE = 0.25                    # others' share of the cores during a measurement past which it is not stored


def path() -> Path:
    return cache_dir() / FILE


def machine() -> str:
    """What the timings depend on: the CPU, its cores, torch, and which build of specviz's kernels runs (its name and
    the digest of its sources: a changed kernel is timed again)."""
    import torch

    from .cpu import kernels
    from .cpu import cpu_info
    name, simd = cpu_info()
    capped = "".join(f" {var}={os.environ[var]}" for var in TORCH_ISA if os.environ.get(var))   # torch told to use less
    return (f"{name} | {os.cpu_count()} cores | {' '.join(simd)} | torch {torch.__version__} "
            f"{torch.get_num_threads()} threads{capped} | {kernels.status()} {kernels.version()}")


def _read_all() -> dict:
    """{machine: {key: {"value", "measured", "by"}}}: each machine's choices (processes with other thread counts,
    such as the test suite's one-thread workers, keep theirs beside the others, never over them)."""
    try:
        stored = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    machines = stored.get("machines") if isinstance(stored, dict) else None
    return machines if isinstance(machines, dict) else {}


def _read() -> dict:
    """This machine's choices."""
    mine = _read_all().get(machine())
    return mine if isinstance(mine, dict) else {}


def _write(key: str, entry: dict) -> None:
    machines = _read_all()
    machines.setdefault(machine(), {})[key] = entry
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"machines": machines}, indent=1, sort_keys=True))
    os.replace(tmp, target)         # readers see the old file or the new one, never half of one


@contextlib.contextmanager
def _exclusive():
    """One measuring process at a time on this machine (where the OS offers file locks)."""
    try:
        import fcntl
    except ImportError:             # Windows: no lock; concurrent first uses may each measure
        yield
        return
    lock = path().with_name(FILE + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_REMEASURED: set[str] = set()       # keys this process measured anew under SPECVIZ_REMEASURE


def cpu_seconds() -> tuple[float, float] | None:
    """(busy, all) seconds of every core since boot, from Linux's /proc/stat (steal counts as busy: the cores were
    not ours); None where there is no such file."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]                        # idle, iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


class OthersWatch:
    """The share of the machine's cores that others used from now on: its busy time less this process's own."""

    def __init__(self) -> None:
        self.start, self.own = cpu_seconds(), time.process_time()

    def share(self) -> float:
        now = cpu_seconds()
        if self.start is None or now is None or now[1] <= self.start[1]:
            return 0.0
        busy, total = now[0] - self.start[0], now[1] - self.start[1]
        return max(0.0, busy - (time.process_time() - self.own)) / total


def decided(key: str, measure: Callable[[], object]) -> object:
    """The stored value for `key` on this machine; measured (one process at a time), stored and returned where
    there is none, or where SPECVIZ_REMEASURE=1 asks for a new measurement. Values are plain JSON data."""
    remeasure = os.environ.get(REMEASURE) == "1" and key not in _REMEASURED
    if key in _read() and not remeasure:
        return _read()[key]["value"]
    with _exclusive():
        stored = _read()            # another process may have measured while this one waited
        if key in stored and not remeasure:
            return stored[key]["value"]
        watch = OthersWatch()
        value = measure()
        others = watch.share()
        from .cpu.machine import give_back_freed_memory
        give_back_freed_memory()    # what the measuring allocated and dropped (copies of weights, probe layers)
        if others > BUSY_SHARE:
            print(f"specviz: other work used {others:.0%} of this machine's cores while it timed '{key}': this process "
                  "uses what it measured and stores nothing; a later one measures again", file=sys.stderr)
            return value
        _write(key, {"value": value, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "by": _who()})
        if remeasure:
            _REMEASURED.add(key)
        return value


def learnt(key: str, value: object) -> None:
    """Store a value learnt from decoding rather than timed (a model pair's calibration, specviz/calibration.py): no
    clock is read, so a busy machine stores it as well as a quiet one."""
    with _exclusive():
        _write(key, {"value": value, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "by": "learnt"})


def stored(key: str) -> object | None:
    """The stored value for `key` on this machine, or None: never measures."""
    entry = _read().get(key)
    return None if entry is None else entry["value"]


def source(key: str) -> str:
    """Where a stored choice came from, in a few words for the CLI, the app and the bench: the profile by name, never
    its path (on a public server that is the server's file system)."""
    entry = _read().get(key)
    if entry is None:
        return "not measured on this machine yet"
    return f"measured {entry['measured']} by {entry['by']}, kept in this machine's profile ({FILE} in specviz's cache)"


def forget() -> None:
    """Drop every stored choice (the next use measures anew)."""
    with contextlib.suppress(FileNotFoundError):
        path().unlink()


_measured_by = ["first use"]


def measuring_for(who: str) -> None:
    """Name what measures from now on in this process (setup: `python -m specviz.prepare`)."""
    _measured_by[0] = who


def _who() -> str:
    return _measured_by[0]
