"""The one thread every handler of the app computes on (Stop, which only flags a session, stays on Gradio's).

torch and specviz's kernels share one OpenMP runtime (the kernels load torch's libgomp). It gives each thread that
opens a parallel region a team of workers of its own, and once it manages more threads than the machine has cores it
stops spinning between regions: with Gradio's handler threads each keeping a team, every product in the server
would take up to twice as long (the CLI and the bench compute on their main thread and are not affected).

A handler's loop that must wait (a replay's pace, the race's frames, a place in line) yields `Wait` instead of
sleeping: a sleep on the compute thread would hold up every other visitor's step.
"""
from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import sleep

COMPUTE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-compute")
_DONE = object()


@dataclass(frozen=True)
class Wait:
    """Yielded by a handler's loop: wait this long on the event's own thread, then go on."""
    seconds: float


def computed(fn, *args):
    """fn(*args) on the compute thread, in the caller's context (Gradio's per-event state)."""
    return COMPUTE.submit(contextvars.copy_context().run, fn, *args).result()


def computed_steps(steps):
    """A generator's items, each computed on the compute thread; its `Wait`s are waited here, off that thread."""
    try:
        while (item := computed(next, steps, _DONE)) is not _DONE:
            if isinstance(item, Wait):
                sleep(max(0.0, item.seconds))
            else:
                yield item
    finally:
        COMPUTE.submit(steps.close)     # a page that went away: the loop's own clean-up, on its thread
