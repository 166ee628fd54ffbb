"""Figures as image files, drawn by plotly's own renderer: kaleido, which drives a Chrome or Chromium (Debian's
/usr/bin/chromium where there is one). The bench's PNG charts and a recording's figures for slides."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go


class ImageExportError(RuntimeError):
    """No image could be drawn (kaleido, or the browser it drives, missing or failing); the message is one line."""


def write_images(figures: dict[Path, go.Figure], width: int | None = None, png_scale: float = 1) -> list[Path]:
    """Each figure to its path, in the format the path's suffix names (.svg, .png, ...), all through one browser
    (kaleido starts one per call: 2-3 s on 2 cores, whatever the number of figures). width: in layout pixels, for
    figures the page lets the browser size; png_scale: PNGs drawn that many times larger, for a sharp projection."""
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")
    import plotly.io as pio

    paths = list(figures)
    try:
        pio.write_images(list(figures.values()), paths, width=width,
                         scale=[png_scale if path.suffix == ".png" else 1 for path in paths])
    except Exception as exc:  # kaleido raises many kinds; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImageExportError(f"could not draw the figures as images: {first}") from None
    return paths
