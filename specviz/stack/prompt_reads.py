"""How each quantized draft model of a stack reads prompts (specviz/cpu/prompt_reader.py): through float copies of
its weights, or its own summed 8 outputs at a time, whichever was measured faster on this machine. Only prepare
measures (specviz/profile/store.py); every other process reads the profile's choice."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ..profile.store import Profile
from ..backends.interface import Backend
from ..backends.choose import open_cache
from ..cpu import prompt_reader
from ..cpu.decoder import supported as runs_own_forward
from ..models.load import LoadedModel


@dataclass
class PromptReads:
    choices: dict[str, dict] = field(default_factory=dict)      # the stored choice in use, by draft spec
    products: dict[str, list[dict] | None] = field(default_factory=dict)    # ...and the float copies it reads through

    def read(self, drafts: dict[str, LoadedModel], profile: Profile) -> dict[str, dict]:
        """Take up each draft's stored choice (measured and stored first where none is, while prepare runs). A draft
        with nothing stored reads prompts through its own products. Returns the choices in use, by spec."""
        for spec, draft in drafts.items():
            if not runs_own_forward(draft.model):
                continue
            name = prompt_reader.key(draft.short_name, draft.dtype)
            choice = profile.decided(name, prompt_reader.chooser(draft.model))
            if not choice or choice == self.choices.get(spec):      # nothing stored, or in use already
                continue
            self.choices[spec] = choice
            copies = choice["choice"] != prompt_reader.OWN
            self.products[spec] = prompt_reader.copies(draft.model, choice["choice"]) if copies else None
        return self.choices

    def read_from(self, spec: str) -> int:
        """The feed length from which the draft `spec` reads through its reader (READ_ROWS where a profile from before
        crossovers stored none)."""
        return self.choices.get(spec, {}).get("from", prompt_reader.READ_ROWS)

    def timed_reader(self, spec: str) -> tuple[int, int, float] | None:
        """The reader of the draft `spec` as prepare timed it (the feed length it starts at, the tokens of the timed
        read, its seconds), as its caches use it (backend); None where the draft reads through its own products."""
        choice = self.choices.get(spec)
        seconds = choice["seconds"].get(choice["choice"]) if choice else None
        if seconds is None or choice["choice"] == prompt_reader.OWN:
            return None
        return self.read_from(spec), prompt_reader.PROMPT, seconds

    def backend(self, spec: str) -> Backend:
        """What makes the caches of the draft `spec`: open_cache, given the products it reads prompts through."""
        products = self.products.get(spec)
        if products is None:
            return open_cache
        return functools.partial(open_cache, prompt_products=products, read_from=self.read_from(spec))
