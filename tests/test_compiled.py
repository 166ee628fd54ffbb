"""The compiled path (torch.compile over a static KV cache; CUDA graphs on a GPU), run on the CPU."""
import json
import os

import pytest
import torch
from tiny import TinyTokenizer, save_with_word_tokenizer, tiny_model

from specviz.backends.choose import BUCKETS, open_cache
from specviz.decode.drafters import LookupDrafter, ModelDrafter
from specviz.decode.engine import Decoder, static_length
from specviz.models.load import compile_model
from specviz.decode.tree import TreeSpec

TOK = TinyTokenizer()
TREE = TreeSpec(budget=6, lookup=4)


def counted(model):
    """The model compiled, wrapped to record each call's feed size."""
    compiled, calls = compile_model(model), []

    def counting(**inputs):
        calls.append(inputs["input_ids"].shape[1])
        return compiled(**inputs)
    return counting, calls


@pytest.fixture(scope="module")
def compiled_calls():
    """The tiny target compiled once for this module."""
    return counted(tiny_model("llama"))


@pytest.fixture(scope="module")
def compiled_draft():
    """A draft (the tiny target with noise) and its compiled copy, once for this module."""
    draft = tiny_model("llama", noise=0.3)
    return (draft, *counted(draft))


@pytest.mark.slow          # torch.compile's inductor builds C++ for each graph
@pytest.mark.parametrize("strategy,drafter", [
    ("baseline", lambda: None),
    ("tree", lambda: ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache, lower=LookupDrafter(64))),
])
def test_compiled_target_runs_bucket_sized_feeds_and_keeps_greedy_output(compiled_calls, strategy, drafter):
    counting, calls = compiled_calls
    target, prompt = tiny_model("llama"), [3, 4, 5, 6, 7, 3, 4, 5]
    expected = Decoder(open_cache(target, "target"), TOK, prompt, max_new_tokens=20).generate().tokens
    calls.clear()
    decoder = Decoder(open_cache(target, "target", static_len=static_length(len(prompt), 20, TREE), compiled=counting),
                      TOK, prompt, max_new_tokens=20, drafter=drafter(), strategy=strategy, tree=TREE)
    assert decoder.generate().tokens == expected
    assert decoder.target.static_len % 256 == 0
    assert set(calls) <= set(BUCKETS)
    assert calls[0] == 8 and len(calls) == 1 + len(decoder.steps)    # the 7-token prefill, then every round


@pytest.mark.slow
@pytest.mark.parametrize("lower", ["lookup", "model"])
def test_compiled_drafts_run_bucket_sized_feeds_over_the_targets_static_length_and_keep_greedy_output(
        compiled_calls, compiled_draft, lower):
    """Both the target and the draft compiled (issue 33): every draft forward runs the compiled copy. As
    the top stage the draft is fed tree levels; as a lower stage it guesses chains (ModelDrafter.guess)."""
    target_run, _ = compiled_calls
    draft, draft_run, draft_calls = compiled_draft
    target, prompt = tiny_model("llama"), [3, 4, 5, 6, 7, 3, 4, 5]
    expected = Decoder(open_cache(target, "target"), TOK, prompt, max_new_tokens=20).generate().tokens
    compiled = ModelDrafter(draft, backend=open_cache, name="compiled", compiled=draft_run, lower=LookupDrafter(64))
    drafter = (compiled if lower == "lookup"
               else ModelDrafter(tiny_model("llama", noise=0.2), backend=open_cache, name="top", lower=compiled))
    draft_calls.clear()
    cache = open_cache(target, "target", static_len=static_length(len(prompt), 20, TREE), compiled=target_run)
    decoder = Decoder(cache, TOK, prompt, max_new_tokens=20, drafter=drafter, strategy="staged", tree=TREE)
    assert decoder.generate().tokens == expected
    assert compiled.kv.static_len == decoder.target.static_len
    assert set(draft_calls) <= set(BUCKETS)
    assert len(draft_calls) == sum(len(step.forwards["compiled"]) for step in decoder.steps) > len(decoder.steps)


def reusing_outputs(model):
    """A stand-in for CUDA graphs on the CPU: each replay of a graph (here: each feed size) writes its
    output into the same memory, overwriting what the last call of that size returned."""
    memory = {}

    def run(**inputs):
        out = model(**inputs)
        out.logits = memory.setdefault(out.logits.shape, torch.empty_like(out.logits)).copy_(out.logits)
        return out
    return run


def test_a_drafter_keeps_its_logits_when_a_later_replay_overwrites_the_graphs_output():
    """A staged drafter reads the logits of guessed tokens one level after feeding them: what it keeps must be
    a copy, or a CUDA-graph replay in between changes the tree it builds."""
    target, draft, prompt = tiny_model("llama"), tiny_model("llama", noise=0.3), [3, 4, 5, 6, 7, 3, 4, 5]

    def trees(compiled):
        drafter = ModelDrafter(draft, backend=open_cache, compiled=compiled, lower=LookupDrafter(64), lookahead=2)
        decoder = Decoder(open_cache(target, "target", static_len=256), TOK, prompt, max_new_tokens=40, drafter=drafter,
                          strategy="staged", tree=TreeSpec(budget=10, level_width=2))
        decoder.generate()
        return [[(node.parent, node.token) for node in step.nodes] for step in decoder.steps]

    assert trees(reusing_outputs(draft)) == trees(lambda **inputs: draft(**inputs))


def test_a_static_cache_too_small_for_the_generation_is_refused():
    with pytest.raises(ValueError, match="static cache holds 64"):
        Decoder(open_cache(tiny_model("llama"), "target", static_len=64), TOK, [1, 2, 3], max_new_tokens=40)


@pytest.mark.slow
def test_cli_compile_flag_gives_the_eager_output(tmp_path):
    """`generate --compile` end to end on a tiny saved model with a word-level tokenizer (its main in this process)."""
    from test_cli import in_process

    save_with_word_tokenizer(tiny_model("llama"), tmp_path)
    args = ("--prompt", "w3 w4 w5 w6", "--target", str(tmp_path), "--strategy", "baseline",
            "--max-new-tokens", "6", "--dtype", "float32", "--json")    # not auto: its pick may differ per process
    eager, compiled = in_process(*args), in_process(*args, "--compile")
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert json.loads(compiled.stdout)["tokens"] == json.loads(eager.stdout)["tokens"]
    assert json.loads(compiled.stdout)["new_tokens"] == 6


@pytest.mark.slow
def test_the_gpu_exactness_script_finds_every_strategy_identical_on_a_tiny_qwen2_pair():
    """scripts/gpu_exactness.py, which a lent GPU runs at the 1.5B's size (issue 33), here at tiny sizes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "scripts/gpu_exactness.py", "--sizes", "tiny-qwen", "--device", "cpu",
                          "--prompts", "1", "--max-new-tokens", "12"], cwd=root, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert sum(" identical 12 tokens" in line for line in lines) == 4 and lines[-1].startswith("0 mismatches")
