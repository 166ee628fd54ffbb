"""The app's race as a table: each recording's lanes (seconds to the end, prompt reading included, as the
race's clocks count), staged's ratio to baseline and to HF assisted generation, staged's tokens per target
pass, and per-preset medians. Writes JSON.
    python -m specviz.recording --preset qwen-coder --prompt HumanEval/10 --out race_10.json   # one per prompt
    PYTHONPATH=. python scripts/race_table.py out.json race_*.json
"""
import json
import statistics
import sys

from specviz.prompts import load_prompts
from specviz.app.replay import race_of
from specviz.recording import load


def finished_race(recording):
    """The recorded race replayed to the end: each lane's clock is the one the app shows (Race.elapsed)."""
    race = race_of(recording)
    while not race.finished:
        race.step()
    return race


def row(path: str, prompt_ids: dict[str, str]) -> dict:
    recording = load(path)
    race = finished_race(recording)
    seconds = {name: race.elapsed(name) for name in race.lanes()}
    staged = race.decoders["staged"].steps
    baseline = race.decoders["baseline"].new_tokens
    return {"file": path, "preset": recording.settings["preset"], "precision": recording.recorded["precision"],
            "prompt": prompt_ids.get(recording.settings["prompt"], "own text"),
            "max_new_tokens": recording.settings["max_new_tokens"], "seconds": seconds,
            "staged_vs_baseline": seconds["baseline"] / seconds["staged"],
            "staged_vs_hf_assisted": seconds["hf_assisted"] / seconds["staged"] if "hf_assisted" in seconds else None,
            "staged_tokens_per_pass": sum(len(s.committed_tokens) for s in staged) / len(staged),
            "identical": all(lane.new_tokens == baseline for lane in race.decoders.values())       # greedy only
            if recording.settings["sampling"]["temperature"] == 0 else None}


def main(out: str, *paths: str) -> None:
    prompt_ids = {p.text: p.id for p in load_prompts()}
    rows = [row(path, prompt_ids) for path in paths]
    lanes = ["baseline", "speculative", "staged", "hf_assisted"]
    print("| preset | prompt | tokens | " + " | ".join(f"{n} s" for n in lanes)
          + " | staged vs baseline | staged vs HF assisted | staged tok/pass | same tokens |")
    print("| --- | --- | ---: |" + " ---: |" * (len(lanes) + 3) + " --- |")
    for r in rows:
        hf = r["staged_vs_hf_assisted"]
        print(f"| {r['preset']} | {r['prompt']} | {r['max_new_tokens']} | "
              + " | ".join(f"{r['seconds'][n]:.2f}" if n in r["seconds"] else "-" for n in lanes)
              + f" | {r['staged_vs_baseline']:.2f}x | {f'{hf:.2f}x' if hf else '-'} | {r['staged_tokens_per_pass']:.2f} "
                f"| {({True: 'yes', False: 'no', None: 'sampled'})[r['identical']]} |")
    medians = {}
    for key in sorted({(r["preset"], r["max_new_tokens"]) for r in rows}):
        group = [r for r in rows if (r["preset"], r["max_new_tokens"]) == key]
        medians[f"{key[0]}, {key[1]} tokens"] = {
            name: statistics.median(r[name] for r in group if r[name] is not None)
            for name in ("staged_vs_baseline", "staged_vs_hf_assisted", "staged_tokens_per_pass")}
    for group, values in medians.items():
        print(f"median over {group}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
    with open(out, "w") as f:
        json.dump({"rows": rows, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
