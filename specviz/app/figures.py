"""A recording's figures as files for slides: `python -m specviz.app.figures RECORDING --out DIR`.

Each figure the page draws from a recording, drawn by the same functions from the same replay, written as SVG (for
slides that scale) and PNG (twice the size, for those that do not): the Step view's tree of one step and its
acceptance map over the whole run, and the Compare tab's charts of the finished race. The regime, the lossless test
and the benchmark panel come from live models or a bench report, not from a recording, so they are not among them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import plots, recording as rec
from ..plots.export import ImageExportError, write_images
from ..recording import Recording, RecordingError
from . import panels, replay

SLIDE_WIDTH = 1200          # layout pixels; each figure keeps the height the page gives it
PNG_SCALE = 2
FORMATS = ("svg", "png")


def figures(recording: Recording, step: int = 1) -> tuple[dict, list[str]]:
    """The recording's figures by name, and a line for each the page would draw that this recording cannot give."""
    lane = recording.step_lane()
    while not lane.finished:
        lane.step()
    if not 1 <= step <= len(lane.steps):
        raise RecordingError(f"--step {step}: the recorded {lane.strategy} run has steps 1 to {len(lane.steps)}")
    drawn = {"tree": plots.tree_figure(lane.steps[step - 1]), "acceptance": plots.acceptance_figure(lane.steps)}
    race = replay.race_of(recording)
    if race is None:
        return drawn, ["latency, forwards, memory, speed: the recording holds no race (Compare was not run)"]
    while not race.finished:
        race.step()
    stats, stages = race.stats(), {name: racer.stages for name, racer in race.decoders.items()}
    drawn |= {"latency": plots.latency_figure(stats, stages), "forwards": plots.forwards_figure(stats),
              "memory": plots.memory_figure(stats, stages)}
    speed = panels.speed_view({name: racer.steps for name, racer in race.decoders.items()})
    if speed is None:
        return drawn, ["speed: the race has no baseline lane, or no lane that speculated"]
    drawn["speed"] = panels.speed_figure(speed)
    return drawn, []


def source_of(name: str) -> Path:
    """A shipped recording's file by its name, or the file named."""
    shipped = rec.shipped()
    if name in shipped:
        return shipped[name]
    if not Path(name).is_file():
        raise RecordingError(f"{name!r} is neither a file nor a shipped recording ({', '.join(shipped)})")
    return Path(name)


def main(argv: list[str] | None = None) -> int:
    """`python -m specviz.app.figures`: a recording's figures as SVG and PNG files, for slides."""
    parser = argparse.ArgumentParser(prog="python -m specviz.app.figures", description=main.__doc__)
    parser.add_argument("recording", help="a recording file (.json or .json.gz), or a shipped recording's name")
    parser.add_argument("--out", required=True, help="the folder to write the figures into (made if missing)")
    parser.add_argument("--step", type=int, default=1, help="the step whose tree is drawn (default 1, as the page "
                                                           "opens on)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        drawn, missing = figures(rec.load(source_of(args.recording)), args.step)
        out.mkdir(parents=True, exist_ok=True)
        write_images({out / f"{name}.{suffix}": fig for name, fig in drawn.items() for suffix in FORMATS},
                     width=SLIDE_WIDTH, png_scale=PNG_SCALE)
    except (RecordingError, ImageExportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(drawn)} as .svg and .png into {out}")
    for line in missing:
        print(f"not drawn: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
