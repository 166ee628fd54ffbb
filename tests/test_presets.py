"""Named presets: the table, the offline failure message, and the trigram built on first use."""
import pytest

import specviz.stack.auto_trigram
import specviz.models.load
import specviz.models.precision
from specviz.stack.auto_trigram import auto_trigram
from specviz.models.load import ModelLoadError
from specviz.stack.presets import PRESETS, get_preset, load_preset
from specviz.stack.strategies import is_non_neural


def test_preset_table_describes_loadable_cascades():
    assert {"offline", "qwen-coder", "paper-gpt2", "smollm2-1.7b", "pythia-cascade", "qwen2.5-1.5b"} <= set(PRESETS)
    for name, preset in PRESETS.items():
        assert preset.description and preset.target
        if preset.drafts is None:
            assert not preset.hub
            continue
        assert len(preset.drafts) >= 2, name
        assert not any(is_non_neural(d) for d in preset.drafts[:-1]), name      # staged is possible
    assert get_preset("paper-gpt2").target == "gpt2-large" and get_preset("paper-gpt2").drafts[0] == "gpt2"
    assert sum(not is_non_neural(d) for d in get_preset("pythia-cascade").drafts) == 2    # 3 models in all


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'; choose one of offline"):
        get_preset("gpt5")


@pytest.mark.parametrize("installed, memory_gib, token_s, device, expected", [
    (True, 24, 0.25, "cpu", "qwen-coder"),        # our AVX2 machine with the rows kernel
    (True, 24, 0.44, "cpu", "offline"),           # the same machine without it
    (True, 8, 0.25, "cpu", "offline"),            # a fast CPU without room for both models
    (False, 24, 0.25, "cpu", "offline"),          # its parts not installed
    (True, 8, 9.0, "cuda", "qwen-coder"),         # a GPU: neither the CPU's speed nor its memory matter
])
def test_the_default_stack_is_chosen_by_measurement(monkeypatch, installed, memory_gib, token_s, device, expected):
    import specviz.stack.presets as presets
    monkeypatch.delenv(presets.PRESET_ENV, raising=False)
    monkeypatch.setattr(presets, "available", lambda chunked: installed)
    monkeypatch.setattr(presets, "memory_bytes", lambda: memory_gib * 2**30)
    monkeypatch.setattr(presets, "predicted_token_seconds", lambda profile: token_s)
    assert presets.default_preset(device) == expected


def test_an_operator_may_name_the_default_stack(monkeypatch):
    import specviz.stack.presets as presets
    monkeypatch.setenv(presets.PRESET_ENV, "paper-gpt2")
    assert presets.default_preset() == "paper-gpt2"
    monkeypatch.setenv(presets.PRESET_ENV, "gpt5")
    with pytest.raises(ValueError, match="^SPECVIZ_PRESET='gpt5' is not a preset; choose one of offline, qwen-coder"):
        presets.default_preset()


@pytest.mark.slow
def test_the_token_time_is_predicted_from_the_probe_layer_here(preparing):
    import specviz.stack.presets as presets
    from specviz.models.precision import auto_precision, probe_seconds, resolve_dtype, runs_file_blocks
    seconds = presets.predicted_token_seconds(preparing)
    target = presets.PRESETS["qwen-coder"].target        # its GGUF file's own blocks, where the kernels build
    assert auto_precision(target, preparing) == ("gguf" if runs_file_blocks() else resolve_dtype("auto", preparing))
    probe = probe_seconds(auto_precision(target, preparing), preparing)
    assert seconds == probe[1] * 33 and 0 < seconds < 60


def test_hub_preset_without_network_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))          # an empty hub cache
    monkeypatch.setattr(specviz.models.load, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelLoadError) as info:
        load_preset("smollm2-1.7b")
    message = str(info.value)
    assert "\n" not in message
    assert "HuggingFaceTB/SmolLM2-1.7B-Instruct" in message and "--preset offline" in message


def test_auto_trigram_is_built_for_the_tokenizer_once_and_cached(smollm2, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    model = auto_trigram(smollm2.tokenizer, "smollm2", limit_bytes=300_000)
    files = list((tmp_path / "trigrams").glob("*.npz"))
    assert len(files) == 1
    assert model.vocab_size == len(smollm2.tokenizer)
    ids = smollm2.tokenizer("    def __init__(self", add_special_tokens=False)["input_ids"]
    assert model.top(ids[:-1], 1)[0][0] == ids[-1]          # "self" follows "__init__(" in Python source
    again = auto_trigram(smollm2.tokenizer, "smollm2", limit_bytes=300_000)
    assert list((tmp_path / "trigrams").glob("*.npz")) == files
    assert (again.probs(ids[:-1]) == model.probs(ids[:-1])).all()


def _write_draft_text(path, texts):
    import gzip
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)


def test_auto_trigram_counts_the_text_the_draft_wrote_and_caches_it_apart(smollm2, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(specviz.stack.auto_trigram, "DRAFT_TEXT", tmp_path / "draft_text")
    written = specviz.stack.auto_trigram.draft_text_path("some/dir/tiny-draft")
    assert written == tmp_path / "draft_text" / "tiny-draft.jsonl.gz"
    assert specviz.stack.auto_trigram.draft_texts(["some/dir/tiny-draft", "lookup"]) == []
    _write_draft_text(written, ["zebra quokka narwhal, zebra quokka narwhal."] * 3)
    assert specviz.stack.auto_trigram.draft_texts(["some/dir/tiny-draft", "lookup"]) == [written]

    ids = smollm2.tokenizer(" zebra quokka narwhal", add_special_tokens=False)["input_ids"]
    cut = len(smollm2.tokenizer(" zebra quokka", add_special_tokens=False)["input_ids"])
    source_only = auto_trigram(smollm2.tokenizer, "smollm2", limit_bytes=300_000)
    with_text = auto_trigram(smollm2.tokenizer, "smollm2", [written], limit_bytes=300_000)
    assert with_text.top(ids[:cut], 1)[0][0] == ids[cut]          # the draft's habit is learnt
    assert source_only.top(ids[:cut], 1)[0][0] != ids[cut]
    assert len(list((tmp_path / "cache" / "trigrams").glob("*.npz"))) == 2     # one per set of texts
    _write_draft_text(written, ["zebra quokka okapi."] * 3)                 # new text: a fresh build
    rebuilt = auto_trigram(smollm2.tokenizer, "smollm2", [written], limit_bytes=300_000)
    okapi = smollm2.tokenizer(" zebra quokka okapi", add_special_tokens=False)["input_ids"]
    assert rebuilt.top(okapi[:cut], 1)[0][0] == okapi[cut]
