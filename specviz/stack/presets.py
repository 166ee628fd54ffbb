"""Named model stacks. `offline` and `qwen-coder` work with no network; the others load from the
Hugging Face hub. Their stage-2 "trigram:auto" is built on first use (specviz/stack/auto_trigram.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..models.chunked import CHUNKED, available
from ..cpu.machine import memory_bytes
from ..models.locations import DEFAULT_TARGET
from ..models.load import ModelLoadError
from ..models.precision import AUTO_DTYPE, PROBE_LAYERS_PER_1_5B, auto_precision, probe_seconds
from ..profile.store import Profile
from .stack import Stack


@dataclass(frozen=True)
class Preset:
    target: str
    drafts: tuple[str, ...] | None          # None: the shipped offline cascade
    description: str
    hub: bool = True


PRESETS: dict[str, Preset] = {
    "offline": Preset(DEFAULT_TARGET, None, "SmolLM2-135M target, the shipped draft and trigram (no network)",
                      hub=False),
    "qwen-coder": Preset("qwen2.5-coder-1.5b", ("qwen2.5-coder-0.5b", "trigram:auto"),
                         "Qwen2.5-Coder-1.5B target, Qwen2.5-Coder-0.5B draft, trigram (offline after setup)",
                         hub=False),
    "paper-gpt2": Preset("gpt2-large", ("gpt2", "trigram:auto"),
                         "the paper's family: GPT-2-L target, GPT-2 draft, trigram for that tokenizer"),
    "smollm2-1.7b": Preset("HuggingFaceTB/SmolLM2-1.7B-Instruct",
                           ("HuggingFaceTB/SmolLM2-135M-Instruct", "trigram:auto"),
                           "SmolLM2-1.7B target, SmolLM2-135M draft, trigram"),
    "pythia-cascade": Preset("EleutherAI/pythia-1.4b", ("EleutherAI/pythia-160m", "EleutherAI/pythia-70m", "lookup"),
                             "Pythia-1.4B target, a three-model cascade: Pythia-160M, Pythia-70M, context lookup"),
    "qwen2.5-1.5b": Preset("Qwen/Qwen2.5-1.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", "trigram:auto"),
                           "Qwen2.5-1.5B target, Qwen2.5-0.5B draft, trigram"),
}


QWEN_CODER_MEMORY = 16 * 2**30    # its weights hold 8.1 GB in float32; a race's HF lane and the app come on top
QWEN_CODER_TOKEN_S = 0.35         # plain decoding of the 1.5B at 3 tokens/s or more: a 64-token race in 1-1.5 minutes
PRESET_ENV = "SPECVIZ_PRESET"     # an operator's choice of the default stack


def default_preset(device: str = "cpu", profile: Profile | None = None) -> str:
    """The stack a newcomer gets, chosen by measurement unless SPECVIZ_PRESET names one: `qwen-coder` (a 1.5B
    coder with its 0.5B sibling as draft) where its parts are installed, the machine has the memory, and it
    runs the 1.5B fast enough (a GPU, or a CPU where the probe layer predicts 0.35 s per token or less);
    else `offline`, SmolLM2-135M with the shipped draft. On a 2-core CPU staged beats baseline in the app's
    race on qwen-coder, and barely beats it on offline, whose 135M target costs little more than its draft."""
    return default_choice(device, profile or Profile())[0]


def default_choice(device: str, profile: Profile) -> tuple[str, str]:
    """default_preset's choice and why, in a few words (the app's live-mode line says it)."""
    chosen = os.environ.get(PRESET_ENV, "").strip()
    if chosen:
        if chosen not in PRESETS:
            raise ValueError(f"{PRESET_ENV}={chosen!r} is not a preset; choose one of {', '.join(PRESETS)}")
        return chosen, f"this server's operator chose it ({PRESET_ENV})"
    if not qwen_coder_installed():
        return "offline", "qwen-coder's model files are not installed here"
    if device.startswith("cuda"):
        return "qwen-coder", "a GPU runs it"
    memory = memory_bytes()
    if memory is not None and memory < QWEN_CODER_MEMORY:     # unknown (no sysconf, no psutil): not a reason to refuse
        return "offline", (f"qwen-coder asks for {QWEN_CODER_MEMORY / 2**30:.0f} GiB of memory and this server has "
                           f"{memory / 2**30:.1f} GiB")
    seconds = predicted_token_seconds(profile)
    if seconds is None:
        return "qwen-coder", ("the stated default: this machine's profile has no probe timings to predict its speed "
                              "(python -m specviz.prepare measures them)")
    if seconds > QWEN_CODER_TOKEN_S:
        return "offline", (f"this CPU would take {seconds:.2f} s a token of qwen-coder's 1.5B target (more than "
                           f"{QWEN_CODER_TOKEN_S} s)")
    return "qwen-coder", f"this CPU makes a token of its 1.5B target in about {seconds:.2f} s"


def qwen_coder_installed() -> bool:
    """Whether the qwen-coder pair's files are here (joined, or their chunk packages installed)."""
    return all(available(CHUNKED[key]) for key in (PRESETS["qwen-coder"].target, *PRESETS["qwen-coder"].drafts[:1]))


def predicted_token_seconds(profile: Profile) -> float | None:
    """One plain-decoding token of the qwen-coder target on this CPU in the precision `auto` picks for it (its GGUF
    file's own blocks where specviz's kernels build), from the probe layer; None where the profile has no probe."""
    curve = probe_seconds(auto_precision(PRESETS["qwen-coder"].target, profile), profile)
    return None if curve is None else curve[1] * PROBE_LAYERS_PER_1_5B


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def load_preset(name: str, dtype: str = AUTO_DTYPE, device: str = "cpu", *,
                target: str | None = None, drafts: list[str] | None = None, profile: Profile | None = None):
    """Load a preset's stack; `target` / `drafts` given here replace the preset's own. profile: this machine's
    measurements (None: the default file's)."""
    preset = get_preset(name)
    if drafts is None and preset.drafts is not None:
        drafts = list(preset.drafts)
    try:
        return Stack.load(target or preset.target, drafts, dtype, device, profile)
    except ModelLoadError as exc:
        if not preset.hub:
            raise
        raise ModelLoadError(f"preset {name!r} could not be loaded ({exc}); its models come from the Hugging Face "
                             "hub: connect to the network once (the hub caches them) or use --preset offline") from exc
