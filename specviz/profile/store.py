"""This machine's profile: what specviz measured here once, stored in the user cache, read by every later process.

`python -m specviz.prepare` measures everything that depends on the machine: the probe layer's timings in each
precision (which precision `auto` picks, and which stack is the default), each draft model's precision, how a draft
reads prompts, and the cost curves staged's tree is planned from. It writes them into one versioned record (VERSION),
keyed by the machine they were taken on. Every other process only reads it: a process that generates never times
anything. A timing taken while the machine is busy says something else: three `specviz generate` started at once on a
2-core machine timed the probe layer 1.5x slower, predicted the 1.5B too slow for this CPU and fell back to a 135M
stack whose text read as nonsense. Where the profile lacks a measurement, the process uses a stated default and says
so in one line (`missing_line`).

A measurement is stored only where the machine was at rest while it ran: where other processes (or the hypervisor,
taking the cores back) used more than BUSY_SHARE of the cores meanwhile, prepare measures again (SETTLE_TRIES in all),
then names on its last line what it could not settle. A process on another machine (another CPU, core count, torch
build or kernel build) has no profile until prepare runs there. `python -m specviz.prepare --remeasure` measures
again, replacing what is stored only where the new measurement settles. Concurrent preparations measure one at a
time (a lock file), so they do not slow each other's timings.

Where the profile lives and what a process did with it (its `Records`: what it measured, defaulted, could not
settle, and what it derived from the profile) are one `Profile` object, made where a process starts (the CLI, the app's
stacks, prepare, the bench) and passed to what reads it: a stack holds its own. A test makes one of its own file.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

from .. import cache_dir
from .records import BUSY_SHARE, Records

FILE = "auto.json"
VERSION = 3                          # the record's layout and how its curves are timed: another is no profile (prepare
                                     # rewrites it)
TORCH_ISA = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")   # what torch's products may use
REMEASURE = "SPECVIZ_REMEASURE"      # "1": as `prepare --remeasure` (specviz/prepare.py reads it)
PROFILE_FILE = "SPECVIZ_PROFILE"     # a profile file of its own (a test's processes), beside the model cache
SETTLE_TRIES = 3                     # measurements of one key on a busy machine before prepare gives it up
SETTLE_WAIT_S = 5.0                  # the pause between them, for the other work to end


@dataclass(frozen=True)
class Choice:
    """One stored measurement: its value (plain JSON data), when it was measured, and by what."""
    value: object
    measured: str
    by: str

    @classmethod
    def read(cls, entry) -> "Choice | None":
        ok = isinstance(entry, dict) and {"value", "measured", "by"} <= set(entry)
        return cls(entry["value"], str(entry["measured"]), str(entry["by"])) if ok else None


def machine() -> str:
    """What the timings depend on: the CPU, its cores, torch, and which build of specviz's kernels runs (its name and
    the digest of its sources: a changed kernel is timed again)."""
    import torch

    from ..cpu import kernels
    from ..cpu import cpu_info
    name, simd = cpu_info()
    capped = "".join(f" {var}={os.environ[var]}" for var in TORCH_ISA if os.environ.get(var))   # torch told to use less
    return (f"{name} | {os.cpu_count()} cores | {' '.join(simd)} | torch {torch.__version__} "
            f"{torch.get_num_threads()} threads{capped} | {kernels.status()} {kernels.version()}")


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


def settled(value: object) -> bool:
    """Whether a stored value is final: one marked {"settled": False} is used, and every prepare measures it again."""
    return not (isinstance(value, dict) and value.get("settled") is False)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


class ProfileFile:
    """Where a profile lives (None: SPECVIZ_PROFILE's file, else the user cache's FILE), read once while it stays as it
    was."""

    def __init__(self, file: Path | None = None):
        self.given = file
        self._loaded: tuple | None = None   # (the file's identity as read, this machine's entries): read on change

    def path(self) -> Path:
        """The profile's file: the one given, else SPECVIZ_PROFILE's, else the user cache's."""
        return self.given or Path(os.environ.get(PROFILE_FILE) or cache_dir() / FILE)

    def _read_all(self) -> dict:
        """{machine: {key: {"value", "measured", "by"}}}: each machine's profile (processes with other thread counts,
        such as the test suite's one-thread workers, keep theirs beside the others, never over them). A file of
        another VERSION, or a damaged one, holds none."""
        try:
            stored = json.loads(self.path().read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(stored, dict) or stored.get("version") != VERSION:
            return {}
        machines = stored.get("machines")
        return machines if isinstance(machines, dict) else {}

    def entries(self) -> dict[str, Choice]:
        """This machine's profile, parsed once while its file stays as it was (the app and the CLI look values up
        often; a file another process replaced is read again)."""
        file, here = self.path(), machine()
        try:
            seen = file.stat()
            identity = (seen.st_ino, seen.st_mtime_ns, seen.st_size)
        except OSError:
            identity = None
        version = (str(file), identity, here)
        if self._loaded is None or self._loaded[0] != version:
            mine = self._read_all().get(here)
            entries = {key: Choice.read(entry) for key, entry in mine.items()} if isinstance(mine, dict) else {}
            self._loaded = (version, {key: choice for key, choice in entries.items() if choice is not None})
        return self._loaded[1]

    def write(self, key: str, value: object, by: str) -> None:
        machines = self._read_all()
        machines.setdefault(machine(), {})[key] = {"value": value, "measured": _now(), "by": by}
        target = self.path()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"version": VERSION, "machines": machines}, indent=1, sort_keys=True))
        os.replace(tmp, target)         # readers see the old file or the new one, never half of one
        self._loaded = None

    @contextlib.contextmanager
    def exclusive(self):
        """One measuring process at a time on this machine (where the OS offers file locks)."""
        try:
            import fcntl
        except ImportError:             # Windows: no lock; concurrent first uses may each measure
            yield
            return
        lock = self.path().with_name(FILE + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def forget(self) -> None:
        """Drop every stored choice (the next use measures anew)."""
        with contextlib.suppress(FileNotFoundError):
            self.path().unlink()
        self._loaded = None


class Profile:
    """A machine profile's file and what one process did with it (`records`). file: None for SPECVIZ_PROFILE's, else
    the user cache's FILE; busy_share: the share of the cores others may use while a measurement is stored."""

    def __init__(self, file: Path | None = None, busy_share: float = BUSY_SHARE):
        self.file = ProfileFile(file)
        self.busy_share = busy_share
        self.records = Records()

    def restart(self) -> None:
        """As the next process would: the same file, no records (nothing measured, defaulted or remembered yet), in
        the same role (preparing or not)."""
        old = self.records
        self.records = Records(preparing=old.preparing, remeasuring=old.remeasuring)

    def remembered(self, key, make: Callable[[], object]) -> object:
        """make()'s value, computed once per profile: for values derived from it."""
        memo = self.records.memo
        if key not in memo:
            memo[key] = make()
        return memo[key]

    # -- measuring -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def preparing(self, who: str = "setup (python -m specviz.prepare)", remeasure: bool = False):
        """Measure what is missing from the profile while inside (only `python -m specviz.prepare`, and tests of it);
        remeasure: measure again, once each, what is stored too (a value is replaced only where the new one
        settles)."""
        done = self.records
        done.preparing.append(who)
        done.remeasuring.append(remeasure)
        try:
            yield
        finally:
            done.preparing.pop()
            done.remeasuring.pop()

    def measuring(self) -> bool:
        """Whether this process prepares the profile (python -m specviz.prepare)."""
        return bool(self.records.preparing)

    def decided(self, key: str, measure: Callable[[], object], default: object = None,
                unsettled_value: Callable[[object, str], object] | None = None) -> object:
        """The profile's value for `key`. Where it has none, or one not settled: while preparing, measured (one
        process at a time, again where the machine was busy), stored and returned; in any other process, the stored
        value, else `default`, noted as defaulted (never timed). Values are plain JSON data.
        unsettled_value(value, why): what a measurement that other work kept busy is stored as (a value marked
        unsettled); without it, nothing is stored. An unsettled value never replaces a settled one."""
        done = self.records
        remeasure = any(done.remeasuring) and key not in done.remeasured
        self.records.consult(key)
        entry = self.file.entries().get(key)
        again = remeasure or (entry is not None and not settled(entry.value) and key not in done.measured)
        if entry is not None and not (again and done.preparing):
            return entry.value
        if not done.preparing:
            done.defaulted[key] = default
            return default
        if key in done.unsettled:   # measured in vain already (SETTLE_TRIES times): this process keeps what it got
            return done.unstored.get(key, default)
        with self.file.exclusive():
            stored = self.file.entries()       # another process may have measured while this one waited
            if key in stored and not remeasure and settled(stored[key].value):
                return stored[key].value
            for attempt in range(SETTLE_TRIES):
                if attempt:
                    time.sleep(SETTLE_WAIT_S)
                watch = OthersWatch()
                done.measured.append(key)
                value = measure()
                others = watch.share()
                from ..cpu.machine import give_back_freed_memory
                give_back_freed_memory()    # what the measuring allocated and dropped (weights' copies, probe layers)
                if others <= self.busy_share:
                    break
                last = ": not stored" if unsettled_value is None else ": stored, marked unsettled"
                print(f"specviz: other work used {others:.0%} of this machine's cores while it timed '{key}'"
                      + ("; measuring again" if attempt + 1 < SETTLE_TRIES else last), file=sys.stderr)
            else:
                why = f"other work used {others:.0%} of the cores"
                if unsettled_value is None:
                    done.unsettled[key] = why     # the stated default stands, or (--remeasure) what the profile holds
                    done.unstored[key] = stored[key].value if key in stored else value
                    return done.unstored[key]
                value = unsettled_value(value, why)
            if not settled(value) and key in stored and settled(stored[key].value):
                # --remeasure: the settled one stands
                done.unsettled[key] = value.get("why", "the measurement did not settle")
                done.unstored[key] = stored[key].value
                return done.unstored[key]
            self.file.write(key, value, done.preparing[-1])
            if remeasure:
                done.remeasured.add(key)
            return value

    def imprecise(self, key: str, why: str) -> None:
        """A stored measurement whose timings stayed noisy: it is used, and prepare's last line asks for a run at
        rest."""
        self.records.imprecise[key] = why

    def learnt(self, key: str, value: object) -> None:
        """Store a value learnt from decoding rather than timed (a model pair's calibration,
        specviz/decode/calibration.py): no clock is read, so a busy machine stores it as well as a quiet one."""
        with self.file.exclusive():
            self.file.write(key, value, "learnt")

    # -- looking up, and saying where a value came from ------------------------------------------
    def stored(self, key: str, measured: bool = True) -> object | None:
        """The stored value for `key` on this machine, or None: never measures. Where a `measured` key (one prepare
        measures, not one learnt from runs) is missing, the caller uses its stated default, noted as defaulted."""
        self.records.consult(key)
        entry = self.file.entries().get(key)
        if entry is None and measured:
            self.records.defaulted[key] = None
        return None if entry is None else entry.value

    def said(self) -> dict[str, str]:
        """For each measurement this process looked up, where its setting came from (the CLI's --json, the app's
        race)."""
        profile = self.file.entries()
        return {key: self._source(key, profile.get(key)) for key in self.records.consulted}

    def missing_line(self) -> str:
        """One line where this process used stated defaults for missing measurements, else ''."""
        defaulted = self.records.defaulted
        if not defaulted:
            return ""
        what = ("no machine profile here" if not self.file.entries()
                else "this machine's profile lacks " + ", ".join(sorted(defaulted)))
        return (f"specviz: {what}; stated defaults are used (`python -m specviz.prepare` measures this machine once, "
                "at rest)")

    def source(self, key: str) -> str:
        """Where a setting came from, in a few words for the CLI, the app and the bench: the profile by name, never its
        path (on a public server that is the server's file system)."""
        return self._source(key, self.file.entries().get(key))

    def _source(self, key: str, entry: Choice | None) -> str:
        if entry is None and key not in self.records.defaulted:      # learnt from runs, not measured: none yet
            return "nothing learnt here yet (each run of this pair teaches it)"
        if entry is None:
            return "a stated default: not in this machine's profile (python -m specviz.prepare measures it)"
        if entry.by == "learnt":
            return f"learnt from earlier runs here (last {entry.measured}), kept in this machine's profile"
        return f"measured {entry.measured} by {entry.by}, kept in this machine's profile ({FILE} in specviz's cache)"
