"""The C code's map of a GGUF file's blocks (specviz/cpu/c/blocks.h) as Python reads it (build.CONSTANTS): each format's
weights and bytes per block are the ones the file format fixes, as the `gguf` package has them, and the definition's
(reference.py), whose own map puts every field where the C structs do; every header is in the library's name; a header
that gives a name two values stops the import."""
import shutil
import subprocess

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


def _c_agrees(places: dict) -> bool:
    """Whether every field of `places` (reference.PLACES' form) is where blocks.h's struct has it, and as long, and
    each struct is as long as its fields: asserts the compiler checks."""
    if shutil.which("cc") is None:
        pytest.fail("no C compiler: scripts/setup.sh installs one")
    lines = ['#include "blocks.h"']
    for qtype, fields in places.items():
        block = "block_q" + reference.NAMES[qtype][1:]           # ggml's names: block_q4_0, .., block_q4_K
        for name, (start, end) in fields.items():
            lines.append(f"_Static_assert(offsetof({block}, {name}) == {start} && "
                         f"sizeof((({block} *)0)->{name}) == {end - start}, \"{block}.{name}\");")
        lines.append(f"_Static_assert(sizeof({block}) == {max(end for _, end in fields.values())}, \"{block}\");")
    checked = subprocess.run(["cc", "-fsyntax-only", f"-I{build.C}", "-x", "c", "-"], input="\n".join(lines) + "\n",
                             text=True, capture_output=True)
    return checked.returncode == 0


def test_the_definitions_map_of_each_block_is_the_c_structs():
    assert set(reference.PLACES) == set(blocks.TYPES)
    assert _c_agrees(reference.PLACES)
    # and the check can fail: Q6_K's d put two bytes early, or Q4_K's scales one byte short
    q6_k, q4_k = reference.PLACES[reference.Q6_K], reference.PLACES[reference.Q4_K]
    assert not _c_agrees({reference.Q6_K: {**q6_k, "d": (206, 208)}})
    assert not _c_agrees({reference.Q4_K: {**q4_k, "scales": (4, 15)}})


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
