"""What this machine is, in one line: CPU model, cores, the SIMD units that decide float kernels
(and so the last bits of results, and whether bfloat16 pays), the torch build and the GPU.
`python -m specviz.cpu.machine` prints it (CI prints it before the tests)."""
from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import torch

from . import kernels
from . import cpu_info

CGROUP = Path("/sys/fs/cgroup")
CGROUP_LIMIT_FILES = ("memory.max", "memory/memory.limit_in_bytes")     # cgroup v2, then v1


def give_back_freed_memory() -> None:
    """Return the pages the C heap holds free to the system (glibc's malloc_trim; nothing elsewhere). Loading a
    quantized model and timing copies of its weights free gigabytes in pieces that the heap otherwise keeps resident:
    the app's server held 7.6 GB after measuring qwen-coder's choices before its first race, 4.3 GB with this."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def memory_bytes(cgroup: Path = CGROUP) -> int | None:
    """The memory this process may use: the machine's physical memory, or less where a container's cgroup
    limits it (in a container or on a Space, sysconf sees the host's memory, not the limit). None where neither
    sysconf nor psutil can tell (the caller then does not judge by memory)."""
    known = [size for size in (physical_memory(), *map(_cgroup_limit, (cgroup / name for name in CGROUP_LIMIT_FILES)))
             if size]
    return min(known) if known else None


def physical_memory() -> int | None:
    """The machine's memory: sysconf on Linux and macOS; psutil where there is no sysconf (Windows); else None."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    try:
        import psutil
        return int(psutil.virtual_memory().total)
    except (ImportError, OSError, AttributeError):
        return None


def _cgroup_limit(path: Path) -> int | None:
    """A cgroup memory limit in bytes; None where there is no file or no limit ("max" in v2, a huge number in v1)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def describe() -> str:
    name, simd = cpu_info()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    capability = torch.backends.cpu.get_cpu_capability()
    return (f"{name}, {os.cpu_count()} cores, SIMD {' '.join(simd) or 'unknown'}, torch {torch.__version__} "
            f"({capability} kernels, {torch.get_num_threads()} threads; {kernels.status()}), {device}, "
            f"{platform.system()} {platform.release()}")


if __name__ == "__main__":
    print("machine:", describe())
