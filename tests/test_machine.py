"""What this machine is: its memory limit as a container sees it."""
import os

from specviz.machine import memory_bytes

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
