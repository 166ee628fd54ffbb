"""The model stacks, loaded once and shared read-only by every session (bounded in number and bytes),
and the decoders the app builds on them."""
from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict

from ..stack import presets
from ..models import prompt_format
from ..models.prompt_format import CHAT
from ..decode.metrics import summarise
from ..models.load import ModelLoadError
from ..stack.stack import Stack, default_drafts
from ..stack.strategies import drafter_specs, tree_for_lane
from .server_policy import PolicyError, check_custom
from .settings import (CUSTOM, DTYPE, MAX_CACHED_STACKS, MAX_PROMPT_TOKENS, MAX_STACK_BYTES, Settings, UserError,
                       one_line)

_STACKS: "OrderedDict[tuple, object]" = OrderedDict()
_STACKS_LOCK = threading.Lock()
_LOAD_LOCKS: dict[tuple, threading.Lock] = {}


def stack_loaded(key: tuple) -> bool:
    with _STACKS_LOCK:
        return key in _STACKS



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
    return presets.default_choice(device())


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


def get_stack(key: tuple):
    """The loaded stack for a settings key, loading it on first use (one load per key at a time)."""
    with _STACKS_LOCK:
        if key in _STACKS:
            _STACKS.move_to_end(key)
            return _STACKS[key]
        lock = _LOAD_LOCKS.setdefault(key, threading.Lock())
    with lock:
        with _STACKS_LOCK:
            if key in _STACKS:
                return _STACKS[key]
        try:
            if key[0] == CUSTOM:
                check_custom(key[1], list(key[2]))
                stack = Stack.load(key[1], list(key[2]), DTYPE, device=device())
            else:
                stack = presets.load_preset(key[0], DTYPE, device=device())
        except PolicyError as exc:
            raise UserError(str(exc)) from exc
        except (ModelLoadError, ValueError, OSError) as exc:
            reason = one_line(exc).replace("use --preset offline", "choose the offline preset")
            raise UserError(f"Could not load the models: {reason}") from exc
        if stack.weight_bytes > MAX_STACK_BYTES:
            raise UserError(f"These models need {stack.weight_bytes / 1e9:.1f} GB; this server holds at most "
                            f"{MAX_STACK_BYTES / 1e9:.1f} GB of models. Pick a smaller preset.")
        with _STACKS_LOCK:
            _STACKS[key] = stack
            # sessions still decoding with a dropped stack keep their own reference until they finish
            while len(_STACKS) > MAX_CACHED_STACKS or sum(s.weight_bytes for s in _STACKS.values()) > MAX_STACK_BYTES:
                _STACKS.popitem(last=False)
        return stack


def prompt_ids(stack, settings: Settings) -> list[int]:
    """The settings' prompt as token ids (in chat, inside the model's chat template as a user's turn, the
    assistant's turn opened), or a UserError saying why it cannot be used."""
    try:
        ids = prompt_format.encode_prompt(stack, settings.prompt, settings.prompt_format)
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
