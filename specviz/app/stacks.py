"""The model stacks, loaded once and shared read-only by every session (bounded in number and bytes),
and the decoders the app builds on them."""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections import OrderedDict

from ..stack import presets
from ..models import prompt_format
from ..models.prompt_format import CHAT
from ..decode.metrics import summarise
from ..models.load import ModelLoadError
from ..profile.store import Profile
from ..stack.stack import Stack, default_drafts
from ..stack.strategies import drafter_specs, tree_for_lane
from .server_policy import PolicyError, check_custom
from .settings import (CUSTOM, DTYPE, MAX_CACHED_STACKS, MAX_PROMPT_TOKENS, MAX_STACK_BYTES, Settings, UserError,
                       one_line)

def load_stack(key: tuple, profile: Profile) -> Stack:
    """The stack a settings key names, loaded (a preset, or a custom target and drafts the server's policy allows)."""
    if key[0] == CUSTOM:
        check_custom(key[1], list(key[2]))
        return Stack.load(key[1], list(key[2]), DTYPE, device=device(), profile=profile)
    return presets.load_preset(key[0], DTYPE, device=device(), profile=profile)


class LoadedStacks:
    """The stacks this server holds, by settings key: each loaded once (one load per key at a time), the least
    recently used dropped past `most` stacks or `most_bytes` of weights. Sessions still decoding with a dropped stack
    keep their own reference until they finish. Each is loaded by `load(key, profile)` with this server's one machine
    profile (specviz/profile/store.py)."""

    def __init__(self, load=load_stack, most: int = MAX_CACHED_STACKS, most_bytes: float = MAX_STACK_BYTES,
                 profile: Profile | None = None):
        self.load, self.most, self.most_bytes = load, most, most_bytes
        self.profile = profile or Profile()
        self.stacks: "OrderedDict[tuple, Stack]" = OrderedDict()
        self.lock = threading.Lock()
        self.load_locks: dict[tuple, threading.Lock] = {}

    def holds(self, key: tuple) -> bool:
        with self.lock:
            return key in self.stacks

    def keys(self) -> list[tuple]:
        with self.lock:
            return list(self.stacks)

    def clear(self) -> None:
        """Drop every stack (a replay must then run without models)."""
        with self.lock:
            self.stacks.clear()

    def get(self, key: tuple) -> Stack:
        """The loaded stack for a settings key, loading it on first use."""
        with self.lock:
            if key in self.stacks:
                self.stacks.move_to_end(key)
                return self.stacks[key]
            lock = self.load_locks.setdefault(key, threading.Lock())
        with lock:
            with self.lock:
                if key in self.stacks:
                    return self.stacks[key]
            try:
                stack = self.load(key, self.profile)
            except PolicyError as exc:
                raise UserError(str(exc)) from exc
            except (ModelLoadError, ValueError, OSError) as exc:
                reason = one_line(exc).replace("use --preset offline", "choose the offline preset")
                raise UserError(f"Could not load the models: {reason}") from exc
            return self.hold(key, stack)

    def hold(self, key: tuple, stack: Stack) -> Stack:
        """Serve `stack` for `key` (loaded elsewhere: a test's tiny models), within the bounds."""
        if stack.weight_bytes > self.most_bytes:
            raise UserError(f"These models need {stack.weight_bytes / 1e9:.1f} GB; this server holds at most "
                            f"{self.most_bytes / 1e9:.1f} GB of models. Pick a smaller preset.")
        with self.lock:
            self.stacks[key] = stack
            while len(self.stacks) > self.most or sum(s.weight_bytes for s in self.stacks.values()) > self.most_bytes:
                self.stacks.popitem(last=False)
        return stack


_HELD = [LoadedStacks()]        # the server's; a test's own (isolated) above it while the test runs


def held() -> LoadedStacks:
    return _HELD[-1]


@contextlib.contextmanager
def isolated(**given):
    """Stacks of their own while inside (a test's: no model the server or another test loaded), made with what
    LoadedStacks takes (its loader, its bounds); the server's after."""
    _HELD.append(LoadedStacks(**given))
    try:
        yield _HELD[-1]
    finally:
        _HELD.pop()


def stack_loaded(key: tuple) -> bool:
    return held().holds(key)


def default_preset() -> str:
    """The preset the page opens with, chosen by measurement on this machine (presets.default_preset)."""
    return default_choice()[0]


@functools.lru_cache(maxsize=1)
def default_choice() -> tuple[str, str]:
    """The page's default preset and why (measured once per process). A Space whose requirements installed the
    qwen-coder pair runs that pair live, the one its recording shows, without timing a probe at start: the probe
    judges a CPU by plain decoding's speed, and shared Space hardware is the slow kind it would turn away."""
    if os.environ.get("SPACE_ID") and not os.environ.get(presets.PRESET_ENV) and presets.qwen_coder_installed():
        return "qwen-coder", "the pair the recording shows, installed from this Space's requirements"
    return presets.default_choice(device(), held().profile)


def staged_available(preset: str) -> bool:
    """Whether a preset has a draft model above a lower stage (staged needs both)."""
    try:
        drafter_specs("staged", presets.PRESETS[preset].drafts or default_drafts())
    except ValueError:
        return False
    return True


def device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_stack(key: tuple) -> Stack:
    """The loaded stack for a settings key, loading it on first use."""
    return held().get(key)


def prompt_ids(stack, settings: Settings) -> list[int]:
    """The settings' prompt as token ids (in chat, inside the model's chat template as a user's turn, the
    assistant's turn opened), or a UserError saying why it cannot be used."""
    try:
        ids = prompt_format.encode_prompt(stack.tokenizer, settings.prompt, settings.prompt_format)
    except prompt_format.NoChatTemplate as exc:
        raise UserError(f"{exc}: choose completion under Prompt format.") from exc
    except ValueError as exc:
        raise UserError(f"The prompt cannot be used: {one_line(exc)}") from exc
    if len(ids) > MAX_PROMPT_TOKENS:
        raise UserError(f"The prompt is too long ({len(ids)} tokens; at most {MAX_PROMPT_TOKENS}).")
    return ids


def shown_prompt(decoder, settings: Settings | None) -> str:
    """The prompt as the text views show it: in chat, with the template's tokens (read back from the ids)."""
    if settings is None or settings.prompt_format != CHAT:
        return settings.prompt if settings is not None else ""
    text = getattr(decoder, "prompt_text", None)        # a recorded lane keeps it; a live decoder has the tokenizer
    if text is None and getattr(decoder, "tokenizer", None) is not None:
        text = decoder.tokenizer.decode(decoder.prompt)
    return text or settings.prompt


def new_decoder(stack, settings: Settings, strategy: str | None = None, prefilled=None):
    """A decoder for the settings (strategy: another lane's); prefilled: engine.prefill of this prompt."""
    strategy = strategy or settings.strategy
    ids = prompt_ids(stack, settings)
    tree = tree_for_lane(strategy, settings.tree, settings.strategy)
    try:
        return stack.decoder(ids, strategy, tree=tree, sampling=settings.sampling,
                             max_new_tokens=settings.max_new_tokens, prefilled=prefilled)
    except (ValueError, ModelLoadError) as exc:
        raise UserError(f"{strategy}: {one_line(exc)}") from exc


def stats_of(decoder) -> dict:
    return summarise(decoder.steps, decoder.model_costs(), len(decoder.prompt)) if decoder.steps else {}
