"""Milliseconds for all linear layers of a Qwen2.5(-Coder) 0.5B or 1.5B to multiply 1-16 rows, by weight format.

Random weights of the real shapes, cycled layer after layer so none stays in cache: what one forward's
linear layers cost when they stream their weights.
    python scripts/linear_layer_speeds.py 0.5 float32,int4,bfloat16
"""
import sys
import time

import torch

from specviz.cpu.matmul import rows_product
from specviz.cpu.int4 import Int4Linear

SHAPES = {"0.5": (896, 4864, 24, 128), "1.5": (1536, 8960, 28, 256)}    # hidden, intermediate, layers, kv width
VOCAB = 151936


def layers(size: str, kind: str) -> list:
    hidden, inner, count, kv = SHAPES[size]
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inner, hidden), (inner, hidden),
              (hidden, inner)] * count + [(VOCAB, hidden)]
    made = []
    for out, inputs in shapes:
        linear = torch.nn.Linear(inputs, out, bias=False)
        if kind == "int4":
            made.append(Int4Linear(linear))
        elif kind == "bfloat16":
            made.append(linear.to(torch.bfloat16))
        else:       # float32 as the engine multiplies it (specviz/cpu/matmul.py)
            made.append(RowsProduct(linear))
    return made


class RowsProduct(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.weight = linear.in_features, linear.weight.detach()

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows_product(self.weight, rows)


def main(size: str, kinds: str) -> None:
    hidden, inner = SHAPES[size][:2]
    torch.manual_seed(0)
    for kind in kinds.split(","):
        model = layers(size, kind)
        dtype = torch.bfloat16 if kind == "bfloat16" else torch.float32
        row = []
        for n in (1, 2, 4, 8, 16):
            inputs = {hidden: torch.randn(n, hidden, dtype=dtype), inner: torch.randn(n, inner, dtype=dtype)}
            best = float("inf")
            with torch.inference_mode():
                for _ in range(4):
                    started = time.perf_counter()
                    for layer in model:
                        layer(inputs[layer.in_features])
                    best = min(best, time.perf_counter() - started)
            row.append(f"{best * 1e3:.0f}")
        print(size, kind, " ".join(row), flush=True)
        del model


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "float32,int4")
