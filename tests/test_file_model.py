"""A GGUF file's own model (`gguf`, specviz/cpu/file_model.py) on the real SmolLM2-135M file (Q4_1 and Q8_0 blocks, a
Llama whose q and k rows llama.cpp reorders): its layers hold the file's weights exactly (as transformers de-quantises
them, q and k rows back in order), it maps the file instead of copying it, its logits follow the float model of the
same weights within the activations' rounding, and every strategy writes its baseline's tokens."""
import json

import numpy as np
import pytest
import torch
from short_prompts import ONE_TOKEN, beyond_near_ties, greedy_disagreements

from specviz.cpu.blocks import BlockEmbedding, BlockLinear
from specviz.models.load import load_model
from specviz.bench.prompts import load_prompts
from specviz.stack.stack import Stack
from specviz.stack.strategies import STRATEGIES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def file_model():
    return load_model("smollm2-135m", "gguf")


def test_every_layer_holds_the_files_weights_as_transformers_reads_them(file_model, smollm2):
    float_layers = dict(smollm2.model.named_modules())
    blocks = {name: m for name, m in file_model.model.named_modules() if isinstance(m, BlockLinear)}
    assert len(blocks) == 7 * smollm2.model.config.num_hidden_layers + 1            # and the tied output layer
    for name, layer in blocks.items():
        assert torch.equal(layer.dequantized(), float_layers[name].weight), name    # q and k rows in order too
    assert isinstance(file_model.model.model.embed_tokens, BlockEmbedding)
    ids = torch.tensor([[1, 500, 20000, 49151]])
    assert torch.equal(file_model.model.model.embed_tokens(ids), smollm2.model.model.embed_tokens(ids))
    assert file_model.dtype == "gguf" and file_model.tokenizer.get_vocab() == smollm2.tokenizer.get_vocab()


def mapped_file(address: int) -> str:
    """The file mapped at this address of this process ('' for anonymous memory), from /proc/self/maps."""
    for line in open("/proc/self/maps"):
        span, *rest = line.split()
        low, high = (int(part, 16) for part in span.split("-"))
        if low <= address < high:
            return rest[4] if len(rest) > 4 else ""
    return ""


def test_the_blocks_are_the_mapped_file_not_a_copy(file_model):
    layer = file_model.model.model.layers[3].mlp.down_proj
    assert mapped_file(layer.weight.data_ptr()).endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    norm = file_model.model.model.layers[3].input_layernorm.weight                      # float32, copied out
    assert not mapped_file(norm.data_ptr()).endswith(".gguf")
    bytes_held = sum(p.numel() * p.element_size() for p in file_model.model.parameters())
    assert bytes_held < 1.05 * 106e6 * 20 / 32 + 28.3e6 * 34 / 32 + 1e6                    # Q4_1 + Q8_0 bytes, norms


def test_its_logits_follow_the_float_model_of_the_same_weights(file_model, smollm2):
    ids = smollm2.tokenizer(load_prompts(limit=3)[2].text, return_tensors="pt").input_ids[:, :160]
    with torch.inference_mode():
        exact = torch.log_softmax(smollm2.model(ids).logits[0].double(), -1)
        ours = torch.log_softmax(file_model.model(ids).logits[0].double(), -1)
    kl = (exact.exp() * (exact - ours)).sum(-1).mean().item()
    agree = (exact.argmax(-1) == ours.argmax(-1)).double().mean().item()
    assert kl < 0.01 and agree > 0.95, (kl, agree)


def test_after_a_one_token_prompt_the_files_blocks_write_what_its_float_model_writes(file_model, smollm2):
    """The next token after a one-token prompt comes from the first position's logits, where a few values dwarf the
    rest (blocks.c rounds such rows twice): every greedy token follows the float model, the near ties aside."""
    for prompt, found in greedy_disagreements(smollm2.model, file_model.model, smollm2.tokenizer, ONE_TOKEN).items():
        assert beyond_near_ties(found) == [], prompt
        if prompt in ("def", "import"):
            assert found == [], prompt                      # the same greedy text, near ties and all


def test_every_strategy_writes_baselines_tokens_with_the_files_blocks(own_profile):
    stack = Stack.load("smollm2-135m", None, dtype="gguf", profile=own_profile)     # the shipped draft and trigram
    assert stack.dtype == "gguf"
    prompt = stack.encode(load_prompts(limit=5)[4].text)
    runs = {s: stack.decoder(prompt, s, max_new_tokens=24, stop_at_eos=False).generate() for s in STRATEGIES}
    for strategy, run in runs.items():
        assert run.tokens == runs["baseline"].tokens, strategy
    assert np.mean([runs["staged"].stats["tokens_per_target_forward"]]) > 1.2


def test_the_quality_table_scores_every_position_beside_llama_cpp_and_the_re_quantised_model(tmp_path, capsys):
    from specviz.bench import quality
    from specviz.peers.llama_cpp import program

    out = tmp_path / "quality.json"
    llama = [] if program("llama-perplexity") else ["--no-llama-cpp"]
    assert quality.main(["--model", "smollm2-135m", "--precisions", "gguf,int4", "--context", "128", "--chunks", "2",
                         "--out", str(out), *llama]) == 0
    rows = json.loads(out.read_text())["rows"]
    exact, ours = rows["float32 (the file's weights)"], rows["gguf (the file's own blocks)"]
    requantised = rows["int4 (re-quantised)"]
    short = len(quality.SHORT_PROMPTS)
    # every position of both chunks and of every short prompt; each short prompt and chunk has a position 0
    assert exact["tokens"] > 2 * 128 and exact["by_position"]["0"]["tokens"] == 2 + short
    assert exact["kl"] == pytest.approx(0, abs=1e-9) and exact["top1"] == 1
    assert exact["second_half"]["tokens"] == 2 * 63
    for row in (ours, requantised):
        assert 0 < row["by_position"]["0"]["kl"] and row["by_position"]["32+"]["tokens"] == 2 * (128 - 32)
    # the file beats a re-quantisation, at every position and over all of them
    assert ours["kl"] < requantised["kl"] and ours["top1"] >= requantised["top1"]
    assert ours["by_position"]["0"]["kl"] < requantised["by_position"]["0"]["kl"]
    assert abs(np.log(ours["perplexity"] / exact["perplexity"])) < 0.02
    if not llama:                                          # llama.cpp's own logits of the same file: as close as ours
        theirs = rows["llama.cpp (its own logits of the file)"]["second_half"]
        assert theirs["kl"] < 3 * ours["second_half"]["kl"] + 1e-3 and theirs["top1"] > 0.9
    printed = capsys.readouterr().out
    assert "| precision | KL at 0 | KL at 1 |" in printed and "| precision | KL to the file's model (nats) |" in printed
    assert "| Q4_1 |" in printed
