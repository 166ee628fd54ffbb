"""Which precision a draft model runs in under `auto` on a CPU: of precision.draft_precisions, the one whose forwards
were fastest as the stack feeds them (another must be 10% faster than the first to be chosen), measured once per
machine and stored (specviz/profile/store.py). A draft's precision only moves acceptance, never the output."""
from __future__ import annotations

import torch

from ..profile.store import Profile
from ..profile.cost_curve import cost_curves
from ..decode.drafters.model import LEVEL_FEED
from ..models.load import LoadedModel, load_model
from ..models.precision import draft_precisions
from ..decode.tree import TreeSpec

STATED_DRAFT = "int4"     # where the profile has no pick: a 4-bit draft reads the fewest bytes a token
STAGED_LEVEL_TOKENS = TreeSpec().level_width * LEVEL_FEED   # a staged level: its nodes, each with a guess after it


def draft_probe_seconds(models: list[torch.nn.Module], under_lower_stage: bool) -> list[float]:
    """What each candidate draft's forwards cost as it will run them, after a short prefix: one token
    per step of a chain; under a lower stage (staged) also a level of its tree, fed with the lower
    stage's guesses. On a CPU without bf16 units a bfloat16 0.5B reads one token 2.6x faster than in
    float32 but 4 tokens or more slower, so the answer depends on the feed.
    The candidates take turns in each round, so this machine's drifting speed hits them alike."""
    sizes = (1, STAGED_LEVEL_TOKENS) if under_lower_stage else (1,)
    return [sum(curve.values()) for curve in cost_curves(models, sizes=sizes, context=64, reps=5)]


def draft_choice_key(spec: str, under_lower_stage: bool, target_dtype: str) -> str:
    where = "under a lower stage" if under_lower_stage else "as the top stage"
    return f"draft {spec} {where} of a {target_dtype} target"


def fastest_draft(spec: str, target_dtype: str, device: str, profile: Profile, under_lower_stage: bool) -> LoadedModel:
    """The draft `spec` loaded in the precision this machine's profile holds for it (timed and stored first while
    preparing), else in STATED_DRAFT."""
    loaded: dict[str, LoadedModel] = {}
    candidates = draft_precisions(spec, target_dtype)

    def fastest() -> str:
        if not loaded:          # loaded once: where other work spoils a timing, prepare times the same models again
            loaded.update((name, load_model(spec, name, device, draft=True)) for name in candidates)
        seconds = draft_probe_seconds([c.model for c in loaded.values()], under_lower_stage)
        seconds[0] *= 0.9
        return list(loaded)[seconds.index(min(seconds))]
    stated = STATED_DRAFT if STATED_DRAFT in candidates else candidates[0]
    dtype = profile.decided(draft_choice_key(spec, under_lower_stage, target_dtype), fastest, stated)
    return loaded.get(dtype) or load_model(spec, dtype, device, draft=True)
