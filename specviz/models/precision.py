"""Precisions: their names and what `--dtype` accepts, the one `auto` picks from this machine's profile, the probe
layer whose timings decide it (timed by `python -m specviz.prepare` alone), and quantizing a model in place."""
from __future__ import annotations

import functools
import threading

import torch

from ..profile.store import Profile
from ..profile.cost_curve import cost_curve
from ..cpu import file_model
from ..cpu.blocks import GGUF
from ..cpu.int4 import INT4, WIDE_GROUP, Int4Linear, quantize_model
from ..cpu.int8 import INT8, Int8Linear
from ..cpu.matmul import install
from ..cpu.row_attention import use_row_attention
from ..cpu.shared_input import stack_siblings
from .locations import ModelLoadError, resolve

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


def precisions_named(target: str, drafts: set[str]) -> str:
    """A stack's precisions, e.g. `gguf (the file's own blocks)`, or `gguf (...) target, int4 (re-quantised) draft`
    where its draft models compute in others."""
    others = sorted(drafts - {target})
    if not others:
        return precision_name(target)
    return f"{precision_name(target)} target, {', '.join(map(precision_name, others))} draft"


def check_dtype(dtype: str) -> None:
    if dtype not in PRECISIONS:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(PRECISIONS)}")


def cpu_precisions() -> tuple[str, ...]:
    """What a CPU can run any model in here: float32, bfloat16, int4, and int8 where the rows kernel runs."""
    from ..cpu import kernels
    return ("float32", BFLOAT16, INT4) + ((INT8,) if kernels.rows_available() else ())


def runs_file_blocks() -> bool:
    """Whether this machine multiplies a GGUF file's own blocks (specviz's kernels built)."""
    from ..cpu import kernels
    return kernels.available()


def is_gguf(spec: str) -> bool:
    """Whether a model spec names a GGUF file here (the offline models do, a hub id does not)."""
    try:
        return resolve(spec)[1] is not None
    except ModelLoadError:
        return False


def auto_precision(spec: str, profile: Profile, device: str = "cpu") -> str:
    """`auto` for one model: on a CPU a GGUF file runs its own blocks (`gguf`: the file's model, and the fastest exact
    one: a float32 copy reads seven times the bytes); other models take resolve_dtype's pick."""
    return auto_precision_of(is_gguf(spec), device, profile)


def auto_precision_of(gguf: bool, device: str, profile: Profile) -> str:
    """`auto` for a model that is (or is not) a GGUF file, on this device."""
    return GGUF if device == "cpu" and gguf and runs_file_blocks() else resolve_dtype(AUTO_DTYPE, profile, device)


def draft_precisions(spec: str, target_dtype: str) -> list[str]:
    """The precisions `auto` times a draft in: a GGUF draft in its own blocks and re-quantised in memory (no float copy
    of it is made unless asked for); another in the target's precision and every precision this CPU runs."""
    if is_gguf(spec) and runs_file_blocks():
        return [GGUF, INT4] + ([INT8] if INT8 in cpu_precisions() else [])
    return [p for p in dict.fromkeys([target_dtype, *cpu_precisions()]) if p != GGUF]


def resolve_dtype(dtype: str, profile: Profile, device: str = "cpu") -> str:
    """`auto`: bfloat16 on a GPU that supports it; on a CPU, the precision in which the probe layer (one decoder
    layer of a 1.5B model) reads one token fastest, as plain decoding does: float32 unless another is at least
    10% faster, and a later one in cpu_precisions() only where it is 10% faster than the pick so far (int4 and int8
    read a token within a few percent of each other here). The probe is measured once per machine and stored
    (specviz/profile/store.py), so a busy machine never changes the pick; where this machine's profile has no probe,
    float32, the stated default (exact on every CPU). Other names pass through. Plain decoding
    is the reference's regime: on our 2-core CPUs verifying many tokens costs several times one (the cost curves),
    so the fastest lossless run is one whose single-token forward is fastest, with few, cheap guesses on top. Decided
    once per profile."""
    return profile.remembered(("resolve_dtype", dtype, device), lambda: _resolve_dtype(dtype, device, profile))


def _resolve_dtype(dtype: str, device: str, profile: Profile) -> str:
    if dtype != AUTO_DTYPE:
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
    seconds, best = auto_probe(profile), STATED_PRECISION
    if seconds is None:
        return best
    for name in cpu_precisions():       # each must beat the pick so far by 10%: close timings must not flip it
        if seconds[name] < 0.9 * seconds[best]:
            best = name
    return best


STATED_PRECISION = "float32"      # `auto` on a CPU whose profile has no probe


def auto_probe(profile: Profile) -> dict[str, float] | None:
    """The probe layer's seconds for one token, per precision this CPU can run; None where the profile lacks one."""
    curves = {name: probe_seconds(name, profile) for name in cpu_precisions()}
    return None if None in curves.values() else {name: curve[1] for name, curve in curves.items()}


def auto_reason(profile: Profile, device: str = "cpu", spec: str | None = None) -> str:
    """Why `auto` picked what it picked here for the target `spec`, with the measurement and where it is kept (shown
    where the precision is shown)."""
    if device.startswith("cuda"):
        return f"auto: {resolve_dtype(AUTO_DTYPE, profile, device)} on a GPU"
    if spec is not None and auto_precision(spec, profile, device) == GGUF:
        return ("auto picked gguf: the GGUF file's own blocks, multiplied by specviz's kernels as llama.cpp rounds "
                "them (the file's model, and the fastest exact one here)")
    probe = auto_probe(profile)
    if probe is None:
        return (f"auto picked {STATED_PRECISION}, the stated default: this machine's profile has no probe timings "
                "(python -m specviz.prepare measures them)")
    timings = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in sorted(probe.items(), key=lambda x: x[1]))
    picked = resolve_dtype(AUTO_DTYPE, profile)
    return (f"auto picked {picked}, the fastest here: a Qwen2-1.5B-shaped layer read one token "
            f"in {timings} ({profile.source(_probe_key(picked))})")


PROBE_FEEDS = (1, 2, 4, 8, 16)    # tokens fed: decoding one, verifying a few


def probe_seconds(dtype: str, profile: Profile) -> dict[int, float] | None:
    """The probe layer's seconds fed 1, 2, 4, 8 and 16 tokens in `dtype` on this CPU, as this machine's profile holds
    them (specviz/profile/store.py; None where it does not): its cost curve, which the app's regime panel draws next to
    llama.cpp's. Read once per profile."""
    return profile.remembered(("probe_seconds", dtype), lambda: _probe_seconds(dtype, profile))


def _probe_seconds(dtype: str, profile: Profile) -> dict[int, float] | None:
    def measure() -> dict[str, float]:
        with _PROBE_LOCK:    # one probe at a time: threads would slow each other's timings
            return {str(n): seconds for n, seconds in _probe_layer(dtype).items()}
    curve = profile.decided(_probe_key(dtype), measure)
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
    install(model)          # as a loaded model: the engine's products, where they apply
    return cost_curve(model, sizes=feeds, context=128, reps=repeats)


def quantize_in_place(model: torch.nn.Module, precision: str, keep: tuple = (), draft: bool = False) -> torch.nn.Module:
    """The model's linear layers (but `keep`) in 4 or 8 bits, each token attending alone (row_attention); a draft's
    4-bit groups 64 wide (int4.WIDE_GROUP: a tenth less to read, the same acceptance)."""
    use_row_attention(model)
    layer = functools.partial(Int4Linear, group=WIDE_GROUP) if draft and precision == INT4 else QUANTIZED[precision]
    quantize_model(model, keep, layer=layer, precision=precision)
    stack_siblings(model)           # q/k/v and gate/up in one product each (int4 on specviz's kernel)
    return model
