"""Recorded runs: a whole Compare race (and the Step view's strategy) saved as one JSON file that
replays with no model loaded. It may import decode/ and profile/.

A recording holds the settings, where and when it was recorded, the models' names, sizes and
precision, and every lane's trace records (specviz/decode/trace.py) with their measured timings. Replay
wraps each recorded lane in an object with the live decoder's interface (`steps`, `step()`,
`finished`, ...), so the app draws recorded and live runs with the same code. Files from users are
untrusted: `load()` checks size, format, version and every field's type, and refuses a bad file
with one line. Every lane ends at its first end-of-text token (`recorded["end_tokens"]`, or in a file
that lacks them the tokens whose text names an end): a run recorded while the engine missed some of
them is replayed as far as the engine now goes, with its recorded times. Making a recording (from an
app session, or `python -m specviz.app.record`) is specviz/app/record.py.
"""
from __future__ import annotations

import gzip
import io
import json
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path

from ..decode import end_tokens
from ..decode.sampling import Sampling
from ..profile.environment import env_number
from ..decode.trace import CommittedSoFar, StageInfo, StepRecord

FORMAT = "specviz-recording"
VERSION = 1
MAX_BYTES = int(env_number("SPECVIZ_MAX_RECORDING_BYTES", 8_000_000))
RECORDINGS = Path(__file__).resolve().parents[2] / "assets" / "recordings"


class RecordingError(ValueError):
    """A file that is not a usable recording; the message is one line meant for the user."""


# -- replay ------------------------------------------------------------------------------------------

@dataclass
class RecordedLane(CommittedSoFar):
    """One recorded generation, revealed a step at a time with the live decoder's interface."""
    strategy: str
    prompt: list[int]
    stages: list[StageInfo]
    # model name -> [weight bytes, KV bytes per cached token, bytes per token fed]
    costs: dict[str, list[int]]
    max_new_tokens: int
    sampling: Sampling
    recorded_steps: list[StepRecord]
    setup_s: float = 0.0
    prompt_text: str = ""                   # the prompt as the model read it (in chat, inside its template)
    shown: int = 0

    @property
    def steps(self) -> list[StepRecord]:
        return self.recorded_steps[: self.shown]

    def step(self) -> StepRecord:
        if self.finished:
            raise RuntimeError("generation already finished")
        self.shown += 1
        return self.recorded_steps[self.shown - 1]

    @property
    def finished(self) -> bool:
        return self.shown == len(self.recorded_steps)

    @property
    def finish_reason(self) -> str:
        return self.steps[-1].finish_reason if self.steps else ""

    def model_costs(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(cost) for name, cost in self.costs.items()}

    @classmethod
    def of(cls, decoder, setup_s: float = 0.0) -> "RecordedLane":
        """A finished (or stopped) live decoder, as recorded."""
        return cls(decoder.strategy, list(decoder.prompt), list(decoder.stages),
                   {k: list(v) for k, v in decoder.model_costs().items()}, decoder.max_new_tokens,
                   decoder.sampling, list(decoder.steps), setup_s, _prompt_text(decoder), shown=len(decoder.steps))


def _prompt_text(decoder) -> str:
    """A recorded lane, or a reader of a shared decode, keeps the prompt's text; a live decoder has its tokenizer."""
    if hasattr(decoder, "prompt_text"):
        return decoder.prompt_text
    return decoder.tokenizer.decode(decoder.prompt)


@dataclass
class RecordedPeer:
    """A recorded peer lane (HF assisted generation): chunks of tokens, when each arrived and the text
    so far after each."""
    arrivals: list[float]
    chunks: list[list[int]]
    texts: list[str]
    max_new_tokens: int
    target_forwards: int


@dataclass
class Recording:
    settings: dict                 # prompt, strategy, preset, target, drafts, sampling, tree, max_new_tokens
    recorded: dict                 # machine, device, date, precision, models {name: bytes}, specviz
    lanes: dict[str, RecordedLane]
    race: list[str]                # the lanes that raced, in order
    peers: dict[str, RecordedPeer] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def label(self) -> str:
        return f"recorded on {self.recorded['machine']}, {self.recorded['date'][:10]}"

    def step_lane(self) -> RecordedLane:
        """A fresh replay of the Step view's strategy."""
        return _fresh(self.lanes[self.settings["strategy"]])

    def race_lanes(self) -> dict[str, RecordedLane]:
        """Fresh replays of the recorded race's own lanes (the app builds its race from them: app/replay.py)."""
        return {n: _fresh(self.lanes[n]) for n in self.race if n in self.lanes}

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "settings": self.settings, "recorded": self.recorded,
                "race": self.race, "skipped": self.skipped,
                "lanes": {name: _lane_dict(lane) for name, lane in self.lanes.items()},
                "peers": {name: vars(peer) for name, peer in self.peers.items()}}


def _fresh(lane: RecordedLane) -> RecordedLane:
    return RecordedLane(**{**vars(lane), "shown": 0})


def _lane_dict(lane: RecordedLane) -> dict:
    data = {f.name: getattr(lane, f.name) for f in fields(lane) if f.name not in ("shown", "recorded_steps", "stages")}
    data["sampling"] = vars(lane.sampling)
    data["stages"] = [vars(s) for s in lane.stages]
    data["steps"] = [s.to_dict() for s in lane.recorded_steps]      # all of them, however far a replay got
    return data


# -- checking untrusted files ------------------------------------------------------------------------

def _check(value, hint, where: str):
    """Raise RecordingError unless `value` (parsed JSON) has the type `hint`; return it, with
    dataclasses built."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_dataclass(hint):
        if not isinstance(value, dict):
            raise RecordingError(f"{where} should be an object")
        hints = typing.get_type_hints(hint)
        names = {f.name for f in fields(hint) if f.init}
        unknown = set(value) - names
        if unknown:
            raise RecordingError(f"{where} has unknown field {sorted(unknown)[0]!r}")
        missing = [f.name for f in fields(hint) if f.init and f.name not in value
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise RecordingError(f"{where} lacks the field {missing[0]!r}")
        return hint(**{k: _check(v, hints[k], f"{where}.{k}") for k, v in value.items()})
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check(value, option, where)
            except RecordingError:
                pass
        raise RecordingError(f"{where} has the wrong type")
    if origin is list:
        if not isinstance(value, list):
            raise RecordingError(f"{where} should be a list")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordingError(f"{where} should be an object")
        return {k: _check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if hint is type(None):
        if value is not None:
            raise RecordingError(f"{where} should be null")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordingError(f"{where} should be a number")
        return float(value)
    if hint in (int, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise RecordingError(f"{where} should be {'a whole number' if hint is int else 'a ' + hint.__name__}")
        return value
    if hint is dict:
        if not isinstance(value, dict):
            raise RecordingError(f"{where} should be an object")
        return value
    raise TypeError(f"no check for {hint!r}")


@dataclass
class _LaneFile:
    strategy: str
    prompt: list[int]
    stages: list[StageInfo]
    costs: dict[str, list[int]]
    max_new_tokens: int
    sampling: Sampling
    steps: list[StepRecord]
    setup_s: float = 0.0
    prompt_text: str = ""


def _without_plan_words(data) -> None:
    """Recordings made while a plan record carried its reason in words (now made when shown: decode/reasons.py) keep
    opening: the words are dropped, the numbers they were made from stay."""
    steps = data.get("steps") if isinstance(data, dict) else None
    for step in steps if isinstance(steps, list) else []:
        plan = step.get("plan") if isinstance(step, dict) else None
        if isinstance(plan, dict):
            plan.pop("reason", None)


def _lane(data, where: str) -> RecordedLane:
    _without_plan_words(data)
    lane = _check(data, _LaneFile, where)
    try:
        lane.sampling.validate()
    except ValueError as exc:
        raise RecordingError(f"{where}.sampling: {exc}") from None
    if not lane.steps or any(len(c) not in (2, 3) for c in lane.costs.values()):
        raise RecordingError(f"{where} has no steps or a malformed cost")
    for i, s in enumerate(lane.steps):
        if not s.nodes or len({len(s.committed_text), len(s.committed_tokens), len(s.committed_stage)}) != 1:
            raise RecordingError(f"{where}.steps[{i}] is inconsistent")
        if any(not 0 <= n.stage < len(s.stages) for n in s.nodes) or any(
                not 0 <= st < len(s.stages) for st in s.committed_stage):
            raise RecordingError(f"{where}.steps[{i}] names a stage it does not have")
    return RecordedLane(lane.strategy, lane.prompt, lane.stages, lane.costs, lane.max_new_tokens,
                        lane.sampling, lane.steps, lane.setup_s, lane.prompt_text)


def from_dict(data) -> Recording:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError("This is not a specviz recording (its \"format\" is not specviz-recording).")
    if data.get("version") != VERSION:
        raise RecordingError(f"This recording has format version {data.get('version')!r}; this specviz reads "
                             f"version {VERSION}.")
    settings = _check(data.get("settings"), dict, "settings")
    for key, kind in (("prompt", str), ("strategy", str), ("preset", str), ("max_new_tokens", int)):
        _check(settings.get(key), kind, f"settings.{key}")
    recorded = _check(data.get("recorded"), dict[str, typing.Union[str, dict, list[int]]], "recorded")
    for key in ("machine", "date", "device", "precision"):
        _check(recorded.get(key), str, f"recorded.{key}")
    lanes = {name: _lane(lane, f"lanes.{name}") for name, lane in _check(data.get("lanes"), dict, "lanes").items()}
    race = _check(data.get("race"), list[str], "race")
    peers = _check(data.get("peers", {}), dict[str, RecordedPeer], "peers")
    skipped = _check(data.get("skipped", {}), dict[str, str], "skipped")
    if settings["strategy"] not in lanes or any(name not in lanes and name not in peers and name not in skipped
                                                for name in race):
        raise RecordingError("This recording lacks a lane that its settings or race name.")
    for name, peer in peers.items():
        if not len(peer.arrivals) == len(peer.chunks) == len(peer.texts):
            raise RecordingError(f"peers.{name} is inconsistent")
    recording = Recording(settings, recorded, lanes, race, peers, skipped)
    cut_at_end(recording)
    return recording


def cut_at_end(recording: Recording) -> None:
    """End every lane at its first end-of-text token. The steps up to it are what the engine makes now (the same
    rounds, stopping there), so their recorded times stand; a peer keeps the chunks up to it."""
    ends = set(recording.recorded.get("end_tokens") or ())
    if not ends:
        ends = {t for lane in recording.lanes.values() for s in lane.recorded_steps
                for t, text in zip(s.committed_tokens, s.committed_text) if end_tokens.is_marker(text)}
    if not ends:
        return
    texts = {t: text for lane in recording.lanes.values() for s in lane.recorded_steps
             for t, text in zip(s.committed_tokens, s.committed_text)}
    for lane in recording.lanes.values():
        for i, step in enumerate(lane.recorded_steps):
            ended = [k for k, token in enumerate(step.committed_tokens) if token in ends]
            if ended:
                keep = ended[0] + 1
                step.committed_tokens, step.committed_text, step.committed_stage = (
                    step.committed_tokens[:keep], step.committed_text[:keep], step.committed_stage[:keep])
                step.finished, step.finish_reason = True, "eos"
                del lane.recorded_steps[i + 1:]
                break
    for peer in recording.peers.values():
        for i, chunk in enumerate(peer.chunks):
            ended = [k for k, token in enumerate(chunk) if token in ends]
            if ended:
                kept = chunk[: ended[0] + 1]
                known = all(t in texts for t in kept)
                before = peer.texts[i - 1] if i else ""
                peer.chunks[i] = kept
                if known:           # the text up to the end (texts are decoded without special tokens)
                    peer.texts[i] = before + "".join(texts[t] for t in kept if t not in ends and
                                                     not end_tokens.SPECIAL.fullmatch(texts[t]))
                del peer.chunks[i + 1:], peer.texts[i + 1:], peer.arrivals[i + 1:]
                break


def load(source: str | Path | bytes) -> Recording:
    """A recording from a path or raw bytes (JSON, or gzipped JSON as shipped); RecordingError (one
    line) for anything unusable."""
    if isinstance(source, (str, Path)):
        try:
            with open(source, "rb") as file:
                source = file.read(MAX_BYTES + 1)
        except OSError as exc:
            raise RecordingError(f"The file cannot be read: {exc.strerror or exc}") from None
    if source[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(source)) as file:
                source = file.read(MAX_BYTES + 1)       # bounded: a small file may unpack to gigabytes
        except (OSError, EOFError):
            raise RecordingError("The file is a broken gzip archive.") from None
    if len(source) > MAX_BYTES:
        raise RecordingError(f"The file is too large (recordings are at most {MAX_BYTES / 1e6:.0f} MB).")
    try:
        data = json.loads(source.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RecordingError("The file is not JSON: a recording is the JSON file that Save gives.") from None
    return from_dict(data)


def dump(recording: Recording, path: str | Path) -> Path:
    """Write a recording as compact JSON, gzipped when the name ends in .gz (as shipped)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(recording.to_dict(), separators=(",", ":")).encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def shipped() -> dict[str, Path]:
    """The recordings shipped under assets/recordings, by file stem."""
    return {p.name.split(".")[0]: p for p in sorted(RECORDINGS.glob("*.json*"))}
