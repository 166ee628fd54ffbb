"""This process's records of the machine's profile (specviz/profile/store.py), and which profile it works on: one
object, `current()`. A test works on a profile of its own (`isolated`); `restart()` stands for the next process."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

BUSY_SHARE = 0.25       # others' share of the cores during a measurement past which it is not stored


@dataclass
class Records:
    """What one process did with the profile: what its printed lines say (missing_line, prepare's last line), what it
    settled already, and what it derived from the profile (`remembered`). A new process starts with none (`restart`)."""
    remeasured: set[str] = field(default_factory=set)           # keys measured anew while remeasuring
    preparing: list[str] = field(default_factory=list)          # who measures, while preparing (else nothing times)
    remeasuring: list[bool] = field(default_factory=list)       # ...and whether it measures again what is stored
    defaulted: dict[str, object] = field(default_factory=dict)  # keys found missing, with the stated default used
    unsettled: dict[str, str] = field(default_factory=dict)     # keys this preparation could not settle, and why
    imprecise: dict[str, str] = field(default_factory=dict)     # keys stored from timings that stayed noisy, and why
    unstored: dict[str, object] = field(default_factory=dict)   # ...and what this process uses for them
    measured: list[str] = field(default_factory=list)           # every measurement run, in order (generating: none)
    consulted: list[str] = field(default_factory=list)          # every key looked up, in order
    memo: dict = field(default_factory=dict)                    # values derived from the profile (remembered)


@dataclass
class Profile:
    """Where the profile lives (None: the user cache's FILE), how busy the machine may be while a measurement is
    stored, and this process's records of it."""
    file: Path | None = None
    busy_share: float = BUSY_SHARE
    records: Records = field(default_factory=Records)
    loaded: tuple | None = None     # (the file's identity as read, this machine's entries in it): read again on change


_PROFILES = [Profile()]             # the one in use last: a test's own (isolated) above the process's


def current() -> Profile:
    return _PROFILES[-1]


def records() -> Records:
    return _PROFILES[-1].records


@contextlib.contextmanager
def isolated(file: Path, busy_share: float = BUSY_SHARE):
    """A profile of its own at `file`, with fresh records, while inside (a test's); the process's one after."""
    _PROFILES.append(Profile(file, busy_share))
    try:
        yield _PROFILES[-1]
    finally:
        _PROFILES.pop()


def restart() -> None:
    """As the next process would: the same profile, no records (nothing measured, defaulted or remembered yet), in
    the same role (preparing or not)."""
    old = _PROFILES[-1].records
    _PROFILES[-1].records = Records(preparing=old.preparing, remeasuring=old.remeasuring)


def remembered(key, make: Callable[[], object]) -> object:
    """make()'s value, computed once per process and profile: for values derived from the profile."""
    memo = records().memo
    if key not in memo:
        memo[key] = make()
    return memo[key]
