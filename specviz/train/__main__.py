"""`python -m specviz.train`: the training commands (specviz/train/cli.py)."""
from .cli import main

main()
