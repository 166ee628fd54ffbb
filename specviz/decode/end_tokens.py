"""The tokens that end a text: every one that a model's configs, its GGUF file and its tokenizer name, as one set.

A model may name one end token in one place and end its text with another. Qwen2.5-Coder-Instruct's GGUF file names
`<|im_end|>` as its eos, and the model also ends code with `<|endoftext|>`, which HF's generation config lists beside
it: a decoder that stopped at the file's eos alone wrote on past the answer (`doctest.testmod()<|endoftext|>
<|fim_prefix|>#`). So a text ends at any token of the union of:
- the generation config's and the model config's `eos_token_id` (an id or a list of ids);
- a GGUF file's `eos`, `eot` and `eom` token ids;
- the tokenizer's eos, and its special tokens whose text ends a text or a turn (END_MARKERS, the names llama.cpp
  also takes for an end of generation).
`load_model` writes the set into the model's generation config (`mark`), so transformers' `generate()` (the race's
HF lane) stops where our decoders stop; the engine, the CLI and the app read it through `of`.

Special tokens are never shown as text in the app: `visible` writes `<|im_start|>` as `⟨im_start⟩`.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

END_MARKERS = frozenset({"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
                         "<|return|>", "<end_of_turn>", "<|EOT|>", "<EOT>", "<end_of_utterance>"})
GGUF_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
SPECIAL = re.compile(r"<\|([^<>|\s]{1,40})\|>")


def ids_of(value) -> set[int]:
    """An `eos_token_id` as a set: None, one id, or a list of ids."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, (list, tuple, set, frozenset)):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


def tokenizer_ids(tokenizer) -> set[int]:
    """The tokenizer's eos and its special tokens whose text ends a text or a turn."""
    if tokenizer is None:
        return set()
    ids = ids_of(getattr(tokenizer, "eos_token_id", None))
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids |= {int(i) for i, token in added.items()
            if getattr(token, "special", True) and str(getattr(token, "content", token)) in END_MARKERS}
    return ids


def of(model, tokenizer=None) -> frozenset[int]:
    """Every token at which this model's text ends (`mark` has added its GGUF file's ids to the generation config)."""
    ids = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        ids |= ids_of(getattr(source, "eos_token_id", None))
    return frozenset(ids | tokenizer_ids(tokenizer))


def mark(model, tokenizer=None, gguf: Path | None = None) -> frozenset[int]:
    """Write the whole set into the model's generation config, where `generate()` and `of` read it."""
    ids = of(model, tokenizer) | (gguf_ids(gguf) if gguf is not None else set())
    config = getattr(model, "generation_config", None)
    if config is not None and ids:
        config.eos_token_id = sorted(ids)
    return frozenset(ids)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_ids(path: Path) -> set[int]:
    """The end token ids a GGUF file's header names (GGUF_KEYS), read from its key-value section alone (a fraction of
    a second: the 152k-token vocabulary is skipped, not parsed)."""
    found = set()
    try:
        with open(path, "rb") as file:
            magic, _version, _tensors, count = struct.unpack("<4sIQQ", file.read(24))
            if magic != b"GGUF":
                return found
            for _ in range(count):
                key = _string(file)
                kind, = struct.unpack("<I", file.read(4))
                value = _value(file, kind)
                if key in GGUF_KEYS and isinstance(value, int):
                    found.add(value)
    except (OSError, struct.error, KeyError, UnicodeDecodeError):
        return found            # an unreadable header names nothing; the configs and tokenizer still do
    return found


def _string(file) -> str:
    size, = struct.unpack("<Q", file.read(8))
    return file.read(size).decode("utf-8")


def _value(file, kind: int):
    if kind == _STRING:
        return _string(file)
    if kind == _ARRAY:
        inner, count = struct.unpack("<IQ", file.read(12))
        if inner == _STRING:
            for _ in range(count):
                size, = struct.unpack("<Q", file.read(8))
                file.seek(size, 1)
        else:
            file.seek(count * struct.calcsize(_SCALARS[inner]), 1)
        return None
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]


# -- the app's text views --------------------------------------------------------------------------

def visible(text: str) -> str:
    """A token's text as the page shows it: special tokens by name, never as `<|...|>` text."""
    return SPECIAL.sub(lambda m: f"⟨{m.group(1)}⟩", text)


def is_marker(text: str) -> bool:
    """Whether a token's text is one of the names that end a text (a recording made before its end tokens were
    stored says which tokens ended it only through their texts)."""
    return text in END_MARKERS
