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
    (kaleido starts one per call: 2-3 s on 2 cores, whatever the number of figures). Each keeps its layout's size;
    width: for figures whose layout leaves it to the browser; png_scale: PNGs drawn that many times larger."""
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")
    import plotly.io as pio

    paths, drawn = list(figures), list(figures.values())
    for path in paths:              # so that a file left from before cannot pass for one drawn now
        path.unlink(missing_ok=True)
    try:
        # sizes given in full: a batch draws every figure the default size (700 x 500) where it is given none
        pio.write_images(drawn, paths, width=[fig.layout.width or width or pio.defaults.default_width for fig in drawn],
                         height=[fig.layout.height or pio.defaults.default_height for fig in drawn],
                         scale=[png_scale if path.suffix == ".png" else 1 for path in paths])
    except Exception as exc:  # kaleido raises many kinds; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImageExportError(f"could not draw the figures as images: {first}") from None
    missing = [path.name for path in paths if not path.is_file() or not path.stat().st_size]
    if missing:                     # a batch logs a figure it could not write, and goes on
        raise ImageExportError(f"kaleido wrote no {', '.join(missing)} (is {paths[0].parent} writable?)")
    return paths
