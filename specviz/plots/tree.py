"""The speculative tree of one step (tokens as boxes, coloured by stage, the accepted path bold) and
the acceptance at each tree position across steps."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from ..decode.metrics import accept_by_position
from .palette import LINE_COLOUR, ROOT_COLOUR, blend
from ..decode.trace import StepRecord
from ..decode.end_tokens import visible
from .common import REJECTED_TINT, base_layout, empty_figure, stage_colours, stage_label, token_label

# -- the speculative tree of one step ----------------------------------------------------------

BONUS_ID = -1          # tree_layout's key for the target's own token after the accepted path


def tree_layout(step: StepRecord) -> dict[int, tuple[float, float]]:
    """Node id -> (depth, row): one row per leaf (row 0 on top, then -1, -2, ...); a node sits on its
    first child's row, and accepted children come first, so the accepted path is the straight top
    line. The target's own token (key BONUS_ID), when there is one, continues that line."""
    children: dict[int, list[tuple[bool, int, int]]] = {n.id: [] for n in step.nodes}
    for n in step.nodes:
        if n.parent >= 0:
            children[n.parent].append((not n.accepted, n.rank, n.id))
    if bonus_token(step) is not None:
        children[step.accepted_path[-1]].append((False, -1, BONUS_ID))
        children[BONUS_ID] = []
    for kids in children.values():
        kids.sort()
    place: dict[int, tuple[float, float]] = {}
    row = 0

    def visit(node_id: int, depth: int) -> float:
        nonlocal row
        kids = children[node_id]
        if not kids:
            y = -row
            row += 1
        else:
            y = [visit(kid, depth + 1) for _, _, kid in kids][0]
        place[node_id] = (float(depth), float(y))
        return y

    for root in [n.id for n in step.nodes if n.parent < 0]:
        visit(root, 0)
    return place


def bonus_token(step: StepRecord) -> str | None:
    """The token the target added after the accepted path (None when the output was cut first)."""
    accepted = len(step.accepted_path) - 1
    if len(step.committed_tokens) == accepted + 1 and step.committed_stage[-1] == 0:
        return step.committed_text[-1]
    return None


def node_hover(step: StepRecord, node, colour_label: str) -> str:
    token = html.escape(repr(visible(node.text)), quote=False)
    if node.parent < 0:
        return f"<b>{token}</b><br>root: the last token already in the output"
    lines = [f"<b>{token}</b>  proposed by {html.escape(colour_label, quote=False)}",
             f"depth {node.depth}, choice {node.rank + 1} among its siblings",
             f"draft probability q = {_prob(node.draft_prob)}",
             f"target probability p = {_prob(node.target_prob)}"]
    if node.calibrated is not None:
        lines.append(f"chance the plan gave it, calibrated on this run = {_prob(node.calibrated)}")
    if node.accept_prob is None:
        lines.append("not checked: a node above it was rejected")
    else:
        lines.append(f"acceptance probability = {_prob(node.accept_prob)}")
        lines.append("<b>accepted ✓</b>" if node.accepted else "rejected ✗")
    return "<br>".join(lines)


def _prob(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _columns(layout: dict, labels: dict[int, str]) -> tuple[list[float], int]:
    """x centre of each depth's column, in character widths, so long tokens get wide columns; and a
    font size that fits the whole tree on a laptop-sized plot."""
    widths: dict[int, int] = {}
    for node_id, (depth, _) in layout.items():
        widths[int(depth)] = max(widths.get(int(depth), 1), len(labels[node_id]))
    centres, edge = [], 0.0
    for depth in range(max(widths) + 1):
        width = widths.get(depth, 1) + 3          # the box's padding and a gap for the edge
        centres.append(edge + width / 2)
        edge += width
    return centres, max(9, min(15, int(1100 / edge)))


def _token_box(at: tuple[float, float], text: str, colour: str, accepted: bool, name: str, size: int = 15) -> dict:
    """A token as a coloured box: accepted ones solid with a dark border, the others a pale tint."""
    return dict(name=name, x=at[0], y=at[1], text=html.escape(token_label(text), quote=False), showarrow=False,
                bgcolor=colour if accepted else blend(colour, REJECTED_TINT),
                bordercolor="#111111" if accepted else colour,
                borderwidth=2 if accepted else 1, borderpad=4,
                font=dict(color="white" if accepted else "#333333", size=size, family="DejaVu Sans Mono, monospace"))


def tree_figure(step: StepRecord | None, height: int | None = None) -> go.Figure:
    """The speculative tree of one step: nodes labelled with their tokens and coloured by the stage
    that proposed them, the accepted path bold, rejected branches dimmed, hover = q, p, acceptance."""
    if step is None:
        return empty_figure("Press Step to draft and verify a first tree.", "Speculative tree")
    layout = tree_layout(step)
    bonus = bonus_token(step)
    labels = {n.id: token_label(n.text) for n in step.nodes} | {BONUS_ID: token_label(bonus or "")}
    centres, font_size = _columns(layout, labels)
    place = {i: (centres[int(d)], y) for i, (d, y) in layout.items()}
    colours = stage_colours(step.stages)
    rows = len({y for _, y in place.values()})
    fig = go.Figure()
    by_id = {n.id: n for n in step.nodes}

    def edges(node_ids):
        xs, ys = [], []
        for i in node_ids:
            px, py = place[by_id[i].parent]
            x, y = place[i]
            xs += [px, x, None]
            ys += [py, y, None]
        return xs, ys

    rejected = [n.id for n in step.nodes if n.parent >= 0 and not n.accepted]
    kept = [n.id for n in step.nodes if n.parent >= 0 and n.accepted]
    xs, ys = edges(rejected)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="rejected or unchecked branch",
                             line=dict(color="#BBBBBB", width=2, dash="dot"), hoverinfo="skip",
                             meta="rejected-edges"))
    xs, ys = edges(kept)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="accepted path",
                             line=dict(color=LINE_COLOUR, width=5), hoverinfo="skip", meta="accepted-path",
                             customdata=list(step.accepted_path)))
    notes = []
    groups: dict[str, list] = {}
    for n in step.nodes:
        label = "root: last token so far" if n.parent < 0 else stage_label(step.stages, n.stage)
        groups.setdefault(label, []).append(n)
    for label, nodes in groups.items():
        colour = ROOT_COLOUR if nodes[0].parent < 0 else colours[nodes[0].stage]
        fig.add_trace(go.Scatter(
            x=[place[n.id][0] for n in nodes], y=[place[n.id][1] for n in nodes], mode="markers",
            name=label, meta="nodes", ids=[str(n.id) for n in nodes], customdata=[n.id for n in nodes],
            marker=dict(color=colour, size=14, symbol="square"),
            hovertext=[node_hover(step, n, label) for n in nodes], hoverinfo="text",
            hoverlabel=dict(bgcolor="white", bordercolor=colour, font=dict(color="#111111"))))
        notes += [_token_box(place[n.id], n.text, colour, n.accepted, f"node-{n.id}", font_size) for n in nodes]
    if bonus is not None:
        last = step.accepted_path[-1]
        x, y = place[last]
        bx = place[BONUS_ID][0]
        fig.add_trace(go.Scatter(x=[x, bx], y=[y, y], mode="lines", line=dict(color=LINE_COLOUR, width=5),
                                 hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(
            x=[bx], y=[y], mode="markers", meta="bonus", name=f"target's own next token ({step.stages[0].name})",
            marker=dict(color=colours[0], size=14, symbol="square"),
            hovertext=[f"<b>{html.escape(repr(bonus), quote=False)}</b><br>the target's own next token after the "
                       "accepted path (a free 'bonus' token from the same forward pass)"], hoverinfo="text"))
        notes.append(_token_box((bx, y), bonus, colours[0], True, "bonus", font_size))
    fig.update_layout(annotations=notes)
    fig.update_xaxes(range=[0, centres[-1] + (centres[-1] - centres[-2] if len(centres) > 1 else 4) / 2 + 0.5],
                     tickvals=centres, ticktext=["root"] + [f"+{d}" for d in range(1, len(centres))], side="top",
                     showgrid=False, zeroline=False, title=None)
    fig.update_yaxes(visible=False, range=[-rows + 0.4, 0.6])
    drafted = len(step.nodes) - 1
    title = (f"Step {step.step + 1}: {drafted} drafted, {len(step.accepted_path) - 1} accepted"
             + (", + 1 from the target" if bonus is not None else ""))
    if drafted == 0:
        title = f"Step {step.step + 1}: nothing drafted; the target made one token alone"
    return base_layout(fig, title, height or max(300, 160 + 52 * rows))


# -- acceptance at each tree position across steps ---------------------------------------------

def acceptance_figure(steps: list[StepRecord]) -> go.Figure:
    """Heat map over (depth, sibling rank): the share of drafted nodes accepted at that position."""
    positions = accept_by_position(steps) if steps else {}
    title = "Acceptance per tree position (all steps so far)"
    if not positions:
        return empty_figure("No drafted tokens yet: step a speculative strategy to fill this in.", title, 300)
    keys = [tuple(map(int, k.split("."))) for k in positions]
    depths = list(range(1, max(d for d, _ in keys) + 1))
    ranks = list(range(max(r for _, r in keys) + 1))
    z = [[math.nan] * len(depths) for _ in ranks]
    text = [[""] * len(depths) for _ in ranks]
    hover = [["never drafted here"] * len(depths) for _ in ranks]
    for (d, r), value in zip(keys, positions.values()):
        z[r][d - 1] = value["rate"]
        text[r][d - 1] = f"{value['rate']:.0%}<br>n={value['count']}"
        taken = round(value["rate"] * value["count"])
        hover[r][d - 1] = (f"depth {d}, choice {r + 1}: drafted {value['count']}×, "
                           f"accepted {taken}× ({value['rate']:.0%})")
    fig = go.Figure(go.Heatmap(
        x=[f"+{d}" for d in depths], y=[f"choice {r + 1}" for r in ranks], z=z, text=text,
        texttemplate="%{text}", hovertext=hover, hoverinfo="text", zmin=0, zmax=1, colorscale="Cividis",
        colorbar=dict(title=dict(text="accepted<br>share"), tickformat=".0%"), xgap=3, ygap=3,
        name="acceptance rate"))
    fig.update_xaxes(title="depth in the tree (tokens ahead of the root)", side="bottom")
    fig.update_yaxes(title="drafter's choice", autorange="reversed")
    return base_layout(fig, title, max(280, 140 + 48 * len(ranks)))
