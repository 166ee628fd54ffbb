"""Loading target and draft models (hub ids, local directories, GGUF files) in a precision
(specviz/models/precision.py), checking that a pair shares its tokenizer, and compiling a model for static caches.

A GGUF file runs as the file stores it (`gguf`: its own blocks, specviz/cpu/file_model.py), which `auto` takes on a CPU;
`int4` and `int8` re-quantise its weights in memory (lossier, and named so). Its float precisions go through
transformers, which de-quantises it into a copy made on first use and kept in the user cache (6 GB for a 1.5B)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..decode import end_tokens
from ..cpu import file_model
from ..backends.choose import parameter_bytes
from ..cpu.blocks import GGUF
from ..cpu.int4 import INT4, quantized_precision
from ..cpu.matmul import install
from . import block_paths
from .locations import ModelLoadError, hub_reachable, lacks_tokenizer, read_output_vocab, resolve
from .. import cache_dir
from ..profile.store import Profile
from .precision import (AUTO_DTYPE, DTYPES, PRECISIONS, QUANTIZED, auto_precision_of, check_dtype, quantize_in_place,
                        runs_file_blocks)


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object | None        # None: a draft that uses its target's tokenizer
    output_vocab: torch.Tensor | None = None    # token ids a draft predicts over (None: all)
    # the precision it computes in, as a name (`float32`, `bfloat16`, `int4`, `int8`, ...): named once, as a stack
    # names its precisions at every visitor's Step (a model quantized in place is named again by _quantized)
    dtype: str = field(init=False)
    # its name without folders (a file's or a folder's name, a hub id's last part): stored measurements' key
    short_name: str = field(init=False)

    def __post_init__(self) -> None:
        self.dtype = quantized_precision(self.model) or str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.short_name = Path(self.name).name or self.name

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights held in memory (what a server's model budget counts)."""
        return parameter_bytes(self.model)


def _converted_copy(location: str, gguf_file: str, dtype: str) -> Path:
    """Where the de-quantised copy of a GGUF file is kept, in the dtype it is used in (a 1.5B model
    de-quantises in minutes; its bf16 copy then loads in seconds)."""
    stat = (Path(location) / gguf_file).stat()
    return cache_dir() / "converted" / f"{Path(gguf_file).stem}-{stat.st_size}-{dtype}"


def converted_copy(location: str, gguf_file: str, dtype: str) -> Path:
    """The de-quantised copy of a GGUF file in `dtype` (float32, float16 or bfloat16), made on first use, when that
    precision is asked for (setup makes none: the defaults run the file's own blocks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _converted_copy(location, gguf_file, dtype)
    if not (converted / "config.json").is_file():
        size = Path(location, gguf_file).stat().st_size
        print(f"[specviz] de-quantising {gguf_file} to {dtype} (first use of this precision; about "
              f"{size * 7 / 2**30 * DTYPES[dtype].itemsize / 4:.1f} GB into {converted.parent})",
              file=sys.stderr, flush=True)
        tokenizer = AutoTokenizer.from_pretrained(location, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(location, gguf_file=gguf_file, dtype=torch.float32)
        _save_atomically(model.to(DTYPES[dtype]), tokenizer, converted)
        del model
    return converted


def load_model(spec: str, dtype: str = "float32", device: str = "cpu", draft: bool = False,
               profile: Profile | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer in one pass: the spec resolved to its files once, the precision chosen, the
    model loaded in it. Raises ModelLoadError with a one-line message on failure. A draft (`draft`) in int4 takes
    groups of 64 weights (int4.WIDE_GROUP). Its generation config then lists every token that ends its text
    (specviz/decode/end_tokens.py). profile: where `auto` reads this machine's measurements (None: the default
    file's)."""
    check_dtype(dtype)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no CUDA device is available; use --device cpu")
    location, gguf_file = resolve(spec)
    gguf = Path(location) / gguf_file if gguf_file else None
    profile = profile or Profile()
    dtype = auto_precision_of(gguf is not None, device, profile) if dtype == AUTO_DTYPE else dtype
    if dtype in (GGUF, *QUANTIZED) and device != "cpu":
        raise ModelLoadError(f"{dtype} is a CPU precision; on a GPU use bfloat16 or float16")
    if dtype == GGUF or (dtype in QUANTIZED and gguf is not None and runs_file_blocks()):
        loaded = _file_model(spec, gguf)     # the file's blocks; int4 and int8 re-quantise them in memory
        loaded = loaded if dtype == GGUF else _quantized(file_model.requantizable(loaded), dtype, draft)
    elif dtype in QUANTIZED:               # de-quantised in float32, then its linear layers packed in 4 or 8 bits
        loaded = _quantized(_float_model(spec, location, gguf_file, "float32", device), dtype, draft)
    else:
        loaded = _float_model(spec, location, gguf_file, dtype, device)
    install(loaded.model)       # the engine's products for a few rows, where they apply (float32 on a CPU)
    end_tokens.mark(loaded.model, loaded.tokenizer, gguf)
    if dtype == GGUF:
        block_paths.take_up(profile, loaded.short_name, loaded.model)
    return loaded


def _float_model(spec: str, location: str, gguf_file: str | None, dtype: str, device: str) -> LoadedModel:
    """transformers' model of the files in a float precision (a GGUF file through its de-quantised copy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        if gguf_file is not None:
            location = str(converted_copy(location, gguf_file, dtype))
        local = Path(location).is_dir() or not hub_reachable()
        tokenizer = (None if lacks_tokenizer(location)
                     else AutoTokenizer.from_pretrained(location, local_files_only=local))
        model = AutoModelForCausalLM.from_pretrained(location, dtype=DTYPES[dtype], local_files_only=local)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many types; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not load model {spec!r}: {first}") from exc
    # As from_pretrained leaves it (parameters keep requires_grad): the engine runs under inference_mode,
    # and requires_grad_(False) made transformers' generate() 1.6x slower in bf16 (a slower linear path).
    model.to(device).eval()
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, output_vocab=read_output_vocab(location))


def _file_model(spec: str, gguf: Path | None) -> LoadedModel:
    """A GGUF file's own model (specviz/cpu/file_model.py)."""
    if gguf is None:
        raise ModelLoadError(f"{spec!r} is not a GGUF file: the gguf precision runs a GGUF file's own blocks "
                             f"(choose another --dtype: {', '.join(p for p in PRECISIONS if p != GGUF)})")
    if not runs_file_blocks():
        raise ModelLoadError("the gguf precision needs specviz's kernels, which did not build here (a C compiler is "
                             "needed); choose --dtype float32")
    try:
        model, tokenizer = file_model.load(gguf)
    except file_model.FileModelError as exc:
        raise ModelLoadError(str(exc)) from exc
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, output_vocab=read_output_vocab(str(gguf.parent)))


def _quantized(loaded: LoadedModel, precision: str = INT4, draft: bool = False) -> LoadedModel:
    """The model with its linear layers in 4 or 8 bits, attending one token at a time (so that verifying a
    token computes what plain decoding computes, bit for bit: specviz/cpu/row_attention.py). A draft that
    predicts a subset of tokens keeps its output layer as it is (the engine reads that layer's rows
    for those tokens only)."""
    keep = () if loaded.output_vocab is None else (loaded.model.get_output_embeddings(),)
    quantize_in_place(loaded.model, precision, keep, draft)
    return replace(loaded)


def _save_atomically(model, tokenizer, target: Path) -> None:
    from safetensors.torch import save_model

    # save_pretrained refuses GGUF-quantised models, so write the de-quantised weights directly
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race; its copy is as good as ours
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def check_tokenizers_match(target: LoadedModel, draft: LoadedModel) -> None:
    """Speculation compares token ids, so both models must share one vocabulary. A draft shipped
    without a tokenizer declares it uses the target's; then only the vocabulary sizes can differ."""
    target_name, draft_name = target.name, draft.name
    if draft.tokenizer is None:
        if draft.model.config.vocab_size != target.model.config.vocab_size:
            raise ModelLoadError(f"{draft_name!r} has no tokenizer and a vocabulary of {draft.model.config.vocab_size} "
                                 f"tokens, but {target_name!r} has {target.model.config.vocab_size}")
        return
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ModelLoadError(f"{draft_name!r} and {target_name!r} use different tokenizers; "
                             "speculation needs a draft that shares the target's vocabulary")


def compile_model(model: torch.nn.Module):
    """torch.compile the model for decoding: CUDA graphs on a GPU ("reduce-overhead"), inductor's
    fused kernels on a CPU. Shapes stay fixed because the engine pads feeds to a few bucket sizes
    over a static KV cache (`kv_static.StaticKV`); on a GPU each bucket and cache length compiles once (a
    graph per shape). On a CPU, where compiling is the test suite's and no user's fast path, a second
    shape makes torch recompile it once with sizes as variables: 2 compilations instead of 7 (cold, the
    replay test's compiled projection took 49 s instead of 125)."""
    import torch._dynamo
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    cuda = next(model.parameters()).device.type == "cuda"
    return torch.compile(model, mode="reduce-overhead" if cuda else None, dynamic=False if cuda else None)
