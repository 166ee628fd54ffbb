"""Several `specviz generate` processes started at once on a busy machine write exactly the text each writes alone
(issue 40: under load, `auto`'s probe once picked another precision and another default stack, and the text read
as nonsense). Each process runs the real models, with `auto` and with explicit precisions; each must name the
same stack and precision as when run alone, and read `auto`'s choice from the machine's store, not a new probe. The
processes keep a copy of the machine's profile (SPECVIZ_PROFILE), so the user's is never written, and what they measured
under load is seen in the copy."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.profile.store import PROFILE_FILE, Profile

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
PROMPT = ('import csv\n\ndef read_scores(path):\n'
          '    """Read a CSV of name,score rows and return a dict from name to the highest score."""\n')
TOKENS = "4"
# (preset or None for this machine's default, strategy, dtype); the default stack loads the 1.5B, so it runs once;
# the 135M offline stack under `auto` and in its file's blocks re-quantised (int4)
ALONE = [(None, "baseline", "auto"), ("offline", "baseline", "auto"), ("offline", "baseline", "int4")]
TOGETHER = ALONE + [("offline", "staged", "auto"), ("offline", "staged", "int4")]     # 5 processes on 2 cores


def command(preset, strategy, dtype) -> list[str]:
    return ([sys.executable, "-m", "specviz", "generate", "--prompt", PROMPT, "--strategy", strategy, "--dtype", dtype,
             "--max-new-tokens", TOKENS, "--json", "--no-reference"] + (["--preset", preset] if preset else []))


# The runs alone, one after another in one process (`specviz generate`'s own main, as `python -m specviz` calls it):
# one interpreter's start instead of seven, and the same default thread count as a process of its own
IN_TURN = ("import contextlib, io, json, sys\nfrom specviz.cli import main\n"
           "for argv in json.loads(sys.argv[1]):\n"
           "    out = io.StringIO()\n"
           "    with contextlib.redirect_stdout(out):\n"
           "        assert main(argv) == 0, argv\n"
           "    print(out.getvalue().strip().splitlines()[-1], flush=True)\n")


def fields(line: str) -> dict:
    run = json.loads(line)
    return {key: run[key] for key in ("tokens", "preset", "target", "precision", "precision_reason")}


def outcome(process: subprocess.Popen) -> list[dict]:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    return [fields(line) for line in out.strip().splitlines() if line.startswith("{")]


def start(argv: list[str], profile: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SPECVIZ_PRESET"} | {PROFILE_FILE: str(profile)}
    return subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def measurements(profile: Path) -> dict:
    """The profile's measurements: what a run learnt of its drafts' calibration left out (a run may store that)."""
    machines = json.loads(profile.read_text())["machines"]
    return {machine: {key: entry for key, entry in entries.items() if not key.startswith("calibration of")}
            for machine, entries in machines.items()}


def test_processes_started_together_on_a_busy_machine_write_what_each_writes_alone(tmp_path):
    profile = tmp_path / "auto.json"
    shutil.copyfile(Profile().file.path(), profile)
    measured = measurements(profile)
    in_turn = outcome(start([sys.executable, "-c", IN_TURN, json.dumps([command(*run)[3:] for run in ALONE])],
                            profile))
    assert len(in_turn) == len(ALONE)
    alone = dict(zip(ALONE, in_turn))
    together = {run: start(command(*run), profile) for run in TOGETHER}  # each busy with the others as it loads
    loaded = {run: outcome(process)[-1] for run, process in together.items()}
    for run in TOGETHER:          # baseline's text alone, the same stack and precision, auto's choice from the store
        got, expected = dict(loaded[run]), dict(alone[(run[0], "baseline", run[2])])
        assert got.pop("precision").startswith(expected.pop("precision")), run     # staged's names its draft's too
        assert got == expected, run
    for run in ALONE:             # auto read the machine's stored choice (or ran a GGUF file's own blocks, which needs
        reason = alone[run]["precision_reason"]       # no measurement); an explicit precision needs none
        assert ("measured" in reason or "own blocks" in reason) == (run[2] == "auto"), run
    assert measurements(profile) == measured        # nothing was measured again, under load or alone
