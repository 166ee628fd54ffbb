"""Loading target and draft models (hub ids, local directories, GGUF files), and `auto`'s precision probe.

A GGUF file runs as the file stores it (`gguf`: its own blocks, specviz/cpu/file_model.py), which `auto` takes on a CPU;
`int4` and `int8` re-quantise its weights in memory (lossier, and named so). Its float precisions go through
transformers, which de-quantises it into a copy made on first use and kept in the user cache (6 GB for a 1.5B)."""
from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from . import auto_choice, end_tokens
from .cpu import file_model
from .cache import parameter_bytes
from .cost_curve import cost_curve
from .cpu.shared_input import stack_siblings
from .cpu.blocks import GGUF
from .cpu.int4 import INT4, WIDE_GROUP, Int4Linear, quantize_model, quantized_precision
from .cpu.int8 import INT8, Int8Linear
from .locations import ModelLoadError, hub_reachable, lacks_tokenizer, read_output_vocab, resolve
from .paths import cache_dir
from .cpu.row_attention import use_row_attention

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
AUTO_DTYPE = "auto"
BFLOAT16 = "bfloat16"
QUANTIZED = {INT4: Int4Linear, INT8: Int8Linear}   # CPU precisions: their linear layers (specviz/cpu/int4.py, int8.py)
PRECISIONS = [AUTO_DTYPE, GGUF, *DTYPES, *QUANTIZED]     # what --dtype accepts
NAMES = {GGUF: "gguf (the file's own blocks)", INT4: "int4 (re-quantised)", INT8: "int8 (re-quantised)"}
PRECISION_HELP = ("auto (default): a GGUF file's own blocks (gguf) on a CPU where specviz's kernels build; "
                  "other models in the precision a probe measured fastest here (float32, bfloat16, int4 or int8), "
                  "bfloat16 on a GPU. gguf: the file's own quantized blocks, computed as llama.cpp computes them; "
                  "float32: the file de-quantised (its exact weights; the copy is made on first use); int4/int8: "
                  "re-quantised in 4 or 8 bits (lossier; CPU)")


def precision_name(dtype: str) -> str:
    """A precision as the CLI, the app and the bench write it: int4 and int8 say they re-quantise the file."""
    return NAMES.get(dtype, dtype)


def check_dtype(dtype: str) -> None:
    if dtype not in PRECISIONS:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(PRECISIONS)}")


def cpu_precisions() -> tuple[str, ...]:
    """What a CPU can run any model in here: float32, bfloat16, int4, and int8 where the rows kernel runs."""
    from .cpu import kernels
    return ("float32", BFLOAT16, INT4) + ((INT8,) if kernels.rows_available() else ())


def runs_file_blocks() -> bool:
    """Whether this machine multiplies a GGUF file's own blocks (specviz's kernels built)."""
    from .cpu import kernels
    return kernels.available()


def is_gguf(spec: str) -> bool:
    """Whether a model spec names a GGUF file here (the offline models do, a hub id does not)."""
    try:
        return resolve(spec)[1] is not None
    except ModelLoadError:
        return False


def auto_precision(spec: str, device: str = "cpu") -> str:
    """`auto` for one model: on a CPU a GGUF file runs its own blocks (`gguf`: the file's model, and the fastest exact
    one: a float32 copy reads seven times the bytes); other models take resolve_dtype's pick."""
    return _auto_precision(is_gguf(spec), device)


def _auto_precision(gguf: bool, device: str) -> str:
    return GGUF if device == "cpu" and gguf and runs_file_blocks() else resolve_dtype(AUTO_DTYPE, device)


def draft_precisions(spec: str, target_dtype: str) -> list[str]:
    """The precisions `auto` times a draft in: a GGUF draft in its own blocks and re-quantised in memory (no float copy
    of it is made unless asked for); another in the target's precision and every precision this CPU runs."""
    if is_gguf(spec) and runs_file_blocks():
        return [GGUF, INT4] + ([INT8] if INT8 in cpu_precisions() else [])
    return [p for p in dict.fromkeys([target_dtype, *cpu_precisions()]) if p != GGUF]


@functools.lru_cache(maxsize=None)
def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """`auto`: bfloat16 on a GPU that supports it; on a CPU, the precision in which the probe layer (one decoder
    layer of a 1.5B model) reads one token fastest, as plain decoding does: float32 unless another is at least
    10% faster, and a later one in cpu_precisions() only where it is 10% faster than the pick so far (int4 and int8
    read a token within a few percent of each other here). The probe is measured once per machine and stored
    (specviz/auto_choice.py), so a busy machine never changes the pick; where this machine's profile has no probe,
    float32, the stated default (exact on every CPU). Other names pass through. Plain decoding
    is the reference's regime: on our 2-core CPUs verifying many tokens costs several times one (the cost curves),
    so the fastest lossless run is one whose single-token forward is fastest, with few, cheap guesses on top."""
    if dtype != AUTO_DTYPE:
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    seconds, best = auto_probe(), STATED_PRECISION
    if seconds is None:
        return best
    for name in cpu_precisions():       # each must beat the pick so far by 10%: close timings must not flip it
        if seconds[name] < 0.9 * seconds[best]:
            best = name
    return best


STATED_PRECISION = "float32"      # `auto` on a CPU whose profile has no probe


def auto_probe() -> dict[str, float] | None:
    """The probe layer's seconds for one token, per precision this CPU can run; None where the profile lacks one."""
    curves = {name: probe_seconds(name) for name in cpu_precisions()}
    return None if None in curves.values() else {name: curve[1] for name, curve in curves.items()}


def auto_reason(device: str = "cpu", spec: str | None = None) -> str:
    """Why `auto` picked what it picked here for the target `spec`, with the measurement and where it is kept (shown
    where the precision is shown)."""
    if device.startswith("cuda"):
        return f"auto: {resolve_dtype(AUTO_DTYPE, device)} on a GPU"
    if spec is not None and auto_precision(spec, device) == GGUF:
        return ("auto picked gguf: the GGUF file's own blocks, multiplied by specviz's kernels as llama.cpp rounds "
                "them (the file's model, and the fastest exact one here)")
    probe = auto_probe()
    if probe is None:
        return (f"auto picked {STATED_PRECISION}, the stated default: this machine's profile has no probe timings "
                "(python -m specviz.prepare measures them)")
    timings = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in sorted(probe.items(), key=lambda x: x[1]))
    return (f"auto picked {resolve_dtype(AUTO_DTYPE)}, the fastest here: a Qwen2-1.5B-shaped layer read one token "
            f"in {timings} ({auto_choice.source(_probe_key(resolve_dtype(AUTO_DTYPE)))})")


PROBE_FEEDS = (1, 2, 4, 8, 16)    # tokens fed: decoding one, verifying a few


@functools.lru_cache(maxsize=None)
def probe_seconds(dtype: str) -> dict[int, float] | None:
    """The probe layer's seconds fed 1, 2, 4, 8 and 16 tokens in `dtype` on this CPU, as this machine's profile holds
    them (specviz/auto_choice.py; None where it does not): its cost curve, which the app's regime panel draws next to
    llama.cpp's."""
    def measure() -> dict[str, float]:
        with _PROBE_LOCK:    # one probe at a time: threads would slow each other's timings
            return {str(n): seconds for n, seconds in _probe_layer(dtype).items()}
    curve = auto_choice.decided(_probe_key(dtype), measure)
    return None if curve is None else {int(n): seconds for n, seconds in curve.items()}


def _probe_key(dtype: str) -> str:
    return f"probe layer in {dtype}"


_PROBE_LOCK = threading.Lock()
PROBE_LAYERS_PER_1_5B = 33      # a Qwen2-1.5B holds 33 times the probe layer's weights (28 layers + its output matrix)


def _probe_layer(dtype: str, feeds=PROBE_FEEDS, repeats: int = 7) -> dict[int, float]:
    """Seconds for one Qwen2-1.5B-shaped decoder layer (random weights) in precision `dtype` to read a 128-token
    prefix's cache and each of `feeds` new tokens, fastest of `repeats` each (the cost curve's timing)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=256, hidden_size=1536, intermediate_size=8960, num_hidden_layers=1,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()      # parameters keep requires_grad, as loaded
    if dtype == GGUF:
        model = file_model.random_blocks(model)
    else:
        model = quantize_in_place(model, dtype) if dtype in QUANTIZED else model.to(DTYPES[dtype])
    return cost_curve(model, sizes=feeds, context=128, reps=repeats)


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object | None        # None: a draft that uses its target's tokenizer
    output_vocab: torch.Tensor | None = None    # token ids a draft predicts over (None: all)

    @property
    def dtype(self) -> str:
        """The precision it computes in, as a name (`float32`, `bfloat16`, `int4`, `int8`, ...)."""
        return quantized_precision(self.model) or str(next(self.model.parameters()).dtype).removeprefix("torch.")

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


def load_model(spec: str, dtype: str = "float32", device: str = "cpu", draft: bool = False) -> LoadedModel:
    """Load a causal LM and its tokenizer in one pass: the spec resolved to its files once, the precision chosen, the
    model loaded in it. Raises ModelLoadError with a one-line message on failure. A draft (`draft`) in int4 takes
    groups of 64 weights (int4.WIDE_GROUP). Its generation config then lists every token that ends its text
    (specviz/end_tokens.py)."""
    check_dtype(dtype)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was asked for but no CUDA device is available; use --device cpu")
    location, gguf_file = resolve(spec)
    gguf = Path(location) / gguf_file if gguf_file else None
    dtype = _auto_precision(gguf is not None, device) if dtype == AUTO_DTYPE else dtype
    if dtype in (GGUF, *QUANTIZED) and device != "cpu":
        raise ModelLoadError(f"{dtype} is a CPU precision; on a GPU use bfloat16 or float16")
    if dtype == GGUF or (dtype in QUANTIZED and gguf is not None and runs_file_blocks()):
        loaded = _file_model(spec, gguf)     # the file's blocks; int4 and int8 re-quantise them in memory
        loaded = loaded if dtype == GGUF else _quantized(file_model.requantizable(loaded), dtype, draft)
    elif dtype in QUANTIZED:               # de-quantised in float32, then its linear layers packed in 4 or 8 bits
        loaded = _quantized(_float_model(spec, location, gguf_file, "float32", device), dtype, draft)
    else:
        loaded = _float_model(spec, location, gguf_file, dtype, device)
    end_tokens.mark(loaded.model, loaded.tokenizer, gguf)
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
    return loaded


def quantize_in_place(model: torch.nn.Module, precision: str, keep: tuple = (), draft: bool = False) -> torch.nn.Module:
    """The model's linear layers (but `keep`) in 4 or 8 bits, each token attending alone (row_attention); a draft's
    4-bit groups 64 wide (int4.WIDE_GROUP: a tenth less to read, the same acceptance)."""
    use_row_attention(model)
    layer = functools.partial(Int4Linear, group=WIDE_GROUP) if draft and precision == INT4 else QUANTIZED[precision]
    quantize_model(model, keep, layer=layer, precision=precision)
    stack_siblings(model)           # q/k/v and gate/up in one product each (int4 on specviz's kernel)
    return model


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
