"""A text ends at every token that the model's configs, GGUF file and tokenizer name (specviz/decode/end_tokens.py), and
every strategy stops exactly where baseline stops."""
from types import SimpleNamespace

import pytest
from tiny import TinyTokenizer, tiny_model

from specviz.decode import end_tokens
from specviz.backends.choose import open_cache
from specviz.decode.drafters import LookupDrafter, ModelDrafter
from specviz.decode.engine import Decoder
from specviz.decode.sampling import Sampling
from specviz.decode.tree import TreeSpec

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


class EndingTokenizer(TinyTokenizer):
    """A tokenizer whose special token `<|endoftext|>` is `end` (Qwen's second end token), and another special token
    that ends nothing."""

    def __init__(self, end: int, other: int = 63):
        self.added_tokens_decoder = {end: SimpleNamespace(content="<|endoftext|>", special=True),
                                     other: SimpleNamespace(content="<|fim_prefix|>", special=True)}


def lanes():
    target = tiny_model("llama")
    draft = tiny_model("llama", noise=0.3)
    return {"speculative": (ModelDrafter(draft, backend=open_cache), TreeSpec(shape="chain", budget=6, max_depth=6)),
            "tree": (ModelDrafter(draft, backend=open_cache), TreeSpec(budget=10)),
            "staged": (ModelDrafter(draft, backend=open_cache, lower=LookupDrafter(64)), TreeSpec(budget=10, lookup=6)),
            "lookup": (LookupDrafter(64), TreeSpec(budget=8))}, target


def test_every_strategy_stops_at_the_tokenizers_second_end_token_where_baseline_does():
    strategies, target = lanes()
    free = Decoder(open_cache(target, "target"), TinyTokenizer(), PROMPT, max_new_tokens=40).generate().tokens
    # the tokenizer's end token comes first; the config's eos is one the model never writes here
    second = next(t for i, t in enumerate(free) if i >= 6 and t not in free[:i])
    eos = next(t for t in range(62) if t not in free)
    tokenizer = EndingTokenizer(second)
    target.generation_config.eos_token_id = eos
    try:
        assert end_tokens.of(target, tokenizer) == {eos, second}
        base = Decoder(open_cache(target, "target"), tokenizer, PROMPT, max_new_tokens=40).generate()
        assert base.tokens == free[: free.index(second) + 1] and base.steps[-1].finish_reason == "eos"
        for strategy, (drafter, tree) in strategies.items():
            run = Decoder(open_cache(target, "target"), tokenizer, PROMPT, drafter=drafter, strategy=strategy,
                          tree=tree, max_new_tokens=40).generate()
            assert run.tokens == base.tokens, strategy
            assert run.steps[-1].finish_reason == "eos" and run.text == tokenizer.decode(base.tokens)
            for step in run.steps:          # nothing is drafted below an end token
                assert all(step.nodes[n.parent].token != second for n in step.nodes[1:]), strategy
    finally:
        target.generation_config.eos_token_id = None


def test_sampled_lanes_stop_at_an_end_token_too():
    strategies, target = lanes()
    drafter, tree = strategies["staged"]
    sampling = Sampling(temperature=1.0, top_k=8, seed=3)
    free = Decoder(open_cache(target, "target"), TinyTokenizer(), PROMPT, drafter=drafter, strategy="staged", tree=tree,
                   sampling=sampling, max_new_tokens=30).generate().tokens
    end = free[5]
    run = Decoder(open_cache(target, "target"), EndingTokenizer(end), PROMPT, drafter=drafter, strategy="staged",
                  tree=tree, sampling=sampling, max_new_tokens=30).generate()
    assert run.tokens[-1] == end and end not in run.tokens[:-1] and run.steps[-1].finish_reason == "eos"


def test_the_set_joins_configs_tokenizer_and_the_gguf_header(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(300)])         # an array of strings the reader must skip
    writer.add_eos_token_id(7)
    writer.add_uint32("tokenizer.ggml.eot_token_id", 9)
    writer.add_uint32("tokenizer.ggml.padding_token_id", 11)     # padding ends nothing
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert end_tokens.gguf_ids(path) == {7, 9}
    assert end_tokens.gguf_ids(tmp_path / "absent.gguf") == set()

    model = SimpleNamespace(config=SimpleNamespace(eos_token_id=2),
                            generation_config=SimpleNamespace(eos_token_id=[2, 5]))
    assert end_tokens.mark(model, EndingTokenizer(40), path) == {2, 5, 7, 9, 40}
    assert model.generation_config.eos_token_id == [2, 5, 7, 9, 40]      # what generate() and of() read


def test_special_tokens_are_shown_by_name():
    assert end_tokens.visible("x<|endoftext|><|fim_prefix|>#") == "x⟨endoftext⟩⟨fim_prefix⟩#"
    assert end_tokens.visible("a | b || c <| d") == "a | b || c <| d"
