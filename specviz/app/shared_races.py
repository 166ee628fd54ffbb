"""A race is timed once: visitors who ask for the same race while it is timed, or within `SPECVIZ_RACE_REUSE_S`
seconds after, get its result, labelled with when it was raced, instead of a second race timed beside it (two at once
would slow each other, and neither would be timed alone).

A race being timed holds one live decoder of specviz/app/decoder_slots.py and is timed one step at a time by
whichever of its visitors' loops asks next, so it goes on while any of them watches. What is kept afterwards is the
race's trace (every lane's recorded steps), from which each visitor gets a replay of their own.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from datetime import datetime, timezone
from time import monotonic, perf_counter

from ..profile.environment import env_number
from . import decoder_slots
from .race import COMPARED, Progress, Race, time_lanes
from .settings import Settings
from .shared_decodes import SharedTable

REUSE_S = env_number("SPECVIZ_RACE_REUSE_S", 600)
MAX_SHARED_RACES = 8        # finished races kept (traces only, a few MB at most each)


class SharedRace:
    """One request's race: its timing under way (a time_lanes generator), then its result."""

    def __init__(self, settings: Settings, stack, slots, clock=monotonic):
        self.settings, self.slots, self.clock = settings, slots, clock
        self.stack = weakref.ref(stack)         # the loaded models it races (a stack loaded again races anew)
        self.timing, self.began = None, 0.0
        self.progress_now: Progress | None = None
        self.result: Race | None = None             # every lane revealed; visitors get replays of it
        self.finished_at: datetime | None = None
        self.finished_clock = 0.0
        self.timing_s = 0.0
        self.released = False
        self.watchers = 0                           # visitors' loops waiting on it now
        self.last_used = 0.0
        self.lock = threading.Lock()

    @contextmanager
    def watched(self):
        """A visitor's loop that waits on the race. Where the last one stops (or its page goes) before the race is
        timed, the timing ends and its decoder is given back: asked for again, the race starts over."""
        with self.lock:
            self.watchers += 1
        try:
            yield
        finally:
            with self.lock:
                self.watchers -= 1
                abandoned = self.watchers == 0 and self.result is None
            if abandoned:
                self.slots.give_back(self)
                self.release()

    def advance(self) -> Progress | None:
        """Time the race's next step (starting it where nobody has; InLine while it waits for a live decoder);
        None once it is timed."""
        with self.lock:
            if self.result is not None:
                return None
            if self.timing is None:
                self.slots.take(self)
                self.timing, self.began = time_lanes(self.settings), perf_counter()
            self.slots.touch(self)
            try:
                self.progress_now = next(self.timing)
                return self.progress_now
            except StopIteration as done:
                self._keep(done.value)
            except BaseException:
                self.timing = None              # a lane that cannot run: the next visitor starts it again
                self.slots.give_back(self)
                raise
            return None

    def _keep(self, timed: Race) -> None:
        self.timing_s = perf_counter() - self.began
        result = timed.replay()              # recorded lanes: the live decoders and their caches go
        result.advance_to(float("inf"))
        self.result, self.timing = result, None
        self.finished_at, self.finished_clock = datetime.now(timezone.utc), self.clock()
        self.slots.give_back(self)

    def replay(self) -> Race:
        """The timed race from its start, a visitor's own copy to reveal at the recorded times."""
        return self.result.replay()

    def fresh(self) -> bool:
        """Still handed to visitors who ask: being timed, or timed within REUSE_S."""
        return not self.released and (self.result is None or self.clock() - self.finished_clock <= REUSE_S)

    def note(self, joined_while_timed: bool) -> str:
        """For a visitor who did not start it: when it was raced, and that it was timed once."""
        when = f"{self.finished_at:%H:%M:%S} UTC"
        if joined_while_timed:
            return (f"Shared race: a race with these settings was being timed when you asked, so you got its result "
                    f"(timed once, alone; finished at {when}).")
        ago = self.clock() - self.finished_clock
        return (f"Shared race: raced at {when}, {ago:.0f} s before you asked, for a visitor with the same settings "
                "(a race is timed once, alone; the same race asked for again within "
                f"{REUSE_S / 60:.0f} minutes gets that result).")

    def release(self) -> None:
        """Idle while others wait for a decoder (decoder_slots calls this): its timing ends; asked again, it
        starts over."""
        timing, self.timing, self.released = self.timing, None, True
        if timing is not None:
            timing.close()

    def progress(self) -> float:
        p = self.progress_now
        if p is None:
            return 0.0
        under_way = sum(tokens for lane, tokens in p.together.items() if lane not in p.done) / p.max_new_tokens
        return min(1.0, (len(p.done) + under_way) / len(COMPARED))


class SharedRaces(SharedTable):
    """The races by request, while they are fresh (at most `size` kept)."""

    def __init__(self, size: int, slots, clock=monotonic):
        super().__init__(size, lambda settings, stack: SharedRace(settings, stack, slots, clock),
                         lambda race: not race.fresh())


RACES = SharedRaces(MAX_SHARED_RACES, decoder_slots.SLOTS)
