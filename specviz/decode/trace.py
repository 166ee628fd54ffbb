"""The trace record: what one speculation round did, as plain data, and the clock that times its phases.

The record is the contract between the engine and everything that shows or measures it (plots, the
app, the benchmark, tests): only ints, floats, strings, bools and lists/dicts of them, so a trace
serialises to JSON and figures can be rebuilt from a recorded file without any model.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from time import perf_counter


class Phase:
    """The names of a round's timed phases, the keys of a step's phase_s (recordings keep them as these strings): one
    drafting phase per stage, the draft models' prompt read, verification, and the rest."""
    TREE = "tree"
    VERIFY = "verify"
    BOOKKEEPING = "bookkeeping"
    PROMPT_READ = "prompt_read"     # draft models reading the prompt (their first round's catch-up)

    @staticmethod
    def draft(stage: int) -> str:
        return f"stage{stage}_draft"

    @staticmethod
    def stage_of(key: str) -> int | None:
        """The stage a drafting phase belongs to; None for any other phase."""
        if key.startswith("stage") and key.endswith("_draft"):
            return int(key[len("stage"):-len("_draft")])
        return None


class PhaseTimer:
    """Exclusive wall time per phase: a nested phase pauses the one around it."""

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


@dataclass
class NodeRecord:
    id: int
    token: int
    text: str
    parent: int                 # -1 for the root
    depth: int
    rank: int                   # draw order among its siblings
    stage: int                  # index into StepRecord.stages of the stage that proposed it
    draft_prob: float | None    # q(token | parent); None for the root
    target_prob: float | None   # p(token | parent) under the target; None for the root
    accept_prob: float | None   # chance the target accepted it when tried; None if never tried
    accepted: bool
    calibrated: float | None = None     # the chance of acceptance the round's plan gave it
                                        # (specviz/decode/calibration.py)


@dataclass
class StageInfo:
    name: str
    kind: str                   # "target", "model", "ngram" or "lookup"


@dataclass
class PlanRecord:
    """Why a planned round had its shape (specviz/decode/planner.py)."""
    kind: str                   # "speculate", "plain" or "probe"
    recent_tokens: float        # what the recent drafted rounds made a round, the bonus token included...
    recent_ms: float            # ...in so many milliseconds, by the cost curves
    plain_ms: float             # a plain step's milliseconds
    rates: list[float]          # per depth 1, 2, ...: the chance that a guess reached there was accepted, lately
    calibration: dict[str, list[list[float]]]   # per stage kind, depth bucket and score bin: the calibrated chance
    lookup_found: int = 0       # tokens context lookup could copy from the text this round...
    lookup_joined: int = 0      # ...and how many of them joined it
    lookup_chance: float = 0.0  # the calibrated chance of the first that did not join (else of the last that did)...
    lookup_price: float = 0.0   # ...and the chance it needed to pay for verifying it
    probe_held: bool = False    # a probe was due by the count of plain steps, but would not have paid...
    predicted: float = 0.0      # ...at this chance of a first guess, predicted from the target's recent confidence...
    behind: int = 0             # ...with so many tokens the draft had to read first
    probe_wait: int | None = None   # plain steps in a row before a probe, at this round (None: a recording made
                                    # before it was kept)


@dataclass
class StepRecord:
    step: int
    strategy: str
    stages: list[StageInfo]                  # stage 0 is the target
    nodes: list[NodeRecord]
    accepted_path: list[int]                 # node ids, root first
    committed_tokens: list[int]              # new output tokens this step (accepted drafts + bonus)
    committed_text: list[str]
    committed_stage: list[int]               # stage that produced each committed token (0 = target)
    phase_s: dict[str, float]                # by Phase: each stage's drafting, verify, bookkeeping
    forwards: dict[str, list[int]]           # model name -> tokens fed in each forward pass
    bytes_read: dict[str, float]             # model name -> weight + KV bytes read this step
    wall_s: float
    position: int                            # output tokens before this step
    finished: bool = False
    finish_reason: str = ""                  # "eos", "length" or ""
    plan: PlanRecord | None = None           # a planned round's plan; None where the tree's shape was fixed

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepRecord":
        data = dict(data)
        data["stages"] = [StageInfo(**s) for s in data["stages"]]
        data["nodes"] = [NodeRecord(**n) for n in data["nodes"]]
        if data.get("plan") is not None:
            data["plan"] = PlanRecord(**data["plan"])
        return cls(**data)


@dataclass
class RunRecord:
    """A whole generation: settings, the steps, the output and its aggregate statistics."""
    strategy: str
    prompt_tokens: int
    tokens: list[int]
    text: str
    steps: list[StepRecord] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunRecord":
        data = dict(data)
        data["steps"] = [StepRecord.from_dict(s) for s in data["steps"]]
        return cls(**data)


class CommittedSoFar:
    """A live decoder's `new_tokens` and `text()`, for what stands in for one without models (a recording revealed
    step by step, a reader of a shared decode): read from its `steps`, the rounds shown so far."""
    steps: list[StepRecord]

    @property
    def new_tokens(self) -> list[int]:
        return [t for step in self.steps for t in step.committed_tokens]

    def text(self) -> str:
        return "".join(t for step in self.steps for t in step.committed_text)
