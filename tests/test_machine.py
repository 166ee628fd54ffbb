"""What this machine is: its memory limit as a container sees it; and freed memory given back to it."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.cpu.machine import memory_bytes

PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_cgroup_v2_limit_caps_the_memory(tmp_path):
    (tmp_path / "memory.max").write_text("4294967296\n")
    assert memory_bytes(tmp_path) == min(PHYSICAL, 4 * 2**30)


def test_a_cgroup_v1_limit_caps_the_memory(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("2147483648\n")
    assert memory_bytes(tmp_path) == min(PHYSICAL, 2 * 2**30)


def test_no_limit_is_the_physical_memory(tmp_path):
    assert memory_bytes(tmp_path) == PHYSICAL               # no cgroup files
    (tmp_path / "memory.max").write_text("max\n")            # v2: no limit
    assert memory_bytes(tmp_path) == PHYSICAL
    (tmp_path / "memory.max").write_text(f"{PHYSICAL * 4}\n")  # a limit above the machine's memory
    assert memory_bytes(tmp_path) == PHYSICAL


def test_without_sysconf_as_on_windows_psutil_tells_and_without_either_nothing_is_claimed(tmp_path, monkeypatch):
    import sys
    import types

    import specviz.cpu.machine as machine
    monkeypatch.delattr(os, "sysconf")                       # Windows has no os.sysconf
    eight_gib = types.SimpleNamespace(total=8 * 2**30)
    monkeypatch.setitem(sys.modules, "psutil", types.SimpleNamespace(virtual_memory=lambda: eight_gib))
    assert machine.memory_bytes(tmp_path) == 8 * 2**30
    (tmp_path / "memory.max").write_text("4294967296\n")      # a cgroup limit still caps it
    assert machine.memory_bytes(tmp_path) == 4 * 2**30
    monkeypatch.setitem(sys.modules, "psutil", None)          # no psutil either: unknown
    assert machine.memory_bytes(tmp_path / "none") is None


def test_an_unknown_memory_does_not_turn_the_default_stack_away(monkeypatch):
    import specviz.stack.presets as presets
    monkeypatch.delenv(presets.PRESET_ENV, raising=False)
    monkeypatch.setattr(presets, "available", lambda chunked: True)
    monkeypatch.setattr(presets, "memory_bytes", lambda: None)
    monkeypatch.setattr(presets, "predicted_token_seconds", lambda profile: 0.1)
    assert presets.default_preset() == "qwen-coder"


FREE_BELOW_A_LIVE_ONE = """
import os, sys
from pathlib import Path
import torch
from specviz.cpu.machine import give_back_freed_memory

def resident_mb():
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
held = [torch.ones(16 * 1024) for _ in range(4000)]          # 64 KB each, 250 MB on the heap
pin = torch.ones(16)                                           # allocated after them: the heap's top stays in use
del held
before = resident_mb()
if sys.argv[1] == "give back":
    give_back_freed_memory()
print(before - resident_mb())
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists() or platform.libc_ver()[0] != "glibc",
                    reason="glibc's heap on Linux: elsewhere there is nothing to give back this way")
def test_freed_heap_pages_go_back_to_the_system():
    """Pieces freed below a live allocation stay resident in the heap until given back (what loading and timing a
    stack leaves behind). In a fresh process: a test worker's heap has holes of its own that the pieces fill."""
    def returned_mb(how: str) -> float:
        done = subprocess.run([sys.executable, "-c", FREE_BELOW_A_LIVE_ONE, how], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[1])
        return float(done.stdout.strip().splitlines()[-1])
    assert returned_mb("keep") < 50 and returned_mb("give back") > 150
