"""What one process did with a machine profile (specviz/profile/store.py): what its printed lines say, what it settled
already, and what it derived from the profile."""
from __future__ import annotations

from dataclasses import dataclass, field

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

    def consult(self, key: str) -> None:
        """Note that `key` was looked up (once, in the order first looked up)."""
        if key not in self.consulted:
            self.consulted.append(key)
