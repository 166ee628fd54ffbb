"""A GGUF file's config, tokenizer and table of tensors, from one walk over its header.

The `gguf` package's reader builds a Python object for every string of the header, which for a 152k-token vocabulary
and its 151k merges takes 9-13 s on 2 cores, and transformers' `AutoConfig` and `AutoTokenizer` each run that reader
once more on a llama or qwen2 file. Here the header is walked once with `struct` (strings skipped, not decoded: a
fraction of a second), and transformers is handed the results:

- the config: the dict transformers' GGUF reader (`load_gguf_checkpoint`) builds for a llama or qwen2 file, from
  transformers' own table of keys (`GGUF_CONFIG_MAPPING`), made into a config as `AutoConfig` makes it;
- the tokenizer: the class `AutoTokenizer` picks for that config, which reads the vocabulary and merges with
  transformers' fast GGUF reader;
- the table of tensors: each tensor's type, shape, dtype, offset and size, as the `gguf` package gives them.

tests/test_gguf_metadata.py holds all three to what the three calls above give, on the real SmolLM2 file.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# a metadata value of a fixed size: its struct format (type ids from the GGUF specification)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32                   # where the file names none (the specification's default)
# tensors stored as plain values, and the numpy dtype of each (the rest are blocks, mapped as bytes)
VALUE_TYPES = {0: "float32", 1: "float16", 24: "int8", 25: "int16", 26: "int32", 27: "int64", 28: "float64"}


class HeaderError(ValueError):
    """A file whose header cannot be read; the message is one line."""


@dataclass(frozen=True)
class Header:
    """A GGUF file's metadata (numbers, strings and number arrays as values; an array of strings, such as the
    vocabulary, as its length) and its table of tensors (name -> type, shape, dtype, offset in the file, bytes)."""
    metadata: dict
    tensors: dict[str, dict]

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "")


def read_header(path: Path) -> Header:
    """The file's header, read without touching its tensors."""
    with open(path, "rb") as file:
        if file.read(4) != b"GGUF":
            raise HeaderError(f"{path.name} is not a GGUF file (it does not begin with 'GGUF')")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            try:
                return _parse(view)
            except HeaderError as exc:
                raise HeaderError(f"{path.name}: {exc}") from None
            except (struct.error, UnicodeDecodeError, ValueError) as exc:
                raise HeaderError(f"{path.name}: its GGUF header is cut short or damaged ({exc})") from None


def _parse(view) -> Header:
    version, tensor_count, key_count = struct.unpack_from("<IQQ", view, 4)
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version}; this reader reads versions 2 and 3 (little-endian)")
    at = 24
    metadata = {}
    for _ in range(key_count):
        key, at = _string(view, at)
        (kind,), at = struct.unpack_from("<I", view, at), at + 4
        metadata[key], at = _value(view, at, kind)
    entries = []
    for _ in range(tensor_count):
        tensor, at = _string(view, at)
        (dims,), at = struct.unpack_from("<I", view, at), at + 4
        shape, at = struct.unpack_from(f"<{dims}Q", view, at), at + 8 * dims
        (kind, offset), at = struct.unpack_from("<IQ", view, at), at + 12
        entries.append((tensor, kind, tuple(reversed(shape)), offset))     # the file lists the fastest dimension first
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_start = -(-at // alignment) * alignment
    return Header(metadata, {tensor: _tensor(kind, shape, data_start + offset)
                             for tensor, kind, shape, offset in entries})


def _string(view, at: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", view, at)
    return view[at + 8:at + 8 + length].decode("utf-8"), at + 8 + length


def _value(view, at: int, kind: int):
    """One metadata value and where the next begins; an array of strings is skipped and counted, not decoded."""
    if kind in SCALARS:
        return struct.unpack_from(f"<{SCALARS[kind]}", view, at)[0], at + struct.calcsize(f"<{SCALARS[kind]}")
    if kind == STRING:
        return _string(view, at)
    if kind != ARRAY:
        raise HeaderError(f"a metadata value of unknown type {kind}")
    item, count = struct.unpack_from("<IQ", view, at)
    at += 12
    if item in SCALARS:
        width = struct.calcsize(f"<{SCALARS[item]}")
        return list(struct.unpack_from(f"<{count}{SCALARS[item]}", view, at)), at + count * width
    if item != STRING:
        raise HeaderError(f"an array of metadata values of type {item}, which this reader does not read")
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", view, at)
        at += 8 + length
    return count, at


def _tensor(kind: int, shape: tuple[int, ...], offset: int) -> dict:
    """A tensor's entry as the `gguf` package describes its data: plain values in their dtype and shape, blocks as
    bytes, each row its blocks' bytes."""
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
    elements = 1
    for size in shape:
        elements *= size
    if kind in VALUE_TYPES:
        dtype, data_shape = VALUE_TYPES[kind], shape
    else:
        dtype, data_shape = "uint8", (*shape[:-1], shape[-1] // block * block_bytes)
    return {"type": kind, "shape": list(data_shape), "dtype": dtype, "offset": offset,
            "bytes": elements * block_bytes // block}


# -- what transformers makes of it -------------------------------------------------------------------

def config_of(header: Header):
    """The transformers config of a llama or qwen2 file: the dict transformers' own GGUF reader builds (every key its
    table `GGUF_CONFIG_MAPPING` renames, one-element arrays as their element, the output layer tied where the file has
    none, the vocabulary's length where no key gives it), made into a config as `AutoConfig.from_pretrained` does.
    Other architectures take other steps there (renames, defaults, values found in the tensors): refused here."""
    from transformers import CONFIG_MAPPING
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    architecture = header.architecture
    if architecture not in ("llama", "qwen2"):
        raise HeaderError(f"its architecture is {architecture or 'not named'}")
    config = {"tie_word_embeddings": "output.weight" not in header.tensors}
    for key, value in header.metadata.items():
        prefix, _, name = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(name)
        if renamed is not None and renamed != -1:
            config[renamed] = value[0] if isinstance(value, list) and len(value) == 1 else value
    if architecture == "llama" and config.get("_model_name_or_path") == "mistral":
        config["model_type"] = "mistral"            # as transformers' reader names such a file (and only such a one)
    config.setdefault("vocab_size", header.metadata.get("tokenizer.ggml.tokens"))
    return CONFIG_MAPPING[config["model_type"]].from_dict(config)


def tokenizer_of(path: Path, config):
    """The file's tokenizer: the class `AutoTokenizer` picks for a config with no tokenizer files beside it (a
    registered one for the model type, else the plain `tokenizers` backend), reading the file's vocabulary itself."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    tokenizer_class = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    return tokenizer_class.from_pretrained(str(path.parent), gguf_file=path.name, _from_auto=True)
