"""Named model stacks. `offline` works with no network; the others load from the Hugging Face hub.

A drafter spec "trigram:auto" is a Katz-backoff trigram built for the target's tokenizer on first
use (from Python source that ships with Python, tokenised by that tokenizer) and cached under the
user cache directory, so the paper's family gets its stage-2 drafter without a download.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .chunked import CHUNKED, available
from .models import AUTO_DTYPE, DEFAULT_TARGET, ModelLoadError, cache_dir, resolve_dtype


@dataclass(frozen=True)
class Preset:
    target: str
    drafts: tuple[str, ...] | None          # None: the shipped offline cascade
    description: str
    hub: bool = True


PRESETS: dict[str, Preset] = {
    "offline": Preset(DEFAULT_TARGET, None, "SmolLM2-135M target, the shipped draft and trigram (no network)", hub=False),
    "qwen-coder": Preset("qwen2.5-coder-1.5b", ("qwen2.5-coder-0.5b", "trigram:auto"),
                         "Qwen2.5-Coder-1.5B target, Qwen2.5-Coder-0.5B draft, trigram (offline after setup)", hub=False),
    "paper-gpt2": Preset("gpt2-large", ("gpt2", "trigram:auto"),
                         "the paper's family: GPT-2-L target, GPT-2 draft, trigram for that tokenizer"),
    "smollm2-1.7b": Preset("HuggingFaceTB/SmolLM2-1.7B-Instruct", ("HuggingFaceTB/SmolLM2-135M-Instruct", "trigram:auto"),
                           "SmolLM2-1.7B target, SmolLM2-135M draft, trigram"),
    "pythia-cascade": Preset("EleutherAI/pythia-1.4b", ("EleutherAI/pythia-160m", "EleutherAI/pythia-70m", "lookup"),
                             "Pythia-1.4B target, a three-model cascade: Pythia-160M, Pythia-70M, context lookup"),
    "qwen2.5-1.5b": Preset("Qwen/Qwen2.5-1.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", "trigram:auto"),
                           "Qwen2.5-1.5B target, Qwen2.5-0.5B draft, trigram"),
}


def default_preset(device: str = "cpu") -> str:
    """The stack a newcomer gets, chosen by measurement: `qwen-coder` (a 1.5B coder with its 0.5B sibling
    as draft) where its parts are installed and the machine runs it fast (a GPU, or a CPU where the
    bfloat16 probe wins); else `offline`, SmolLM2-135M with the shipped draft. On an AVX2-only CPU the
    1.5B runs at ~2 tokens/s in float32 and verifying 16 tokens costs 2.8x one (docs/BENCHMARKS.md)."""
    installed = all(available(CHUNKED[key]) for key in (PRESETS["qwen-coder"].target, *PRESETS["qwen-coder"].drafts[:1]))
    fast = device.startswith("cuda") or resolve_dtype(AUTO_DTYPE, device) == "bfloat16"
    return "qwen-coder" if installed and fast else "offline"


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def load_preset(name: str, dtype: str = AUTO_DTYPE, device: str = "cpu", *,
                target: str | None = None, drafts: list[str] | None = None):
    """Load a preset's stack; `target` / `drafts` given here replace the preset's own."""
    from .stack import Stack

    preset = get_preset(name)
    if drafts is None and preset.drafts is not None:
        drafts = list(preset.drafts)
    try:
        return Stack.load(target or preset.target, drafts, dtype, device)
    except ModelLoadError as exc:
        if not preset.hub:
            raise
        raise ModelLoadError(f"preset {name!r} could not be loaded ({exc}); its models come from the Hugging Face "
                             "hub: connect to the network once (the hub caches them) or use --preset offline") from exc


def python_source_files(limit_bytes: int = 8_000_000) -> list[Path]:
    """Python's own standard library source: text every machine with Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        size = path.stat().st_size
        if total + size > limit_bytes:
            break
        files.append(path)
        total += size
    return files


def auto_trigram(tokenizer, name: str, limit_bytes: int = 8_000_000):
    """A trigram for this tokenizer, built once from the standard library's source and cached."""
    from .ngram_model import KatzTrigram

    vocab = len(tokenizer)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = cache_dir() / "trigrams" / f"{safe}-{vocab}-{limit_bytes}.npz"
    if path.is_file():
        return KatzTrigram.load(path)
    texts = (p.read_text(encoding="utf-8", errors="replace") for p in python_source_files(limit_bytes))
    sequences = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    model = KatzTrigram.build(sequences, vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    model.save(tmp)
    tmp.replace(path)
    return model
