"""Waiting for an app.py started as a process of its own to answer (the browser tests, the simulated Space)."""
from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def wait_for_page(url: str, app: subprocess.Popen, log: Path, seconds: float) -> None:
    """Return once the page answers; fail with the app's log where it exits or stays silent for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if app.poll() is not None:
            pytest.fail(f"app.py exited with {app.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"app.py did not answer within {seconds:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(1)


def stop(app: subprocess.Popen) -> None:
    """End the app: asked first, killed where it does not end within 20 s."""
    app.terminate()
    try:
        app.wait(timeout=20)
    except subprocess.TimeoutExpired:
        app.kill()
        app.wait()
