"""One way to write a markdown table (the app's tables, the bench's --render, the assets manifest)."""
from __future__ import annotations


def md_table(head: list[str], rows: list[list], align: str = "") -> str:
    """A table with the given column titles and rows (each cell str()'d); align: one letter per column,
    "r" for right-aligned (numbers), anything else left."""
    def line(cells: list) -> str:
        return "| " + " | ".join(str(cell) for cell in cells) + " |"

    rule = ["---:" if align[i:i + 1] == "r" else "---" for i in range(len(head))]
    return "\n".join([line(head), line(rule), *map(line, rows)])
