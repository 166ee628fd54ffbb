"""The engine's few-row matrix products (specviz/cpu/matmul.py): same numbers as nn.Linear up to
float rounding, used only inside the engine's own forwards, and the engine's output unchanged."""
import threading

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_model

from specviz.backends.choose import open_cache
from specviz.cpu.matmul import MAX_ROWS, RowsLinear, engine_products, install, rows_product


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, MAX_ROWS])
def test_rows_product_is_the_linear_product(n):
    torch.manual_seed(n)
    weight, rows = torch.randn(300, 64), torch.randn(n, 64)
    assert torch.allclose(rows_product(weight, rows), F.linear(rows, weight), atol=1e-4)
    column_major = torch.randn(64, n).T          # the layout that takes MKL's slow path is copied first
    assert torch.allclose(rows_product(weight, column_major), F.linear(column_major, weight), atol=1e-4)


def test_only_the_engine_on_its_own_thread_takes_the_rows_product():
    model = tiny_model("llama", seed=5)
    weight = model.model.layers[0].mlp.up_proj.weight
    assert install(model) and install(model)           # once per model; again is a no-op
    layer = model.model.layers[0].mlp.up_proj
    assert type(layer) is RowsLinear and layer.weight is weight      # a layer of its own class, the same weights
    x = torch.randn(1, 3, layer.in_features)
    stock = F.linear(x, layer.weight)
    assert torch.equal(layer(x), stock)                # outside the engine: nn.Linear's own product
    seen = {}
    with engine_products():
        assert torch.equal(layer(x), rows_product(layer.weight, x[0]).unsqueeze(0))
        other = threading.Thread(target=lambda: seen.update(out=layer(x)))   # e.g. a peer's generate()
        other.start()
        other.join()
        long = torch.randn(1, MAX_ROWS + 1, layer.in_features)
        assert torch.equal(layer(long), F.linear(long, layer.weight))      # a prompt: nn.Linear
    assert torch.equal(seen["out"], stock)


def test_engine_logits_match_the_stock_model():
    model = tiny_model("llama", seed=6)
    kv = open_cache(model, "t")
    assert kv.fast
    tokens = [5, 9, 2, 7, 7, 1]
    with torch.inference_mode():
        stock = model(torch.tensor([tokens])).logits[0]
        prefix = kv.feed_committed(tokens[:4])
        tail = kv.feed_committed(tokens[4:])
    assert torch.allclose(torch.cat([prefix, tail]), stock, atol=1e-4)
    assert not install(tiny_model("llama", seed=6, dtype=torch.bfloat16))     # measured for float32 only
