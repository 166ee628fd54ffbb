"""The app's handlers for recordings: open (shipped or uploaded), back to live, save, and the page that
opens on a recording (a Space shows one before any model loads)."""
from __future__ import annotations

import logging
import os

import gradio as gr

from . import replay, words
from .compare_events import NOT_MEASURED, render_race
from .events import STEP_OUTPUTS, guarded, render_step
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

# A Space opens on the qwen-coder pair's race on HumanEval/0 (greedy), recorded on a 2-core CPU: the same-family
# pair the paper's setup resembles, where staged beats our baseline and llama.cpp
SPACE_RECORDING = "cpu-qwen-coder-humaneval0-greedy"
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
    answer, measured = "", NOT_MEASURED
    if race is not None:
        while not race.finished:
            race.step()
        answer, measured = words.outcome(race, session.settings.sampling.greedy,
                                         words.recorded_timing(recording.recorded))
    step = render_step(session, f"Showing a recorded run ({replay.label(recording, short=True)}). {answer} "
                                "Press **Step**, **Run** or **Compare** to replay it, or **Back to live decoding** "
                                "under Recordings.")
    return (*step[:2], *_controls(recording), *step[2:], *render_race(session, "", measured=measured)[2:])


def _controls(recording) -> list:
    values = replay.control_values(recording)
    return [values[name] for name in SETTING_NAMES]
