"""The app's handlers for recordings: open (shipped or uploaded), back to live, save, and the page that
opens on a recording (a Space shows one before any model loads)."""
from __future__ import annotations

import logging
import os

import gradio as gr

from . import replay
from .events import STEP_OUTPUTS, guarded, render_race, render_step
from .sessions import Session
from .settings import SETTING_NAMES, UserError

log = logging.getLogger("specviz.app")

# -- recordings ------------------------------------------------------------------------------------

OPEN_OUTPUTS = STEP_OUTPUTS + len(SETTING_NAMES)


@guarded(OPEN_OUTPUTS)
def on_open(session: Session, source):
    """Open a shipped recording (its name) or an uploaded file (bytes) for replay."""
    if source is None or source == "":
        raise UserError("Pick a recording or upload a file first.")
    recording = replay.open_into(session, source)
    step = render_step(session, f"Opened a recording ({replay.label(recording)}). Step, Run and Compare replay "
                                "it with no model loaded; the times shown are the recorded ones.")
    return (*step[:2], *_controls(recording), *step[2:])


@guarded(STEP_OUTPUTS)
def on_live(session: Session):
    replay.close(session)
    return render_step(session, "Back to live decoding: the next Step runs the models.")


@guarded(3)
def on_save(session: Session):
    path = replay.save(session)
    return session, f"Saved: {path.name} (open it under **Recordings** to replay it).", str(path)


# -- a page that opens on a recording (a Space shows one before any model loads) -------------------

SPACE_RECORDING = "cpu-offline-humaneval0-greedy"
START_RECORDING = os.environ.get("SPECVIZ_OPEN_RECORDING", SPACE_RECORDING if os.environ.get("SPACE_ID") else "")


def on_start(n_outputs: int):
    """A new visitor's session; with START_RECORDING, already showing that recording's first step and
    its finished race, so the page has something to show while (or instead of) loading models."""
    session = Session()
    if not START_RECORDING:
        return session, *[gr.skip()] * (n_outputs - 1)
    try:
        recording = replay.open_into(session, START_RECORDING)
    except UserError as exc:
        log.warning("cannot open %s at start: %s", START_RECORDING, exc)
        return session, *[gr.skip()] * (n_outputs - 1)
    session.decoder.step()
    session.race = race = replay.race_of(recording)
    while race is not None and not race.finished:
        race.step()
    step = render_step(session, f"Showing a recorded run ({replay.label(recording)}): press **Step**, **Run** or "
                                "**Compare** to replay it, or **Back to live decoding** (under Recordings) to run "
                                "the models yourself.")
    return (*step[:2], *_controls(recording), *step[2:], *render_race(session, "")[2:])


def _controls(recording) -> list:
    values = replay.control_values(recording)
    return [values[name] for name in SETTING_NAMES]
