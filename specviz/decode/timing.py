"""Exclusive wall time per phase: a nested phase pauses the one around it."""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from time import perf_counter


class PhaseTimer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[str] = []
        self._mark = 0.0

    @contextmanager
    def phase(self, name: str):
        now = perf_counter()
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        self._stack.append(name)
        self._mark = now
        try:
            yield
        finally:
            now = perf_counter()
            self.totals[self._stack.pop()] += now - self._mark
            self._mark = now

    def take(self) -> dict[str, float]:
        """Return the totals so far and start afresh."""
        out = dict(self.totals)
        self.totals.clear()
        return out
