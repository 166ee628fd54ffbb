"""A quantized draft's prompt read through other products (specviz/cpu/prompt_reader.py): used for long
committed feeds only, chosen by measurement and stored, and never a change to any strategy's output."""
import copy

import pytest
import torch
from tiny import tiny_model, tiny_stack

from specviz.backends.choose import open_cache
from specviz.cpu import kernels, layer_loop, prompt_reader
from specviz.cpu.decoder import LlamaForward
from specviz.cpu.layer_loop import LayerLoop
from specviz.decode.metrics import summarise, time_split
from specviz.decode.sampling import Sampling
from specviz.models.load import LoadedModel, _quantized
from specviz.plots.compare import latency_figure
from specviz.stack.strategies import default_tree

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs specviz's kernels (AVX2 and a C compiler)")

PROMPT = [(7 * i + 3) % 64 for i in range(prompt_reader.READ_ROWS + 8)]


def quantized_with_float_copy(noise: float = 0.0):
    model = copy.deepcopy(tiny_model("llama", hidden=64, noise=noise))
    float_copy = copy.deepcopy(model)
    _quantized(LoadedModel("m", model, None))
    return model, float_copy


def with_weights_of(quantized, float_model):
    """float_model with each linear layer's weight the one `quantized`'s products multiply by (biases kept)."""
    ref = copy.deepcopy(float_model)
    for layer, mine in zip(LlamaForward(quantized).layers, ref.model.layers):
        attention, mlp = mine.self_attn, mine.mlp
        qkv = torch.cat([p.dequantized() for p in layer.attention_in])
        for linear, weight in zip((attention.q_proj, attention.k_proj, attention.v_proj),
                                  qkv.split([attention.q_proj.out_features, attention.k_proj.out_features,
                                             attention.v_proj.out_features])):
            linear.weight.data = weight
        gate_up = torch.cat([p.dequantized() for p in layer.mlp_in])
        mlp.gate_proj.weight.data, mlp.up_proj.weight.data = gate_up.split(mlp.gate_proj.out_features)
        attention.o_proj.weight.data, mlp.down_proj.weight.data = layer.output.dequantized(), layer.down.dequantized()
    return ref


def quantized_draft_stack(hidden: int | None = None):
    """tiny_stack with its draft model in 4 bits (a copy: tiny_model's models are shared), and that draft in float32.
    hidden: a draft that wide instead (64: wide enough for specviz's own 4-bit products)."""
    stack = tiny_stack(("draft", "lookup"))
    loaded = stack.loaded["draft"]
    float_copy = loaded.model if hidden is None else tiny_model("llama", hidden=hidden, noise=0.3)
    stack.loaded["draft"] = _quantized(LoadedModel(loaded.name, copy.deepcopy(float_copy), loaded.tokenizer))
    return stack, float_copy


def test_a_long_feed_reads_through_the_float_copy_and_a_short_one_through_the_draft_own_products():
    model, float_copy = quantized_with_float_copy()
    with torch.inference_mode():
        own_logits = open_cache(model, "own").feed_committed(PROMPT)
        own_short = open_cache(model, "own, short").feed_committed(PROMPT[:5])
        products = prompt_reader.copies(model, "float32")
        read = open_cache(model, "read", prompt_products=products)
        assert read.reader is not None
        read_logits = read.feed_committed(PROMPT)
        read_short = open_cache(model, "read, short", prompt_products=products).feed_committed(PROMPT[:5])
        hidden = with_weights_of(model, float_copy).model(torch.tensor([PROMPT])).last_hidden_state[0]
        floats = read._scores(hidden)                   # through the draft's own output layer
    assert torch.equal(read_short, own_short)           # a short feed: the draft's own products, bit for bit
    assert open_cache(model, "after").reader is None
    # the reader computes the model of the draft's 4-bit weights in float32; its own products round activations to
    # int8 on top
    assert torch.allclose(read_logits, floats, atol=1e-4 * floats.abs().max().item())
    assert not torch.allclose(own_logits, floats, atol=1e-4 * floats.abs().max().item())
    assert torch.allclose(own_logits, floats, atol=0.1 * floats.abs().max().item())


def test_a_long_feed_through_the_columns_computes_the_draft_own_products_in_another_order():
    """The columns reader multiplies the draft's own 4-bit weights and rounds rows to int8 as its own products do,
    8 outputs at a time: the same model to within float rounding, no copy of the weights."""
    model, _ = quantized_with_float_copy()
    with torch.inference_mode():
        own_logits = open_cache(model, "own").feed_committed(PROMPT)
        products = prompt_reader.copies(model, prompt_reader.COLUMNS)
        assert products is not None and products[0]["down"].product is LlamaForward(model).layers[0].down
        assert prompt_reader.reader_of(LlamaForward(model), products).loop is not None       # in the C layer loop
        read_logits = open_cache(model, "read", prompt_products=products).feed_committed(PROMPT)
    # the same products to within float rounding, which can move an activation across an int8 step in a later layer
    assert torch.allclose(read_logits, own_logits, atol=1e-2 * own_logits.abs().max().item())
    assert (read_logits - own_logits).abs().mean() < 1e-3 * own_logits.abs().mean()
    float_model = tiny_model("llama", hidden=64)
    assert prompt_reader.copies(float_model, prompt_reader.COLUMNS) is None        # no 4-bit products: not a candidate


@pytest.mark.parametrize("strategy, way", [("speculative", "bfloat16"), ("staged", "bfloat16"), ("staged", "columns")])
def test_strategies_whose_draft_reads_prompts_another_way_write_baseline_text(strategy, way, monkeypatch):
    stack, _ = quantized_draft_stack(64 if way == prompt_reader.COLUMNS else None)
    draft = stack.loaded["draft"].model
    products = prompt_reader.copies(draft, way)
    assert products is not None
    calls = []
    if way == prompt_reader.COLUMNS:            # the columns run in the C layer loop: the rows fed to a loop of them
        run = LayerLoop.run
        monkeypatch.setattr(LayerLoop, "run", lambda self, x, *a: (self.layers[0].q.type == layer_loop.COLUMNS and
                                                                   calls.append(len(x))) or run(self, x, *a))
    else:
        kind = prompt_reader.FloatProduct
        monkeypatch.setattr(kind, "forward", lambda self, x, f=kind.forward: calls.append(len(x)) or f(self, x))
    stack.prompt_reads.products["draft"] = products
    base = stack.decoder(PROMPT, "baseline", max_new_tokens=24, stop_at_eos=False).generate().tokens
    ours = stack.decoder(PROMPT, strategy, max_new_tokens=24, stop_at_eos=False).generate().tokens
    assert ours == base
    assert calls and min(calls) >= prompt_reader.READ_ROWS       # the prompt went through it, nothing else did


def swinging_reads(monkeypatch, speeds: dict[str, float], slow: range = range(0), lucky: dict | None = None):
    """time_read at these speeds by way (own, or a candidate's name), read after read: reads whose place in the order
    falls in `slow` take 1.5 times as long (a slow phase of the VM), and `lucky` {way: its read number} one read of a
    way half as long. Returns the ways in the order they were read."""
    order = []

    def timed(m, products=None, tokens=prompt_reader.PROMPT):
        down = products[0]["down"] if products else None
        way = prompt_reader.OWN if down is None else \
            "columns" if isinstance(down, prompt_reader.ColumnsProduct) else str(down.weight.dtype).split(".")[-1]
        order.append(way)
        factor = (1.5 if len(order) - 1 in slow else 1.0) * (0.5 if (lucky or {}).get(way) == order.count(way) else 1.0)
        return speeds[way] * factor
    monkeypatch.setattr(prompt_reader, "time_read", timed)
    return order


def test_a_float_copy_is_chosen_only_where_it_reads_10_percent_faster(monkeypatch):
    model, _ = quantized_with_float_copy()
    speeds = {"own": 1.0, "bfloat16": 0.95, "float32": 2.0, "columns": 0.92}
    swinging_reads(monkeypatch, speeds)
    assert prompt_reader.choose(model)["choice"] == prompt_reader.OWN
    speeds.update({"bfloat16": 0.4})
    chosen = prompt_reader.choose(model)
    assert chosen == {"choice": "bfloat16", "seconds": {"own": 1.0, "bfloat16": 0.4, "float32": 2.0, "columns": 0.92},
                      "from": prompt_reader.LENGTHS[0]}            # faster at every length here
    speeds.update({"columns": 0.3})
    assert "its own weights many outputs at a time" in prompt_reader.describe(prompt_reader.choose(model))
    assert open_cache(model, "after").reader is None                   # measuring leaves the model as it was
    assert "bfloat16 copies of its weights, from 8 tokens" in prompt_reader.describe(chosen)


def test_the_ways_are_timed_interleaved_so_that_a_slow_phase_does_not_choose():
    """The VM slow for the first three reads: timed way by way, the own products would bear it alone and a candidate
    5% slower would win; a read of each way a round, in a rotated order, shares it out."""
    model, _ = quantized_with_float_copy()
    with pytest.MonkeyPatch.context() as patch:
        order = swinging_reads(patch, {"own": 1.0, "columns": 1.05}, slow=range(3))
        chosen = prompt_reader.choose(model, {"columns": prompt_reader.copies(model, "columns")})
    assert chosen["choice"] == prompt_reader.OWN
    assert order[:2] == ["own", "columns"] and order[2:4] == ["columns", "own"]        # rotated each round
    assert len(order) == 2 * prompt_reader.ROUNDS


def test_one_lucky_read_does_not_choose_a_way_that_is_not_faster():
    """A candidate as fast as the own products except one read at half the time (a quiet moment) is not chosen: each
    way is judged by the median of its rounds against the own products', not by its best read."""
    model, _ = quantized_with_float_copy()
    with pytest.MonkeyPatch.context() as patch:
        swinging_reads(patch, {"own": 1.0, "columns": 1.0}, lucky={"columns": 2})
        chosen = prompt_reader.choose(model, {"columns": prompt_reader.copies(model, "columns")})
    assert chosen == {"choice": prompt_reader.OWN, "seconds": {"own": 1.0, "columns": 1.0}}
    with pytest.MonkeyPatch.context() as patch:
        swinging_reads(patch, {"own": 1.0, "columns": 0.8})
        assert prompt_reader.choose(model, {"columns": prompt_reader.copies(model, "columns")})["choice"] == "columns"


@pytest.mark.parametrize("wins_from, expected", [(24, 24), (8, 8), (128, 128)])
def test_the_reader_is_used_from_the_shortest_length_at_which_it_wins_at_every_longer_one(monkeypatch, wins_from,
                                                                                           expected):
    """A reader that wins from `wins_from` tokens on, and by chance at 12 too (a timing's noise), is used from there;
    one that wins only at the prompt length it was chosen at is used from there."""
    model, _ = quantized_with_float_copy()
    timed = []

    def time_read(m, products=None, tokens=prompt_reader.PROMPT):
        timed.append((products is None, tokens))
        wins = tokens >= wins_from or tokens == 12
        return 1.0 if products is None else (0.5 if wins else 2.0)
    monkeypatch.setattr(prompt_reader, "time_read", time_read)
    assert prompt_reader.crossover(model, prompt_reader.copies(model, "float32")) == expected
    lengths = [tokens for own, tokens in timed if own]
    assert lengths == sorted(lengths, reverse=True)         # the longest first, stopping at the first loss
    assert {True, False} == {own for own, _ in timed}       # each length timed both ways


def test_a_cache_reads_feeds_through_the_reader_from_the_length_stored_and_shorter_ones_through_its_own():
    model, _ = quantized_with_float_copy()
    products = prompt_reader.copies(model, "float32")
    with torch.inference_mode():
        def fed(n, **given):
            return open_cache(model, "t", **given).feed_committed(PROMPT[:n])
        assert torch.equal(fed(12, prompt_products=products, read_from=12), fed(12, prompt_products=products,
                                                                                 read_from=1))
        assert torch.equal(fed(11, prompt_products=products, read_from=12), fed(11))
        assert not torch.equal(fed(12), fed(12, prompt_products=products, read_from=12))
    stack, _ = quantized_draft_stack()
    stack.prompt_reads.products["draft"] = products
    stack.prompt_reads.choices["draft"] = {"choice": "float32", "seconds": {}, "from": 12}
    assert stack.drafter_for("staged").kv.read_from == 12               # the stored crossover reaches the drafters
    del stack.prompt_reads.choices["draft"]["from"]                     # a profile from before crossovers
    assert stack.drafter_for("staged").kv.read_from == prompt_reader.READ_ROWS


def test_the_planner_prices_the_draft_s_catch_up_by_the_reader_it_reads_through():
    """After plain steps the draft reads what it missed in one feed: the planner prices that feed by the reader the
    stack's draft uses (Costs.catch_up), not by the draft's own forward."""
    from test_round_plan import cpu_plan
    stack, _ = quantized_draft_stack()
    stack.plans.pin(cpu_plan())
    tree = default_tree("staged")
    assert stack.plans.for_decoder("staged", tree, Sampling())[1].costs.reader is None     # its own products
    stack.prompt_reads.choices["draft"] = {"choice": "float32", "seconds": {"float32": 0.1}, "from": 12}
    costs = stack.plans.for_decoder("speculative", tree, Sampling())[1].costs
    assert costs.reader[0] == 12 and costs.catch_up(prompt_reader.PROMPT) == pytest.approx(0.1)
    assert costs.catch_up(11) == costs.drafting(11)
    del stack.prompt_reads.choices["draft"]["from"]                     # a profile from before crossovers
    assert stack.plans.for_decoder("staged", tree, Sampling())[1].costs.reader[0] == prompt_reader.READ_ROWS


def test_a_stack_measures_its_draft_prompt_read_only_in_prepare_and_later_stacks_read_the_stored_choice(
        own_profile, monkeypatch):

    def quantized_stack():
        return quantized_draft_stack()[0]
    measured = []
    monkeypatch.setattr(prompt_reader, "chooser", lambda model: lambda: measured.append(1) or
                        {"choice": "bfloat16", "seconds": {"own": 1.0, "bfloat16": 0.5, "float32": 1.2}})
    first = quantized_stack()
    assert first.prompt_reads.read(first.draft_models(), own_profile) == {}        # generating never times
    assert not own_profile.file.path().exists()
    assert first.prompt_reads.products.get("draft") is None and first.drafter_for("staged").kv.reader is None
    with own_profile.preparing("the tests"):       # measured as prepare measures
        assert first.prompt_reads.read(first.draft_models(), own_profile)["draft"]["choice"] == "bfloat16"
    assert measured == [1]
    assert "prompt read: draft" in own_profile.file.path().read_text()
    second = quantized_stack()
    assert second.prompt_reads.read(second.draft_models(), own_profile)["draft"]["choice"] == "bfloat16"
    assert measured == [1]
    assert second.drafter_for("staged").kv.reader is not None        # the stack's drafters get the reader
    assert second.prompt_reads.products["draft"][0]["down"].weight.dtype == torch.bfloat16
    with own_profile.preparing("the tests"):
        assert second.prompt_reads.read(second.draft_models(), own_profile)["draft"]["choice"] == "bfloat16"
        assert measured == [1]
        # measured again on request (python -m specviz.prepare --remeasure), a loaded stack takes the new choice
        monkeypatch.setattr(prompt_reader, "chooser", lambda model: lambda: measured.append(2) or
                            {"choice": "float32", "seconds": {"own": 1.0, "bfloat16": 1.5, "float32": 0.8}})
        with own_profile.preparing("the tests", remeasure=True):
            assert second.prompt_reads.read(second.draft_models(), own_profile)["draft"]["choice"] == "float32"
    assert measured == [1, 2]
    assert second.prompt_reads.products["draft"][0]["down"].weight.dtype == torch.float32


def test_the_draft_prompt_read_is_its_own_phase_of_the_first_round_only():
    stack = tiny_stack(("draft", "lookup"))
    run = stack.decoder(PROMPT, "staged", max_new_tokens=16, stop_at_eos=False).generate()
    first, later = run.steps[0], run.steps[1:]
    assert first.phase_s["prompt_read"] > 0 and first.forwards["draft"][0] == len(PROMPT)
    assert all("prompt_read" not in s.phase_s for s in later)
    assert "prompt_read" in time_split(first.phase_s, first.wall_s)
    figure = latency_figure({"staged": summarise(run.steps)})
    assert "the draft model reading the prompt (once)" in {trace.name for trace in figure.data}
    plain = stack.decoder(PROMPT, "baseline", max_new_tokens=4).generate()
    assert all("prompt_read" not in s.phase_s for s in plain.steps)


def test_the_regime_panel_says_how_the_draft_reads_prompts():
    from specviz.app.regime import regime_md
    choice = {"choice": "bfloat16", "seconds": {"own": 0.43, "bfloat16": 0.2, "float32": 0.46}}
    view = {"ours": {k: 0.05 * k ** 0.5 for k in (1, 2, 4, 8, 16)}, "llama": None, "why_no_llama": "not built",
            "probes": {}, "target": "t", "precision": "gguf", "plan": None, "prompt_reads": {"qwen-0.5b": choice}}
    text = regime_md(view)
    assert f"**qwen-0.5b**: {prompt_reader.describe(choice)}." in text
    assert ("bfloat16 copies of its weights (128 tokens: its own products 430 ms, bfloat16 200 ms, float32 460 ms)"
            in text)
    assert "reads prompts" not in regime_md({**view, "prompt_reads": {}})


def test_a_prompt_read_timed_again_on_a_busy_machine_times_the_same_copies(monkeypatch, preparing):
    """Where other work spoils a timing, prepare times the candidates again (machine_profile.SETTLE_TRIES in all): the
    float copies made for the first try, not the draft de-quantised anew for each."""
    from specviz.profile import store as machine_profile

    model, _ = quantized_with_float_copy()
    made, own_reads = [], []
    copies = prompt_reader.copies
    monkeypatch.setattr(prompt_reader, "copies", lambda m, name: made.append(name) or copies(m, name))
    monkeypatch.setattr(prompt_reader, "time_read",
                        lambda m, products=None, tokens=None: own_reads.append(products is None) or 1.0)
    monkeypatch.setattr(machine_profile.OthersWatch, "share", lambda self: 1.0)          # busy, whatever was timed
    preparing.busy_share = 0.25
    monkeypatch.setattr(machine_profile, "SETTLE_WAIT_S", 0.0)
    chosen = preparing.decided("prompt read: a busy test", prompt_reader.chooser(model))
    assert chosen["choice"] == prompt_reader.OWN
    assert own_reads.count(True) == machine_profile.SETTLE_TRIES * prompt_reader.ROUNDS
    assert sorted(made) == sorted(prompt_reader.CANDIDATES)
