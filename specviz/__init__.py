"""specviz: staged speculative decoding (Spector & Ré, 2023), step by step."""

__version__ = "0.6.0"
