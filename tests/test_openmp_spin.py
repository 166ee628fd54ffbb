"""OpenMP's idle threads spin briefly in every specviz process (the package root sets GOMP_SPINCOUNT before torch
loads libgomp, which reads it once), unless the operator chose a spin or a wait policy. Each entry point is imported
in a fresh process that notes the environment at the moment torch is first imported: a setting made after that
moment is one libgomp never sees."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import OPENMP_SPIN, spin_briefly

REPO = Path(__file__).resolve().parents[1]
# the modules each command starts from: the app, the CLI, the bench, prepare
ENTRY_POINTS = ["app", "specviz.cli", "specviz.bench.cli", "specviz.prepare"]

# Records GOMP_SPINCOUNT as torch starts importing, then imports the entry point.
PROBE = """
import importlib, importlib.abc, json, os, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "at_torch" not in seen:
            seen["at_torch"] = os.environ.get("GOMP_SPINCOUNT")
        return None
sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
print(json.dumps(seen))
"""


def operator_sets(**env: str) -> dict[str, str]:
    """This environment with the operator's OpenMP settings replaced by env."""
    return {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | env


def spin_when_torch_loads(entry: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, entry], cwd=REPO, env=operator_sets(**env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_sets_the_spin_before_torch_loads_openmp(entry):
    assert spin_when_torch_loads(entry) == {"at_torch": OPENMP_SPIN}


def test_an_operators_own_spin_or_wait_policy_wins():
    assert spin_when_torch_loads("specviz.cli", GOMP_SPINCOUNT="500") == {"at_torch": "500"}
    assert spin_when_torch_loads("specviz.cli", OMP_WAIT_POLICY="PASSIVE") == {"at_torch": None}


def test_spin_briefly_sets_only_an_unset_environment():
    environ = {}
    assert spin_briefly(environ) and environ == {"GOMP_SPINCOUNT": OPENMP_SPIN}
    for chosen in ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": "ACTIVE"}):
        environ = dict(chosen)
        assert not spin_briefly(environ) and environ == chosen


def test_llama_cpp_runs_with_the_operators_environment():
    """The peer we time runs as its users run it: without the spin specviz set, with the spin the operator set."""
    check = ("import os, json; from specviz.peers.llama_cpp import _run; "
             "chunks, _ = _run(['sh', '-c', 'echo \"$GOMP_SPINCOUNT\"']); "
             "print(json.dumps([os.environ.get('GOMP_SPINCOUNT'), b''.join(c for _, c in chunks).decode().strip()]))")
    for env, expected in (({}, [OPENMP_SPIN, ""]), ({"GOMP_SPINCOUNT": OPENMP_SPIN}, [OPENMP_SPIN, OPENMP_SPIN])):
        done = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=operator_sets(**env), capture_output=True,
                              text=True)
        assert json.loads(done.stdout) == expected, done.stderr[-2000:]
