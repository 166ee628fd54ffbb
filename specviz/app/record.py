"""Making recordings: from an app session (Save run), or by racing a preset on a prompt to the end
(`python -m specviz.app.record`, e.g. on a GPU, to replay anywhere)."""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from time import perf_counter

from .. import __version__
from ..decode import end_tokens
from ..decode.tree import TreeSpec
from ..cpu.machine import describe
from ..recording import Recording, RecordedLane, RecordedPeer, RecordingError, dump
from ..decode.sampling import Sampling
from .race import TIMING, Race
from .settings import COMPLETION, DEFAULT_BUDGET, Settings, UserError, parse_settings
from .stacks import get_stack, new_decoder

def settings_dict(settings) -> dict:
    return {"prompt": settings.prompt, "strategy": settings.strategy, "preset": settings.preset,
            "target": settings.target, "drafts": settings.drafts, "sampling": vars(settings.sampling),
            "tree": settings.tree.to_dict(), "max_new_tokens": settings.max_new_tokens,
            "prompt_format": settings.prompt_format}


def settings_of(recording: Recording):
    """The app's Settings object of a recording (for the controls and the captions)."""
    s = recording.settings
    try:
        return Settings(prompt=s["prompt"], strategy=s["strategy"], preset=s["preset"], target=s.get("target", ""),
                        drafts=s.get("drafts", ""), sampling=Sampling(**s["sampling"]), tree=TreeSpec(**s["tree"]),
                        max_new_tokens=s["max_new_tokens"], prompt_format=s.get("prompt_format", COMPLETION))
    except (TypeError, KeyError) as exc:
        raise RecordingError(f"settings are malformed ({exc})") from None


def of_session(settings, race, stack, step_decoder=None) -> Recording:
    """A Recording of a live race (or None) and the Step view's decoder, as far as each got."""
    lanes, peers, order, skipped = {}, {}, [], {}
    if race is not None:
        lanes = {name: RecordedLane.of(d, race.setup_s.get(name, 0.0)) for name, d in race.decoders.items() if d.steps}
        peers = {name: RecordedPeer([t for t, _ in p.chunks[: p.shown]], [c for _, c in p.chunks[: p.shown]],
                                    [stack.tokenizer.decode([t for _, c in p.chunks[: i + 1] for t in c],
                                                            skip_special_tokens=True) for i in range(p.shown)],
                                    p.max_new_tokens, p.target_forwards)
                 for name, p in race.peers.items() if p.shown}
        skipped = dict(race.skipped)
        order = [name for name in race.lanes() if name in lanes or name in peers] + list(skipped)
    if step_decoder is not None and step_decoder.steps:
        lanes[step_decoder.strategy] = RecordedLane.of(step_decoder)
    if settings.strategy not in lanes:
        raise RecordingError(f"Nothing to save yet: run {settings.strategy} with Step, Run or Compare first.")
    return Recording(settings_dict(settings), recorded_meta(stack), lanes, order, peers, skipped)


def recorded_meta(stack) -> dict:
    import torch
    device = str(next(stack.target.model.parameters()).device)
    models = {stack.target.name: stack.target.weight_bytes}
    models |= {spec: m.weight_bytes for spec, m in stack.draft_models().items()}
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else ""
    return {"machine": gpu or describe().split(", torch")[0], "device": device, "details": describe(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "precision": stack.precision(),
            "timing": TIMING,
            "models": {k: str(v) for k, v in models.items()}, "specviz": __version__,
            "end_tokens": sorted(end_tokens.of(stack.target.model, stack.tokenizer))}


def record(settings) -> Recording:
    """Time every lane of the race alone to the end, as the app's Compare does (race.time_lanes), and the
    settings' strategy for the Step view if it is not a lane."""
    race = Race.start(settings)
    step_decoder = None
    if settings.strategy not in race.decoders:
        step_decoder = new_decoder(get_stack(settings.stack_key()), settings)
        step_decoder.generate()
    return of_session(settings, race, get_stack(settings.stack_key()), step_decoder)


def main(argv=None) -> int:
    """`python -m specviz.app.record`: record a race to a JSON file (e.g. on a GPU, to replay anywhere)."""
    from ..bench.settings import BenchError, parse_sampling
    from ..bench.prompts import PromptError, load_prompts
    from ..stack.strategies import STAGED_LOOKUP
    parser = argparse.ArgumentParser(prog="python -m specviz.app.record", description=main.__doc__)
    parser.add_argument("--preset", default="offline")
    parser.add_argument("--prompt", default="HumanEval/0", help="a HumanEval task id (HumanEval/N) or the text itself")
    parser.add_argument("--strategy", default="staged")
    parser.add_argument("--sampling", default="greedy", help="greedy, or e.g. topk50 (see the bench)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        text = args.prompt
        if text.startswith("HumanEval/"):
            by_id = {p.id: p.text for p in load_prompts()}
            if text not in by_id:
                raise RecordingError(f"no prompt {text!r} in HumanEval")
            text = by_id[text]
        s = parse_sampling(args.sampling, args.seed)
        mode = "greedy" if s.greedy else "sample"
        settings = parse_settings(prompt=text, strategy=args.strategy, preset=args.preset, target="", drafts="",
                                  sampling_mode=mode, temperature=s.temperature or 1.0, top_k=s.top_k, top_p=s.top_p,
                                  seed=s.seed, budget=DEFAULT_BUDGET, shape="auto", max_depth=8, max_branch=4,
                                  lookup=STAGED_LOOKUP, max_new_tokens=args.max_new_tokens)
        started = perf_counter()
        recording = record(settings)
    except (UserError, BenchError, PromptError, RecordingError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dump(recording, args.out)
    lanes = ", ".join(f"{n} {len(lane.new_tokens)} tokens in {sum(s.wall_s for s in lane.steps) + lane.setup_s:.2f} s"
                      for n, lane in recording.lanes.items())
    print(f"recorded in {perf_counter() - started:.0f} s on {recording.recorded['machine']}: {lanes} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
