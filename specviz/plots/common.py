"""What every figure shares: the base layout, the empty-figure message, token labels, stage colours
(from specviz.plots.palette) and names."""
from __future__ import annotations

import plotly.graph_objects as go

from ..decode.end_tokens import visible

from .palette import stage_colours as kind_colours
from ..decode.trace import StageInfo

REJECTED_TINT = 0.3           # rejected nodes: their colour mixed with white
KIND_WORDS = {"target": "target", "model": "draft model", "ngram": "n-gram", "lookup": "context lookup"}
FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=15)


def stage_colours(stages: list[StageInfo]) -> list[str]:
    return kind_colours([stage.kind for stage in stages])


def stage_label(stages: list[StageInfo], index: int) -> str:
    stage = stages[index]
    words = KIND_WORDS.get(stage.kind, stage.kind)
    if index == 0:
        return f"target ({stage.name})"
    return f"stage {index} {words} ({stage.name})"


def token_label(text: str, limit: int = 14) -> str:
    """A token as a short visible label: newlines, tabs and spaces made visible, special tokens by name."""
    shown = visible(text).replace("\n", "↵").replace("\t", "⇥").replace(" ", "·") or "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def base_layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title=dict(text=title, x=0.01, font=dict(size=18)), height=height, font=FONT,
                      template="plotly_white", margin=dict(l=20, r=20, t=60, b=20),
                      legend=dict(orientation="h", yanchor="top", y=-0.08, x=0.0),
                      hoverlabel=dict(font_size=15))
    return fig


def empty_figure(message: str, title: str = "", height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=17, color="#555"),
                       xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, title, height)
