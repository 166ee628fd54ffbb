"""The compiled path (torch.compile over a static KV cache; CUDA graphs on a GPU), run on the CPU."""
import json

import pytest

from specviz.cache import BUCKETS
from specviz.drafters import LookupDrafter, ModelDrafter
from specviz.tree import TreeSpec
from specviz.engine import Decoder
from specviz.models import compile_model
from tiny import TinyTokenizer, save_with_word_tokenizer, tiny_model

TOK = TinyTokenizer()


@pytest.fixture(scope="module")
def compiled_calls():
    """The tiny target compiled once for this module, wrapped to record each call's feed size."""
    compiled, calls = compile_model(tiny_model("llama")), []

    def counting(**inputs):
        calls.append(inputs["input_ids"].shape[1])
        return compiled(**inputs)
    return counting, calls


@pytest.mark.parametrize("strategy,drafter", [
    ("baseline", lambda: None),
    ("tree", lambda: ModelDrafter(tiny_model("llama", noise=0.3), lower=LookupDrafter(64))),
])
def test_compiled_target_runs_bucket_sized_feeds_and_keeps_greedy_output(compiled_calls, strategy, drafter):
    counting, calls = compiled_calls
    target, prompt = tiny_model("llama"), [3, 4, 5, 6, 7, 3, 4, 5]
    expected = Decoder(target, TOK, prompt, max_new_tokens=20).generate().tokens
    calls.clear()
    decoder = Decoder(target, TOK, prompt, max_new_tokens=20, drafter=drafter(), strategy=strategy,
                      tree=TreeSpec(budget=6, lookup=4), compiled=counting)
    assert decoder.generate().tokens == expected
    assert decoder.target.static_len % 256 == 0
    assert set(calls) <= set(BUCKETS)
    assert calls[0] == 8 and len(calls) == 1 + len(decoder.steps)    # the 7-token prefill, then every round


def test_a_static_cache_too_small_for_the_generation_is_refused():
    with pytest.raises(ValueError, match="static cache holds 64"):
        Decoder(tiny_model("llama"), TOK, [1, 2, 3], max_new_tokens=40, static_len=64)


def test_cli_compile_flag_gives_the_eager_output(tmp_path):
    """`generate --compile` end to end on a tiny saved model with a word-level tokenizer."""
    from test_cli import cli

    save_with_word_tokenizer(tiny_model("llama"), tmp_path)
    args = ("--prompt", "w3 w4 w5 w6", "--target", str(tmp_path), "--strategy", "baseline",
            "--max-new-tokens", "6", "--dtype", "float32", "--json")    # not auto: its pick may differ per process
    eager, compiled = cli(*args), cli(*args, "--compile")
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert json.loads(compiled.stdout)["tokens"] == json.loads(eager.stdout)["tokens"]
    assert json.loads(compiled.stdout)["new_tokens"] == 6
