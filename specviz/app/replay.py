"""Recorded runs in the app: open one (shipped, or uploaded by a visitor) into a session, replay it
with the live views and no model, and save a session's run as a file.

An uploaded file is untrusted: recording.load checks it, and its settings go through the same checks
as the UI's values; a bad file gives one line and leaves the session as it was.
"""
from __future__ import annotations

import html
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .. import recording as rec
from ..recording import Recording, RecordingError
from .race import PeerLane, Race
from .record import of_session, settings_of
from .settings import COMPLETION, OFFLINE_DEFAULT, UserError, parse_settings, preset_names
from .stacks import get_stack


def shipped_choices() -> list[tuple[str, str]]:
    """(label, name) of each shipped recording, for the menu."""
    choices = []
    for name, path in rec.shipped().items():
        try:
            choices.append((f"{name} ({rec.load(path).label()})", name))
        except RecordingError:
            continue
    return choices


def race_of(recording: Recording) -> Race | None:
    """A fresh replay of the recorded race, or None where the recording holds none."""
    if not recording.race:
        return None
    decoders = recording.race_lanes()
    peers = {n: PeerLane(list(zip(p.arrivals, p.chunks)), p.max_new_tokens, p.target_forwards, texts=p.texts)
             for n, p in recording.peers.items() if n in recording.race}
    return Race(decoders, dict(recording.skipped), peers, {n: lane.setup_s for n, lane in decoders.items()},
                precision=recording.recorded.get("precision", ""))


def label(recording: Recording, short: bool = False) -> str:
    """Where and when it was recorded; short: the machine without its instruction sets (the status line's)."""
    text = recording.label()
    if short:
        text = f"recorded on {recording.recorded['machine'].split(', SIMD')[0]}, {recording.recorded['date'][:10]}"
    return html.escape(text)


def control_values(recording: Recording) -> dict:
    """The recording's settings as values of the page's controls, by name (checked like the UI's own:
    a file cannot set a control to a value the UI could not hold)."""
    s = recording.settings
    sampling, tree = s.get("sampling") or {}, s.get("tree") or {}
    greedy = sampling.get("temperature", 0) == 0
    preset = s["preset"] if s["preset"] in preset_names() else OFFLINE_DEFAULT
    values = dict(prompt=s["prompt"], strategy=s["strategy"], preset=preset, target="", drafts="",
                  sampling_mode="greedy" if greedy else "sample",
                  temperature=1.0 if greedy else sampling.get("temperature"), top_k=sampling.get("top_k", 0),
                  top_p=sampling.get("top_p", 1.0), seed=sampling.get("seed", 0), budget=tree.get("budget"),
                  shape=tree.get("shape"), max_depth=tree.get("max_depth"), max_branch=tree.get("max_branch"),
                  lookup=tree.get("lookup"), max_new_tokens=s["max_new_tokens"],
                  prompt_format=s.get("prompt_format", COMPLETION))
    try:
        parse_settings(**values)
    except UserError as exc:
        raise RecordingError(f"Its settings are not valid here: {exc}") from None
    return values


def open_into(session, source) -> Recording:
    """Load a recording (a shipped name, a path or bytes) into the session, ready to step from the start."""
    if isinstance(source, str) and source in rec.shipped():
        source = rec.shipped()[source]
    elif isinstance(source, str):
        raise UserError(f"No shipped recording is called {source!r}.")
    try:
        recording = rec.load(source)
        control_values(recording)          # refuse settings the UI could not hold before anything changes
    except RecordingError as exc:
        raise UserError(f"This file cannot be replayed: {exc}") from None
    session.reset()
    session.recording = recording
    session.decoder, session.settings = recording.step_lane(), settings_of(recording)
    return recording


def close(session) -> None:
    session.recording = None
    session.reset()


def save(session, folder: str | None = None) -> Path:
    """The session's run (its race and its Step generation, or the open recording) as a JSON file."""
    recording = session.recording
    if recording is None:
        if session.race is None and (session.decoder is None or not session.decoder.steps):
            raise UserError("Nothing to save yet: press Step, Run or Compare first.")
        stack = get_stack(session.settings.stack_key())
        recording = of_session(session.settings, session.race, stack, session.decoder)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    folder = Path(folder or tempfile.mkdtemp(prefix="specviz-"))
    return rec.dump(recording, folder / f"specviz-run-{stamp}.json")

