"""A GGUF file's config, tokenizer and table of tensors from one walk over its header (specviz/cpu/gguf_metadata.py):
the same files as transformers' `AutoConfig` and `AutoTokenizer` and the `gguf` package's reader write, on the real
SmolLM2 file and the Qwen2.5-Coder draft; the header reader against the `gguf` package on a file of many value and
tensor types; and a file that is no GGUF, is cut short or holds another architecture refused with one line."""
import filecmp
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from specviz.models.chunked import CHUNKED, assemble, available
from specviz.cpu import file_model, gguf_metadata
from specviz.models.load import resolve


def smollm2_file() -> Path:
    location, name = resolve("smollm2-135m")
    return Path(location) / name


def read_as_before(path: Path, into: Path) -> None:
    """The file's config, tokenizer and table as transformers and the gguf package read them, each call parsing the
    whole file: what the header read must give."""
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(into)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(into)
    (into / file_model.TABLE).write_text(json.dumps(table_of(gguf.GGUFReader(str(path)))))


def table_of(reader: gguf.GGUFReader) -> dict:
    return {t.name: {"type": int(t.tensor_type), "shape": list(t.data.shape), "dtype": str(t.data.dtype),
                     "offset": int(t.data_offset), "bytes": int(t.n_bytes)} for t in reader.tensors}


def assert_same_files(path: Path, tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    kept = file_model.read_metadata(path)
    before = tmp_path / "before"
    read_as_before(path, before)
    names = sorted(p.name for p in before.iterdir())
    assert sorted(p.name for p in kept.iterdir()) == names
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", file_model.TABLE} <= set(names)
    for name in names:
        assert filecmp.cmp(kept / name, before / name, shallow=False), name
    return kept


@pytest.mark.slow
def test_the_smollm2_file_gives_the_config_tokenizer_and_table_transformers_and_gguf_give(tmp_path, monkeypatch):
    kept = assert_same_files(smollm2_file(), tmp_path, monkeypatch)
    config, tokenizer = file_model.config_and_tokenizer(smollm2_file())
    assert config.model_type == "llama" and config.tie_word_embeddings and tokenizer("def fib(n):").input_ids
    assert json.loads((kept / file_model.TABLE).read_text())["blk.0.attn_q.weight"]["dtype"] == "uint8"


@pytest.mark.slow
def test_the_qwen_coder_draft_gives_the_config_tokenizer_and_table_transformers_and_gguf_give(tmp_path, monkeypatch):
    draft = CHUNKED["qwen2.5-coder-0.5b"]
    if not available(draft):
        pytest.skip("the qwen-coder parts are not installed (scripts/setup.sh installs them)")
    path = assemble(draft)                      # the joined file in the user cache, before this test moves the cache
    kept = assert_same_files(path, tmp_path, monkeypatch)
    config, tokenizer = file_model.config_and_tokenizer(path)
    assert config.model_type == "qwen2" and not config.tie_word_embeddings
    assert type(tokenizer).__name__ == "Qwen2Tokenizer" and (kept / "chat_template.jinja").is_file()


def many_types_file(path: Path, architecture: str = "llama") -> Path:
    """A small GGUF file of every metadata value type and several tensor types."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float64("test.f64", 0.1)
    writer.add_int8("test.i8", -3)
    writer.add_uint16("test.u16", 60000)
    writer.add_int64("test.i64", -2**40)
    writer.add_bool("test.bool", True)
    writer.add_string("general.name", "tiny ünïcode")
    writer.add_token_list(["a", "b", "ab", "<|end|>"])
    writer.add_token_types([1, 1, 1, 3])
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((4, 64), dtype=np.float16))
    for name, kind in (("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q8_0),
                       ("token_embd.weight", gguf.GGMLQuantizationType.Q4_K)):
        rows, columns = 8, 256
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        raw = np.zeros((rows, columns // block * block_bytes), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=kind)                  # rows of blocks, as bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_header_reader_reads_what_the_gguf_package_reads(tmp_path):
    path = many_types_file(tmp_path / "tiny.gguf")
    header = gguf_metadata.read_header(path)
    reader = gguf.GGUFReader(str(path))
    assert header.tensors == table_of(reader)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):                  # the reader's own entries for the file's header
            continue
        value = field.contents()
        if isinstance(value, list) and value and isinstance(value[0], str):
            value = len(value)                       # string arrays are counted, not decoded
        assert header.metadata[key] == pytest.approx(value), key
    assert header.metadata["general.name"] == "tiny ünïcode" and header.metadata["test.bool"] is True


def test_a_file_that_is_no_gguf_or_cut_short_or_another_architecture_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello, these are notes\n")
    whole = many_types_file(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])
    other = many_types_file(tmp_path / "other.gguf", architecture="phi3")
    old = tmp_path / "old.gguf"
    old.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + whole[8:])
    for path, says in ((not_gguf, "notes.gguf is not a GGUF file"), (cut, "cut.gguf: its GGUF header is cut short"),
                       (other, "other.gguf is a phi3 model; the gguf precision reads llama, qwen2 files"),
                       (old, "old.gguf: GGUF version 1; this reader reads versions 2 and 3")):
        with pytest.raises(file_model.FileModelError) as refused:
            file_model.read_metadata(path)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert not (tmp_path / "cache" / "gguf_meta").exists() or not any((tmp_path / "cache" / "gguf_meta").iterdir())


def test_prepare_names_a_file_it_cannot_read_in_one_line(tmp_path, monkeypatch, capsys):
    from specviz.models import chunked
    from specviz import prepare
    from specviz.cpu import kernels

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "qwen-cut.gguf"
    cut.write_bytes(many_types_file(tmp_path / "whole.gguf").read_bytes()[:300])
    monkeypatch.setattr(chunked, "main", lambda: 0)                         # joined already
    monkeypatch.setattr(kernels, "status", lambda: "specviz kernels: as built")
    monkeypatch.setattr(prepare, "offline_presets", lambda: ["qwen-coder"])
    monkeypatch.setattr(prepare, "gguf_files", lambda name: [cut])
    assert prepare.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: qwen-cut.gguf: its GGUF header is cut short") and err.count("\n") == 1
