"""Re-record the traces the plot tests use: `python tests/data/record_traces.py` (a few minutes on CPU).

The target drafts for itself here (the shipped draft model may not exist yet), with context lookup
as the lower stage, so every stage kind the tree plot colours appears in real records.
"""
from __future__ import annotations

import json
from pathlib import Path

from specviz.decode.sampling import Sampling
from specviz.stack.stack import Stack
from specviz.stack.strategies import default_tree

HERE = Path(__file__).resolve().parent
PROMPT = "Colours: red, green, blue, red, green, blue, red, green, blue, red,"


def save(name: str, runs: dict) -> None:
    (HERE / name).write_text(json.dumps({k: r.to_dict() for k, r in runs.items()}, indent=1) + "\n")


def main() -> None:
    stack = Stack.load(drafts=["smollm2-135m", "lookup"])
    ids = stack.encode(PROMPT)
    runs = {}
    for strategy in ("baseline", "speculative", "tree", "staged"):
        decoder = stack.decoder(ids, strategy, default_tree(strategy, 10), Sampling(), max_new_tokens=14)
        runs[strategy] = decoder.generate()
        print(strategy, repr(runs[strategy].text))
    save("greedy_runs.json", runs)
    lookup = Stack(stack.target, ["lookup"])
    decoder = lookup.decoder(ids, "speculative", default_tree("speculative", 6),
                             Sampling(temperature=1.0, top_k=50, seed=3), max_new_tokens=14)
    run = decoder.generate()
    print("sampled", repr(run.text))
    save("sampled_runs.json", {"speculative": run})


if __name__ == "__main__":
    main()
