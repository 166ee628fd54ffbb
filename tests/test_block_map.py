"""The C code's map of a GGUF file's blocks (specviz/cpu/c/blocks.h) as Python reads it (build.CONSTANTS): each format's
weights and bytes per block are the ones the file format fixes, as the `gguf` package has them, and the definition's
(reference.py); every header is in the library's name; a header that gives a name two values stops the import."""
import gguf
import pytest

from specviz.cpu import blocks, build, reference


def test_each_formats_block_is_the_size_the_gguf_package_gives():
    assert set(blocks.TYPES.values()) == {"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    for qtype, name in blocks.TYPES.items():
        kind = gguf.GGMLQuantizationType[name]
        assert kind.value == qtype, name
        assert blocks.BLOCK[qtype] == gguf.GGML_QUANT_SIZES[kind], name
    assert blocks.BLOCK == reference.BLOCK


def test_every_header_is_in_the_librarys_name():
    """A change to any header rebuilds the library (build.library_name digests the sources and HEADERS)."""
    assert {path.name for path in build.C.glob("*.h")} == set(build.HEADERS)
    assert set(build.SHARED) <= set(build.HEADERS)


def test_a_name_given_two_values_stops_the_import(tmp_path, monkeypatch):
    for header in build.SHARED:
        (tmp_path / header).write_text((build.C / header).read_text())
    monkeypatch.setattr(build, "C", tmp_path)
    assert build._constants() == build.CONSTANTS
    with (tmp_path / build.SHARED[-1]).open("a") as header:
        header.write("#define QK_K 128\n")
    with pytest.raises(ValueError, match="QK_K"):
        build._constants()
