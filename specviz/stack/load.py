"""The sources behind a stack's drafter specs, loaded once: draft models (in the precision `auto` stored for this
machine, specviz/stack/draft_precision.py) and n-gram tables."""
from __future__ import annotations

from pathlib import Path

from .auto_trigram import auto_trigram, draft_texts
from .draft_precision import fastest_draft
from ..models.load import GGUF, LoadedModel, ModelLoadError, check_tokenizers_match, load_model
from ..models.precision import is_gguf
from ..profile.store import Profile
from .. import ASSETS
from .strategies import is_ngram

DEFAULT_DRAFT = "assets/draft"
DEFAULT_TRIGRAM = "trigram"


def default_drafts() -> list[str]:
    """The offline default cascade: the shipped draft model and trigram where present, else lookup."""
    drafts = [DEFAULT_DRAFT] if (ASSETS / "draft" / "config.json").is_file() else []
    drafts.append(DEFAULT_TRIGRAM if (ASSETS / "trigram.npz").is_file() else "lookup")
    return drafts


def load_trigram(spec: str):
    from ..decode.drafters.ngram import KatzTrigram
    path = ASSETS / "trigram.npz" if spec == "trigram" else Path(spec)
    if not path.is_file():
        raise ModelLoadError(f"trigram file not found: {path}")
    return KatzTrigram.load(path)


def load_drafts(target: LoadedModel, drafts: list[str], dtype: str, device: str, profile: Profile,
                auto: bool) -> dict[str, object]:
    """Each drafter spec's model or n-gram table, by spec ("lookup" needs none)."""
    return {spec: load_draft(target, drafts, spec, dtype, device, profile, auto) for spec in drafts if spec != "lookup"}


def load_draft(target: LoadedModel, drafts: list[str], spec: str, dtype: str, device: str, profile: Profile,
               auto: bool = False):
    """The model or n-gram table behind one drafter spec. Under `auto`, or beside a GGUF target where the draft is no
    GGUF file, a draft model on a CPU runs in the precision draft_precision.fastest_draft chose."""
    if spec == "trigram:auto":
        return auto_trigram(target.tokenizer, target.short_name, draft_texts(drafts))
    if is_ngram(spec):
        return load_trigram(spec)
    auto = auto or (dtype == GGUF and not is_gguf(spec))
    if auto and device == "cpu":
        model = fastest_draft(spec, dtype, device, profile, under_lower_stage=drafts.index(spec) < len(drafts) - 1)
    else:
        model = load_model(spec, dtype, device, draft=True)
    check_tokenizers_match(target, model)
    return model
