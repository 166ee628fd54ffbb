"""One colour per stage, everywhere it is drawn: the tree, the coloured text, the latency and memory charts.

The paper's convention (target red, stage-1 draft blue, stage-2 n-gram green) in the colour-blind-safe
Okabe-Ito palette: vermillion, blue, bluish green; context lookup gets reddish purple. A second stage of
a kind already used (a cascade of two draft models) takes the next spare colour.
"""
from __future__ import annotations

KIND_COLOURS = {"target": "#D55E00", "model": "#0072B2", "ngram": "#009E73", "lookup": "#CC79A7"}
SPARE_COLOURS = ["#56B4E9", "#E69F00", "#F0E442", "#000000"]
ROOT_COLOUR = "#4D4D4D"                 # the last committed token, and the prompt
OVERHEAD_COLOUR = "#999999"             # time outside model forwards
PROMPT_READ_COLOUR = "#99C7E0"          # a draft model reading the prompt: the draft's blue, paler
LINE_COLOUR = "#222222"                 # accepted paths, reference lines
STRATEGY_COLOURS = {"baseline": "#999999", "speculative": "#56B4E9", "tree": "#0072B2", "staged": "#009E73"}
COLOUR_NAMES = {"#D55E00": "red", "#0072B2": "blue", "#009E73": "green", "#CC79A7": "purple",
                "#56B4E9": "light blue", "#E69F00": "orange", "#F0E442": "yellow", "#000000": "black"}


def stage_colours(kinds: list[str]) -> list[str]:
    """One colour per stage, from the stages' kinds (target first)."""
    colours, used, spare = [], set(), iter(SPARE_COLOURS)
    for kind in kinds:
        colour = KIND_COLOURS.get(kind, "#000000")
        if colour in used:
            colour = next(spare, "#000000")
        used.add(colour)
        colours.append(colour)
    return colours


def blend(colour: str, amount: float) -> str:
    """`colour` mixed with white: amount 1 keeps it, 0 gives white."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    def mix(c: int) -> int:
        return round(255 - (255 - c) * amount)

    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"
