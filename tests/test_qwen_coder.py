"""The qwen-coder preset on the real Qwen2.5-Coder pair (installed by scripts/setup.sh from PyPI chunk
packages): it loads offline, both models share one vocabulary, and every strategy's greedy output
equals baseline's with the files' own blocks (`gguf`, the default), compared within this run (never against tokens
remembered from one CPU)."""
import pytest
from short_prompts import beyond_near_ties, greedy_disagreements

from specviz.stack.auto_trigram import draft_text_path, draft_texts
from specviz.models.chunked import CHUNKED, available
from specviz.cpu.file_model import requantizable
from specviz.models.load import load_model
from specviz.stack.presets import load_preset
from specviz.decode.drafters import cascade
from specviz.bench.prompts import load_prompts
from specviz.stack.strategies import STRATEGIES

pytestmark = pytest.mark.slow
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def stack():
    missing = [key for key, file in CHUNKED.items() if not available(file)]
    assert not missing, f"{missing} not installed: scripts/setup.sh installs the qwen-coder parts"
    return load_preset("qwen-coder", dtype="gguf")


def test_the_pair_shares_a_vocabulary_and_staged_has_a_cascade(stack):
    assert stack.dtype == "gguf" and stack.drafts[0] == "qwen2.5-coder-0.5b"
    assert [d.kind for d in cascade(stack.drafter_for("staged"))] == ["model", "ngram"]
    assert draft_texts(stack.drafts) == [draft_text_path("qwen2.5-coder-0.5b")]   # its trigram knows the 0.5B's text
    draft = stack.loaded["qwen2.5-coder-0.5b"].model
    assert stack.target.model.get_output_embeddings().out_features == draft.get_output_embeddings().weight.shape[0]


@pytest.mark.parametrize("prompt", [load_prompts(limit=11)[10].text, "def fibonacci(n):\n"])
def test_every_strategy_equals_baseline_on_the_real_pair(stack, prompt):
    ids = stack.encode(prompt)
    runs = {s: stack.decoder(ids, s, max_new_tokens=NEW_TOKENS, stop_at_eos=False).generate() for s in STRATEGIES}
    for strategy, run in runs.items():
        assert run.tokens == runs["baseline"].tokens, strategy
    assert runs["staged"].stats["target_forwards"] < runs["baseline"].stats["target_forwards"]   # over the run


def test_staged_with_the_draft_cut_to_its_trigrams_tokens_equals_baseline(stack):
    ids = stack.encode("def fibonacci(n):\n")
    baseline = stack.decoder(ids, "baseline", max_new_tokens=NEW_TOKENS, stop_at_eos=False).generate()
    stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
    try:
        decoder = stack.decoder(ids, "staged", max_new_tokens=NEW_TOKENS, stop_at_eos=False)
        assert decoder.generate().tokens == baseline.tokens
        vocab = stack.vocabulary.for_draft(stack.loaded["qwen2.5-coder-0.5b"], ids)
        assert 20_000 < len(vocab) < 40_000 and set(ids) <= set(vocab.tolist())
    finally:
        stack.vocabulary.tokens = None          # the module's other tests run the whole vocabulary


@pytest.mark.parametrize("model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_after_a_one_token_prompt_the_files_blocks_write_what_the_float_model_writes(model):
    """A one-token prompt's next token comes from the first position, whose few huge values made int8 rounding write
    `00000000` after `def` (llama.cpp does): blocks.c rounds such rows twice, and the target and the draft follow the
    file's float32 model, the near ties aside. That model holds the file's weights exactly (each block de-quantised
    as the `gguf` package does it: tests/test_blocks.py), in memory: a copy on disk would take minutes to write."""
    ours = load_model(model, "gguf")
    exact = requantizable(load_model(model, "gguf")).model
    prompts = ("def", "import", "class", "#")
    for prompt, found in greedy_disagreements(exact, ours.model, ours.tokenizer, prompts).items():
        assert beyond_near_ties(found) == [], prompt
        if model == "qwen2.5-coder-1.5b" and prompt in ("def", "import"):
            assert found == [], prompt                      # the same greedy text, near ties and all
