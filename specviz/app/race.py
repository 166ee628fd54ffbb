"""The Compare race: the same prompt and settings with several strategies, each timed alone, then replayed together.

Every lane is timed alone, with nothing else of the app computing while it runs (`time_lanes`). Our strategies
are decoders stepped one round at a time (each step's time is in its trace record), taking steps in turn so that
they share the machine's slow and fast minutes; what a user would run instead runs once to the end, one after
another, noting when each chunk of tokens arrived:
HF assisted generation (transformers' `generate(assistant_model=...)` with the same draft, in the same dtype), and
llama.cpp on the same GGUF files, plain (the reference: the fastest plain decoder on the machine) and with its own
speculation. Only then does the page race them: every lane is replayed at its own recorded times on one clock
(`Race.replay`, `advance_to`), so at any moment each column shows how far its strategy got in the same amount of
its own time: lanes stepped live between page updates ran 55% slower than in the bench, with a browser on the same
two cores, and named another winner. Every lane's clock includes its own set-up (reading the prompt), as a user would
time it, and every lane stops at the model's end of text.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Iterator

from ..decode import end_tokens
from ..peers import llama_cpp
from ..peers.hf import ArrivalClock, hf_generate
from .settings import Settings, UserError
from ..stack.plans import keep_learnt
from .stacks import get_stack, new_decoder, prompt_ids, stats_of
from ..recording import RecordedLane

ENGINE_LANES = ("baseline", "speculative", "staged")
PEER_LANE = "hf_assisted"
REFERENCE_LANE = llama_cpp.PLAIN
COMPARED = (REFERENCE_LANE, *ENGINE_LANES, PEER_LANE, llama_cpp.SPECULATIVE)
SHOWN = (*ENGINE_LANES, REFERENCE_LANE, PEER_LANE, llama_cpp.SPECULATIVE)     # the page's order: ours, then the peers
# How time_lanes times the lanes, in the words the page's help, its notes and the recordings use (tests/test_app.py
# checks them against what time_lanes does)
IN_TURN = "our lanes take a step each in turn, the one whose own clock shows the least time next"
ONE_AFTER_ANOTHER = "llama.cpp and HF run one after another, each to its end"
TIMING = f"each step alone; {IN_TURN}; {ONE_AFTER_ANOTHER} (specviz/app/race.py, time_lanes)"


@dataclass
class PeerLane:
    """A finished `generate()` call replayed chunk by chunk at the times its chunks arrived."""
    chunks: list[tuple[float, list[int]]]
    max_new_tokens: int
    target_forwards: int
    tokenizer: object = None
    shown: int = 0                     # chunks revealed so far
    texts: list[str] | None = None     # a recorded lane: the text after each chunk (no tokenizer)

    @classmethod
    def run(cls, stack, settings: Settings, prompt_ids: list[int]) -> "PeerLane":
        _, draft = stack.assistant()
        if draft is None:
            raise UserError("HF assisted generation needs a draft model; this stack has "
                            f"{', '.join(stack.drafts) or 'no drafters'}.")
        clock = ArrivalClock()
        run = hf_generate(stack.target.model, prompt_ids, settings.sampling, settings.max_new_tokens,
                          assistant=draft, stop_at_eos=True, streamer=clock)
        return cls(clock.chunks, settings.max_new_tokens, run.target_forwards, tokenizer=stack.tokenizer)

    @classmethod
    def llama(cls, stack, settings: Settings, prompt_ids: list[int], peer: str) -> "PeerLane":
        """llama.cpp's own program on the stack's GGUF files, with as many threads as ours (peers/llama_cpp.py)."""
        try:
            run, chunks = llama_cpp.generate_for(stack, peer, prompt_ids, settings.sampling, settings.max_new_tokens,
                                                 stop_at_end=True)
        except llama_cpp.LlamaCppMissing as exc:
            raise UserError(str(exc)) from None
        return cls(chunks, settings.max_new_tokens, run.target_forwards, tokenizer=stack.tokenizer)

    @property
    def finished(self) -> bool:
        return self.shown == len(self.chunks)

    @property
    def new_tokens(self) -> list[int]:
        return [t for _, chunk in self.chunks[: self.shown] for t in chunk]

    @property
    def elapsed(self) -> float:
        return self.chunks[self.shown - 1][0] if self.shown else 0.0

    def text(self) -> str:
        if self.texts is not None:
            return self.texts[self.shown - 1] if self.shown else ""
        return self.tokenizer.decode(self.new_tokens, skip_special_tokens=True)

    def step(self) -> None:
        self.shown += 1

    def stats(self) -> dict:
        """What the compare table shows for a peer (its forwards are counted for the whole run)."""
        if not self.shown:
            return {}
        made = len(self.new_tokens)
        forwards = max(1, round(self.target_forwards * self.shown / len(self.chunks)))
        return {"new_tokens": made, "wall_s": self.elapsed, "tokens_per_s": made / max(self.elapsed, 1e-9),
                "target_forwards": forwards, "tokens_per_target_forward": made / forwards}


@dataclass
class Race:
    decoders: dict[str, object]                 # our strategies
    skipped: dict[str, str]                     # lane -> why it is not in the race
    peers: dict[str, PeerLane] = field(default_factory=dict)
    setup_s: dict[str, float] = field(default_factory=dict)
    precision: str = ""                         # our lanes' precision, as the stack names it

    @classmethod
    def start(cls, settings: Settings, lanes=COMPARED) -> "Race":
        """Every lane timed alone to the end (time_lanes, without its progress reports)."""
        timing = time_lanes(settings, lanes)
        while True:
            try:
                next(timing)
            except StopIteration as done:
                return done.value

    def replay(self) -> "Race":
        """The timed race from its start, to reveal at the recorded times (advance_to)."""
        decoders = {name: RecordedLane.of(d, self.setup_s.get(name, 0.0)) for name, d in self.decoders.items()}
        for lane in decoders.values():
            lane.shown = 0
        peers = {name: PeerLane(p.chunks, p.max_new_tokens, p.target_forwards, p.tokenizer, texts=p.texts)
                 for name, p in self.peers.items()}
        return Race(decoders, dict(self.skipped), peers, dict(self.setup_s), self.precision)

    def next_time(self, lane: str) -> float:
        """When, on the lane's own clock, its next step (or chunk) is done."""
        item = self.lanes()[lane]
        if isinstance(item, PeerLane):
            return item.chunks[item.shown][0]
        return self.elapsed(lane) + item.recorded_steps[item.shown].wall_s

    def advance_to(self, seconds: float) -> int:
        """Reveal every step of every lane done by `seconds` on the lanes' clocks; returns how many."""
        shown = 0
        while True:
            pending = [n for n, lane in self.lanes().items() if not lane.finished and self.next_time(n) <= seconds]
            if not pending:
                return shown
            self.lanes()[min(pending, key=self.next_time)].step()
            shown += 1

    def own_times(self) -> dict[str, float]:
        """Each lane's whole time on its own clock (set-up included), however far a replay got."""
        return {name: _total(lane, self.setup_s.get(name, 0.0)) for name, lane in self.lanes().items()}

    def duration(self) -> float:
        """The slowest lane's own time: how long a replay at the recorded times takes."""
        return max(self.own_times().values(), default=0.0)

    def elapsed(self, lane: str) -> float:
        if lane in self.peers:
            return self.peers[lane].elapsed
        return self.setup_s.get(lane, 0.0) + sum(s.wall_s for s in self.decoders[lane].steps)

    def lanes(self) -> dict[str, object]:
        return {**self.decoders, **self.peers}

    @property
    def finished(self) -> bool:
        return all(lane.finished for lane in self.lanes().values())

    def step(self) -> str:
        """Step the unfinished lane that has used the least time so far, so at every moment each
        column shows how far its strategy got in the same amount of its own time."""
        name = min((n for n, lane in self.lanes().items() if not lane.finished), key=self.elapsed)
        self.lanes()[name].step()
        return name

    def same_text(self) -> bool:
        return len({tuple(d.new_tokens) for d in self.decoders.values()}) == 1

    def differing(self) -> list[str]:
        """Lanes whose output is not baseline's (only greedy output is expected to be identical)."""
        base = self.decoders["baseline"]
        return [name for name, lane in self.lanes().items() if not _same_output(lane, base)]

    def stats(self) -> dict[str, dict]:
        """Our strategies' statistics (from their traces), for the charts."""
        return {name: stats_of(d) for name, d in self.decoders.items()}

    def table_stats(self) -> dict[str, dict]:
        """Every lane's speed and tokens per target pass, for the table; clocks include set-up."""
        rows = {}
        for name, s in self.stats().items():
            if s:
                wall = self.elapsed(name)
                rows[name] = {**s, "wall_s": wall, "tokens_per_s": s["new_tokens"] / max(wall, 1e-9)}
        return rows | {name: peer.stats() for name, peer in self.peers.items()}


@dataclass
class Progress:
    """Where time_lanes is: the lane being timed and its tokens so far."""
    lane: str
    tokens: int
    max_new_tokens: int
    done: tuple[str, ...] = ()       # lanes already timed
    together: dict[str, int] = field(default_factory=dict)     # our lanes taking steps in turn: their tokens so far


def time_lanes(settings: Settings, lanes=COMPARED) -> Iterator[Progress]:
    """Time every lane alone: a generator that reports its progress between steps (the caller may update a page
    there: that is outside every timed section) and returns the Race. The peers run one after another, each to its
    end; our lanes take one step each in turn (_step_in_turn)."""
    stack = get_stack(settings.stack_key())
    race = Race({}, {}, precision=stack.precision())
    done: list[str] = []
    ours = [lane for lane in lanes if lane in ENGINE_LANES]
    _warm_up(stack, settings, ours)
    for lane in lanes:
        if lane in ours:
            if lane == ours[0]:
                yield from _step_in_turn(race, stack, settings, ours, done)
            continue
        yield Progress(lane, 0, settings.max_new_tokens, tuple(done))
        try:
            if lane == PEER_LANE:
                race.peers[lane] = PeerLane.run(stack, settings, prompt_ids(stack, settings))
            else:
                race.peers[lane] = PeerLane.llama(stack, settings, prompt_ids(stack, settings), lane)
            race.peers[lane].shown = len(race.peers[lane].chunks)
        except UserError as exc:
            race.skipped[lane] = str(exc)
        done.append(lane)
    return race


_WARM: dict[int, weakref.ref] = {}          # id -> stacks whose lanes have run once in this process


def _warm_up(stack, settings: Settings, lanes: list[str]) -> None:
    """Once per loaded stack, each of our lanes decodes 2 tokens, untimed. A process's first forwards pack the
    file's blocks, fault its mapped pages in and grow allocators; timed, the first lane paid for all of them
    (baseline's set-up 2.3 s in a fresh process, 0.8 s after)."""
    if (ref := _WARM.get(id(stack))) is not None and ref() is stack:
        return
    for lane in lanes:
        try:
            decoder = new_decoder(stack, replace(settings, max_new_tokens=2), lane)
        except UserError:
            continue
        decoder.generate()
    _WARM[id(stack)] = weakref.ref(stack)


def _step_in_turn(race: "Race", stack, settings: Settings, lanes: list[str], done: list[str]) -> Iterator[Progress]:
    """Our lanes, each step timed alone: next is always the unfinished lane whose own clock shows the least time
    (its set-up, reading the prompt, is its first step). So all of them run through the same minutes of the
    machine, and a slow spell of a shared CPU slows them alike instead of deciding the winner; one lane timed to its
    end after another named another winner than the bench where the machine's speed drifted."""
    def tokens_so_far() -> dict[str, int]:
        return {lane: len(race.decoders[lane].new_tokens) if lane in race.decoders else 0
                for lane in lanes if lane not in race.skipped}

    pending = list(lanes)
    yield Progress(lanes[0], 0, settings.max_new_tokens, tuple(done), tokens_so_far())
    while pending:
        lane = min(pending, key=lambda name: race.elapsed(name) if name in race.decoders else 0.0)
        decoder = race.decoders.get(lane)
        if decoder is None:
            started = perf_counter()
            try:
                decoder = race.decoders[lane] = new_decoder(stack, settings, lane)    # reads the prompt
            except UserError as exc:
                if lane == "baseline":
                    raise
                race.skipped[lane] = str(exc)
                if lane == "staged":
                    race.skipped[lane] = ("staged needs a draft model with a cheaper drafter below it; this model "
                                          f"stack has: {', '.join(stack.drafts) or 'no drafters'}.")
                pending.remove(lane)
                continue
            race.setup_s[lane] = perf_counter() - started
        else:
            decoder.step()
        if decoder.finished:
            keep_learnt(decoder, stack.profile)
            pending.remove(lane)
            done.append(lane)
        yield Progress(lane, len(decoder.new_tokens), decoder.max_new_tokens, tuple(done), tokens_so_far())


def _total(lane, setup_s: float) -> float:
    """A lane's whole time on its own clock (set-up included)."""
    if isinstance(lane, PeerLane):
        return lane.chunks[-1][0] if lane.chunks else 0.0
    steps = lane.recorded_steps if isinstance(lane, RecordedLane) else lane.steps
    return setup_s + sum(s.wall_s for s in steps)


def _same_output(lane, base) -> bool:
    """A peer's text is compared as text over the shorter of the two (llama.cpp's is tokenized again by us, may end
    mid-round, and in a recording made with its `--ignore-eos` goes on past our end); otherwise token by token."""
    if isinstance(lane, PeerLane) and lane.tokenizer is not None:
        return llama_cpp.same_text(lane.tokenizer.decode(base.new_tokens, skip_special_tokens=True), lane.text())
    if isinstance(lane, PeerLane) and lane.texts is not None and lane.new_tokens != base.new_tokens:
        return llama_cpp.same_text(end_tokens.SPECIAL.sub("", base.text()), lane.text())
    return lane.new_tokens == base.new_tokens
