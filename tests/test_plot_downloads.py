"""Every plot on the page saves as SVG and PNG for slides: two buttons at its corner whose click runs plotly's own
export of that plot in the browser, with no round trip to the server (a real click and its files:
tests/test_browser.py)."""
import importlib.util
from pathlib import Path

import gradio as gr

from specviz.app import stacks

APP = Path(__file__).resolve().parents[1] / "app.py"


def built_page(monkeypatch) -> gr.Blocks:
    monkeypatch.setattr(stacks, "default_choice", lambda: ("offline", "the tests' pick"))    # no probe timed
    spec = importlib.util.spec_from_file_location("specviz_page", APP)
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    return page.build()


def test_every_plot_on_the_page_has_svg_and_png_buttons_that_export_that_plot(monkeypatch):
    demo = built_page(monkeypatch)
    plots = [block for block in demo.blocks.values() if isinstance(block, gr.Plot)]
    assert len(plots) == 9 and all(plot.elem_id for plot in plots)
    for plot in plots:
        assert [button.value for button in plot.buttons] == ["SVG", "PNG"], plot.elem_id
        for button, image_format in zip(plot.buttons, ("svg", "png")):
            clicks = [fn for fn in demo.fns.values() if (button._id, "click") in fn.targets]
            assert len(clicks) == 1 and clicks[0].fn is None, plot.elem_id           # the browser alone
            assert f"'#{plot.elem_id} .js-plotly-plot'" in clicks[0].js and f"format: '{image_format}'" in clicks[0].js
