"""specviz: staged speculative decoding (Spector & Ré, 2023), step by step."""
