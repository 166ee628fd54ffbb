"""The server-wide bound on live decoders, and the line where a visitor waits for one instead of being turned away.

A live decoder holds KV caches (megabytes to gigabytes), so at most `SPECVIZ_MAX_SESSIONS` of them are held at once:
a decode in progress holds one (identical requests share one decode, specviz/app/shared_decodes.py, so they count
once), and so do a race while it is timed and a lossless check while it samples. A holder that needs a decoder when
all are held waits in line, first come first served; its visitor's page says their place and about how long. A
holder idle for `SPECVIZ_SESSION_IDLE_S` seconds gives its decoder back when someone waits (a decode keeps the rounds
it computed, readable by its visitors).

A holder is any object with `last_used` (set by `touch`), `release()` (give the decoder back: drop the caches) and
`progress()` (the share of its work done, 0 to 1, for the estimate).
"""
from __future__ import annotations

import threading
from collections import deque
from time import monotonic

from ..profile.environment import env_number

MAX_LIVE_DECODERS = int(env_number("SPECVIZ_MAX_SESSIONS", 16))
IDLE_S = env_number("SPECVIZ_SESSION_IDLE_S", 900)
ASK_EVERY_S = 1.0               # a waiting visitor's handler asks for its turn this often
GONE_AFTER_S = 10 * ASK_EVERY_S  # a place in line nobody asked about for this long is dropped: its visitor left


class InLine(Exception):
    """Every live decoder is held: the holder is `place`-th in line (1: next), its turn in about `estimate_s`
    seconds (None: nothing to estimate from yet). Not an error: the handler shows the message and asks again."""

    def __init__(self, place: int, estimate_s: float | None):
        self.place, self.estimate_s = place, estimate_s
        super().__init__(self.message())

    def message(self) -> str:
        ahead = "you are next" if self.place == 1 else f"{self.place - 1} ahead of you"
        when = (f"about {self.estimate_s:.0f} s" if self.estimate_s is not None
                else "an estimate comes once a decode here has made progress")
        return (f"Waiting for a decoder: every live one is in use by other visitors ({ahead}; {when}). "
                "This page starts by itself when its turn comes.")


class Claim:
    """A holder that holds nothing of its own (a lossless check's decoders live in its loop): it only waits its
    turn, and its loop checks `released`."""

    def __init__(self):
        self.last_used, self.released, self.done = 0.0, False, 0.0

    def release(self) -> None:
        self.released = True

    def progress(self) -> float:
        return self.done


class DecoderSlots:
    """At most `limit` holders at once; the rest in line, first come first served."""

    def __init__(self, limit: int, idle_s: float, clock=monotonic):
        self.limit, self.idle_s, self.clock = limit, idle_s, clock
        self.holding: dict[int, tuple[object, float]] = {}     # id -> (holder, since)
        self.line: dict[int, list] = {}                         # id -> [holder, last asked], in order of arrival
        self.held_s: deque[float] = deque(maxlen=16)            # how long recent holders held a decoder
        self.lock = threading.RLock()

    def touch(self, holder) -> None:
        holder.last_used = self.clock()

    def ask(self, holder) -> int:
        """0 where `holder` holds a decoder (it may use one now); else its place in line (1: next). Asking again
        keeps the place; a place not asked about for GONE_AFTER_S is dropped."""
        now = self.clock()
        with self.lock:
            holder.last_used = now
            if id(holder) in self.holding:
                return 0
            self.line.setdefault(id(holder), [holder, now])[1] = now
            self.line = {key: entry for key, entry in self.line.items() if now - entry[1] <= GONE_AFTER_S}
            place = list(self.line).index(id(holder)) + 1
            released = self._take_back_idle(now, wanted=place)
            free = self.limit - len(self.holding)
            if place <= free:
                del self.line[id(holder)]
                self.holding[id(holder)] = (holder, now)
                place = 0
            else:
                place -= max(free, 0)
        for idle in released:           # outside the lock: a holder's release may take its own
            idle.release()
        return place

    def take(self, holder) -> None:
        """Return where `holder` holds a decoder (now or already); else raise InLine with its place and estimate."""
        if place := self.ask(holder):
            raise InLine(place, self.estimate(place))

    def give_back(self, holder) -> None:
        with self.lock:
            held = self.holding.pop(id(holder), None)
            if held is not None:
                self.held_s.append(self.clock() - held[1])
            self.line.pop(id(holder), None)

    def holds(self, holder) -> bool:
        return id(holder) in self.holding

    def _take_back_idle(self, now: float, wanted: int) -> list:
        """The decoders of holders idle for idle_s, longest idle first, taken back until `wanted` are free."""
        idle = sorted((h for h, _ in self.holding.values() if now - h.last_used > self.idle_s),
                      key=lambda h: h.last_used)
        taken = idle[: max(0, wanted - (self.limit - len(self.holding)))]
        for holder in taken:
            self.give_back(holder)
        return taken

    def estimate(self, place: int) -> float | None:
        """Seconds until the holder `place`-th in line gets a decoder, or None with nothing to go by yet. Each holder
        is taken to give its decoder back when it finishes at its pace so far (its progress over the time it held
        the decoder), or when it will have been idle long enough to be released, whichever comes first; those
        beyond the first round of holders wait a typical hold more for each round."""
        now = self.clock()
        with self.lock:
            holders = list(self.holding.values())
            history = list(self.held_s)
        if not holders:
            return 0.0
        due, paced = [], False
        for holder, since in holders:
            done, free_in = holder.progress(), max(0.0, self.idle_s - (now - holder.last_used))
            if done > 0:
                paced = True
                free_in = min(free_in, (now - since) * (1 - done) / done)
            due.append(free_in)
        if not (paced or history):
            return None
        due.sort()
        typical = sum(history) / len(history) if history else due[-1]
        rounds, index = divmod(place - 1, len(due))
        return due[index] + rounds * typical


SLOTS = DecoderSlots(MAX_LIVE_DECODERS, IDLE_S)
