"""Reproducible commands that build specviz's draft artifacts (assets/draft, assets/trigram.npz):
`python -m specviz.train --help`. One module per job: sources (training text), data (target labels),
draft (stage-1 model), trigram (stage 2), evaluate (agreement), manifest, cli. It may import analysis/, decode/,
models/ and stack/."""
from .cli import build_parser, main
from .data import load_labelled, save_labelled, teacher_forced_labels
from .draft import train_steps

__all__ = ["build_parser", "load_labelled", "main", "save_labelled", "teacher_forced_labels", "train_steps"]
