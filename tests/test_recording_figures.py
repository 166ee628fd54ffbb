"""`python -m specviz.app.figures RECORDING --out DIR`: a shipped recording's figures written as SVG and PNG
files for slides, every figure the page draws from a recording; bad input refused with one line."""
from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from specviz import recording as rec
from specviz.app import figures

ROOT = Path(__file__).resolve().parents[1]
RECORDING = "cpu-qwen-coder-humaneval0-greedy"
# what the page draws from a recording: the Step view's tree and acceptance map, and the Compare tab's charts
EXPECTED = ("tree", "acceptance", "latency", "forwards", "memory", "speed")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path.name
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow          # kaleido draws through Chromium, as the browser tests do
def test_a_shipped_recordings_figures_are_written_as_svg_and_png(tmp_path):
    out = tmp_path / "slides"
    done = subprocess.run([sys.executable, "-m", "specviz.app.figures", RECORDING, "--out", str(out),
                           "--step", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{name}.{suffix}" for name in EXPECTED
                                                           for suffix in ("svg", "png"))
    drawn, _ = figures.figures(rec.load(rec.shipped()[RECORDING]), step=3)
    for name in EXPECTED:
        size = (figures.SLIDE_WIDTH, drawn[name].layout.height)                # as high as on the page
        svg = ElementTree.parse(out / f"{name}.svg").getroot()
        assert svg.tag == "{http://www.w3.org/2000/svg}svg" and (int(svg.get("width")), int(svg.get("height"))) == size
        texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
        assert texts and "Run Compare" not in texts, name             # drawn from the race, not a placeholder
        assert png_size(out / f"{name}.png") == (size[0] * figures.PNG_SCALE, size[1] * figures.PNG_SCALE), name
    assert "Step 3:" in ElementTree.parse(out / "tree.svg").getroot().findtext(".//{*}text[@class='gtitle']", "")
    assert "not drawn" not in done.stdout


@pytest.mark.parametrize("argv, says", [
    (["no-such-recording"], "error: 'no-such-recording' is neither a file nor a shipped recording"),
    ([RECORDING, "--step", "999"], "error: --step 999: the recorded staged run has steps 1 to"),
])
def test_bad_input_gets_one_line_and_writes_nothing(tmp_path, capsys, argv, says):
    out = tmp_path / "slides"
    assert figures.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1
    assert not out.exists()


def test_a_file_that_is_no_recording_gets_one_line(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    assert figures.main([str(bad), "--out", str(tmp_path / "slides")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_an_out_folder_that_cannot_be_made_gets_one_line(tmp_path, capsys):
    taken = tmp_path / "slides"
    taken.write_text("a file, not a folder")
    assert figures.main([RECORDING, "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "slides" in err and err.count("\n") == 1


@pytest.mark.slow          # kaleido starts Chromium
def test_a_figure_kaleido_could_not_write_is_an_error(tmp_path):
    """kaleido's batch logs a figure it cannot write and goes on: the export names it instead of passing."""
    from specviz import plots
    from specviz.plots.export import ImageExportError, write_images

    written = tmp_path / "tree.svg"
    with pytest.raises(ImageExportError, match="kaleido wrote no tree.png"):
        write_images({written: plots.tree_figure(None), tmp_path / "gone" / "tree.png": plots.tree_figure(None)})
    assert written.read_bytes().startswith(b"<svg")
