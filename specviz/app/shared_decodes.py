"""Identical requests share one decode: its rounds are computed once, in order, and every visitor reads them at their
own pace.

Greedy decoding is deterministic, and so is sampling for one seed, so visitors who ask for the same prompt with the
same stack, strategy, settings and precision (and when sampling, the same seed) would compute the same rounds. Here
the first to ask for round k computes it, and everyone after reads it. A visitor's session holds a `DecodeReader`: a
pointer into the shared trace and its own position, never a model. A decode holds its live decoder (its KV caches,
one of specviz/app/decoder_slots.py's) only until its last round; then the trace alone stays. The table keeps the
`SPECVIZ_SHARED_DECODES` decodes asked for most recently; a session goes on reading one that left it, and the next
request for it starts a new one.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime, timezone

from ..profile.environment import env_number
from ..decode.trace import CommittedSoFar
from . import decoder_slots
from .settings import Settings
from ..stack.plans import keep_learnt
from .stacks import get_stack, new_decoder

MAX_SHARED_DECODES = int(env_number("SPECVIZ_SHARED_DECODES", 64))


def request_key(settings: Settings, precision: str) -> tuple:
    """What makes two requests one decode: every setting (the prompt and its format, the stack, the strategy, the
    tree, the sampling, the length) and the precision the stack runs in. A greedy decode draws nothing, so its seed
    is left out."""
    if settings.sampling.greedy:
        settings = replace(settings, sampling=replace(settings.sampling, seed=0))
    return settings, precision


class SharedDecode:
    """One request's decode: what it is (its prompt, stages and model costs), its rounds so far, and until its last
    round its live decoder."""

    def __init__(self, settings: Settings, stack, slots):
        self.settings, self.slots = settings, slots
        self.stack = weakref.ref(stack)         # the loaded models it runs on (a stack loaded again starts anew)
        self.profile = stack.profile            # where what its planner learnt is kept
        self.decoder = None
        self.steps: list | None = None          # the decoder's own list of rounds, kept once it is dropped
        self.started_at: datetime | None = None
        # what the decode is, kept from its decoder: the views read these
        self.strategy, self.prompt, self.stages, self.costs = settings.strategy, [], [], {}
        self.max_new_tokens, self.prompt_text = settings.max_new_tokens, ""
        self.finished = self.released = False
        self.last_used = 0.0
        self.lock = threading.Lock()

    def start(self, stack) -> None:
        """Read the prompt into a live decoder, once; InLine while every live decoder is held by others."""
        with self.lock:
            if self.steps is not None:
                return
            self.slots.take(self)
            try:
                decoder = new_decoder(stack, self.settings)
            except BaseException:
                self.slots.give_back(self)
                raise
            self.strategy, self.prompt, self.stages = decoder.strategy, list(decoder.prompt), list(decoder.stages)
            self.costs, self.max_new_tokens = decoder.model_costs(), decoder.max_new_tokens
            self.prompt_text = decoder.tokenizer.decode(decoder.prompt)
            self.decoder, self.steps, self.started_at = decoder, decoder.steps, datetime.now(timezone.utc)

    def round(self, k: int) -> bool:
        """Make round k (from 0) readable, computing those up to it that nobody has; False where the decode ended
        before it (it finished, or was released while idle)."""
        with self.lock:
            self.slots.touch(self)
            while len(self.steps) <= k and self.decoder is not None:
                self.decoder.step()
                if self.decoder.finished:
                    keep_learnt(self.decoder, self.profile)
                    self.decoder, self.finished = None, True        # the caches go, the trace stays
                    self.slots.give_back(self)
            return k < len(self.steps)

    def release(self) -> None:
        """Idle while others wait for a decoder (decoder_slots calls this): the caches go, the rounds so far stay."""
        self.decoder, self.released = None, True

    def progress(self) -> float:
        if not self.steps:
            return 0.0
        return sum(len(step.committed_tokens) for step in self.steps) / self.max_new_tokens


class DecodeReader(CommittedSoFar):
    """One session's place in a shared decode, read through a live decoder's interface (steps, step(), finished,
    new_tokens, ...), so every view draws it as it draws a decoder."""

    def __init__(self, shared: SharedDecode, sampling):
        self.shared, self.sampling, self.shown = shared, sampling, 0     # the visitor's own sampling (a greedy seed)
        self.strategy, self.prompt, self.stages = shared.strategy, shared.prompt, shared.stages
        self.max_new_tokens, self.prompt_text = shared.max_new_tokens, shared.prompt_text

    @property
    def steps(self) -> list:
        return self.shared.steps[: self.shown]

    def step(self):
        """The next round: read, or computed here where nobody has yet."""
        if self.finished:
            raise RuntimeError("generation already finished")
        if self.shared.round(self.shown):
            self.shown += 1
        return self.shared.steps[self.shown - 1] if self.shown else None

    @property
    def finished(self) -> bool:
        return self.shown == len(self.shared.steps) and (self.shared.finished or self.shared.released)

    @property
    def released(self) -> bool:
        """At the end of what a decode released while idle had computed: a new one must start."""
        return self.finished and not self.shared.finished

    @property
    def finish_reason(self) -> str:
        if not self.finished:
            return ""
        return self.steps[-1].finish_reason if not self.released else "released"

    def model_costs(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(cost) for name, cost in self.shared.costs.items()}


class SharedTable:
    """What visitors share, by request: the `size` asked for most recently. make(settings, stack) starts an entry;
    one that is stale(entry), or was made with another stack object, starts over when asked for again."""

    def __init__(self, size: int, make, stale):
        self.size, self.make, self.stale = size, make, stale
        self.entries: OrderedDict[tuple, object] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, settings: Settings, stack):
        key = request_key(settings, stack.precision())
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or self.stale(entry) or entry.stack() is not stack:
                entry = self.entries[key] = self.make(settings, stack)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
            return entry


class SharedDecodes(SharedTable):
    """The shared decodes by request; one released while idle starts over."""

    def __init__(self, size: int, slots):
        super().__init__(size, lambda settings, stack: SharedDecode(settings, stack, slots),
                         lambda decode: decode.released)

    def reader(self, settings: Settings) -> tuple[DecodeReader, str]:
        """A reader at the first round of the settings' shared decode, started here where nobody has (InLine while
        it waits for a live decoder), and a note where it was started before."""
        stack = get_stack(settings.stack_key())
        shared = self.get(settings, stack)
        started = shared.steps is not None
        shared.start(stack)
        note = ""
        if started:
            note = (f"Shared: this decode was started at {shared.started_at:%H:%M:%S} UTC for the same request; its "
                    "rounds are computed once for everyone who asks (their times are those of that run), and you "
                    "step through them at your own pace.")
        return DecodeReader(shared, settings.sampling), note


SHARED = SharedDecodes(MAX_SHARED_DECODES, decoder_slots.SLOTS)
