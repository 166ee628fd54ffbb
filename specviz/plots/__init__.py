"""Plotly figures built from trace records alone (no model calls), so they are testable offline:
`tree` (one step's tree, acceptance per position), `compare` (latency, tokens per pass, memory, benchmark
results) and `common`. Colours come from specviz.plots.palette: one colour per stage, the same in every
chart and in the text. Every chart carries a legend (or a colour bar). It may import decode/.
"""
from .palette import ROOT_COLOUR, blend
from .common import KIND_WORDS, REJECTED_TINT, base_layout, empty_figure, stage_colours, stage_label, token_label
from .compare import benchmark_figure, forwards_figure, latency_figure, memory_figure, phase_split
from .tree import BONUS_ID, acceptance_figure, bonus_token, tree_figure, tree_layout

__all__ = ["BONUS_ID", "KIND_WORDS", "REJECTED_TINT", "ROOT_COLOUR", "acceptance_figure", "base_layout",
           "benchmark_figure", "blend", "bonus_token", "empty_figure", "forwards_figure", "latency_figure",
           "memory_figure", "phase_split", "stage_colours", "stage_label", "token_label", "tree_figure", "tree_layout"]
