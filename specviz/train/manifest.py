"""assets/manifest.json and its human-readable twin assets/MANIFEST.md, written from the recorded runs:
what each shipped artifact is, the command that built it, and what was measured: the `manifest` command."""
from __future__ import annotations

import json
from pathlib import Path

from ..analysis.markdown import md_table
from ..models.load import load_model
from .. import ASSETS
from .common import DATA, TARGET, log, read_json
from .draft_text import run_info_path


def target_weight_bytes() -> int:
    return load_model(TARGET).weight_bytes


RECORDING_COMMAND = ("python -m specviz.app.record --preset PRESET --prompt HumanEval/N --sampling greedy|topk50 "
                     "--max-new-tokens 64 --out assets/recordings/NAME.json.gz")


def recordings_artifact() -> dict:
    """The shipped recorded runs (the app replays them with no model; specviz/recording/)."""
    files = sorted(str(p.relative_to(ASSETS)) for p in (ASSETS / "recordings").glob("*.json*"))
    return {"files": files, "command": RECORDING_COMMAND,
            "note": "gpu-h100-*: recorded on a lent NVIDIA H100 with SPECVIZ_DTYPE=float32; cpu-*: on the 2-core CPU"}


def draft_text_artifact() -> dict:
    """The shipped draft-written text (specviz/train/draft_text.py), one entry per file with its run."""
    files = sorted(str(p.relative_to(ASSETS)) for p in (ASSETS / "draft_text").glob("*.jsonl.gz"))
    return {"files": files, "command": "python -m specviz.train draft-text --draft DRAFT",
            **{f"run {name}": read_json(run_info_path(ASSETS / name)) for name in files}}


def cmd_manifest(args) -> None:
    """Write assets/manifest.json and assets/MANIFEST.md from the recorded runs (data/*.json)."""
    if args.files_only:
        write_manifest(json.loads((ASSETS / "manifest.json").read_text()))
        return
    draft = read_json(DATA / "draft_train_draft.json")
    trigram = read_json(DATA / "trigram_build_trigram.json")
    measured = read_json(Path(args.agreement))
    quick = read_json(Path(args.agreement_quick))
    artifacts = {
        "draft": {"files": ["draft/config.json", "draft/generation_config.json",
                            "draft/model.safetensors"], **draft,
                  "fp32_weight_bytes": draft.get("parameters", 0) * 4,
                  "target_fp32_weight_bytes": target_weight_bytes()},
        "trigram": {"files": ["trigram.npz"], **trigram},
        "recordings": recordings_artifact(),
        "draft_text": draft_text_artifact(),
    }
    datasets = {"target_labelled": read_json(DATA / "target" / "info.json"),
                "teacher_labelled": read_json(DATA / "teacher" / "info.json"),
                "humaneval_continuations": read_json(DATA / "humaneval" / "info.json"),
                "corpus": read_json(DATA / "corpus_info.json")}
    notes = Path(args.notes).read_text() if args.notes else ""
    write_manifest({"notes": notes, "artifacts": artifacts, "datasets": datasets, "agreement": measured,
                    "agreement_first_32": quick, "acceptance": acceptance_summary(Path(args.acceptance))})


def write_manifest(manifest: dict) -> None:
    """manifest.json and MANIFEST.md, with the files, their sizes and the recordings' list as they are now."""
    index_files = ("manifest.json", "MANIFEST.md")          # cannot hold their own sizes
    files = {str(p.relative_to(ASSETS)): {"bytes": p.stat().st_size}
             for p in sorted(ASSETS.rglob("*")) if p.is_file() and p.name not in index_files}
    files.update({name: {"bytes": None} for name in index_files})
    manifest["artifacts"]["recordings"] = recordings_artifact()
    total = sum(f["bytes"] for f in files.values() if f["bytes"])
    manifest |= {"files": files, "total_bytes_without_index_files": total}
    (ASSETS / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (ASSETS / "MANIFEST.md").write_text(render_manifest(manifest))
    log("wrote", ASSETS / "manifest.json", ASSETS / "MANIFEST.md")


def acceptance_summary(bench_json: Path) -> dict:
    """Tokens per target forward of our strategies, from a `specviz.bench` report."""
    report = read_json(bench_json)
    if not report:
        return {}
    keep = ("strategy", "sampling", "prompts", "tokens_per_target_forward",
            "mean_accepted_per_target_forward", "tokens_per_s_median", "speedup_vs_baseline", "exact_match")
    return {"command": report["command"], "settings": report["settings"], "machine": report["machine"],
            "date": report["date"], "rows": [{k: r.get(k) for k in keep} for r in report["results"]]}


def render_acceptance(acceptance: dict) -> list[str]:
    lines = ["## Accepted tokens per target forward (HumanEval)", ""]
    if not acceptance:
        return lines + ["(not measured)", ""]
    lines += [f"Command: `{acceptance['command']}` ({acceptance['machine']}, {acceptance['date']})", ""]
    def show(value, spec: str = "") -> str:
        return "-" if value is None else format(value, spec)

    rows = [[r["strategy"], r["sampling"], r["prompts"], show(r["tokens_per_target_forward"], ".3f"),
             show(r["mean_accepted_per_target_forward"], ".3f"), show(r["tokens_per_s_median"], ".1f"),
             f"{show(r['speedup_vs_baseline'], '.2f')}x", show(r["exact_match"])] for r in acceptance["rows"]]
    head = ["strategy", "sampling", "prompts", "tokens / target forward", "accepted drafts / forward",
            "tokens/s (median)", "vs baseline", "greedy identical"]
    return lines + md_table(head, rows).split("\n") + [""]


def render_manifest(m: dict) -> str:
    """The human-readable twin of manifest.json (same numbers)."""
    lines = ["# assets/ manifest", "",
             "Generated by `python -m specviz.train manifest` from the recorded runs; every number",
             "below was measured by the command next to it. Agreement = top-1 agreement on the",
             "target's greedy 64-token continuations of the 164 HumanEval prompts, teacher-forced",
             "(HumanEval is never used for training).", "", "## Files", "",
             *md_table(["file", "bytes"], [[f"`{name}`", f["bytes"] if f["bytes"] is not None else "(index file)"]
                                           for name, f in m["files"].items()]).split("\n")]
    lines += ["", f"Total (without the index files): {m['total_bytes_without_index_files']} bytes.", ""]
    for name, artifact in m["artifacts"].items():
        lines += [f"## {name}", "", f"Command: `{artifact.get('command', '(not built)')}`", ""]
        lines += [f"- {key}: {value}" for key, value in artifact.items() if key not in ("command", "files")]
        lines.append("")
    lines += ["## Data", ""]
    for name, info in m["datasets"].items():
        lines += [f"### {name}", "", f"Command: `{info.get('command', '(missing)')}`", ""]
        lines += [f"- {key}: {value}" for key, value in info.items() if key != "command"]
        lines.append("")
    for title, key in (("Agreement (all 164 prompts)", "agreement"),
                       ("Agreement (first 32 prompts)", "agreement_first_32")):
        result = m[key]
        rows = [[pair, result[pair]["mean_over_prompts"], result[pair]["pooled_over_tokens"], result[pair]["prompts"],
                 result[pair]["positions"]] for pair in ("draft_vs_target", "trigram_vs_draft", "trigram_vs_target")
                if pair in result]
        lines += [f"## {title}", "", f"Command: `{result.get('command', '(not measured)')}`", "",
                  *md_table(["pair", "mean over prompts", "pooled over tokens", "prompts", "positions"],
                            rows).split("\n")]
        if "draft_mean_top1_probability" in result:
            lines += ["", f"Draft's mean top-1 probability (calibration; compare with its agreement): "
                          f"{result['draft_mean_top1_probability']}."]
        if "trigram_load_seconds" in result:
            lines += ["", f"Trigram load time: {result['trigram_load_seconds']} s."]
        lines.append("")
    lines += render_acceptance(m.get("acceptance", {}))
    if m["notes"]:
        lines += ["## Notes", "", m["notes"].rstrip(), ""]
    return "\n".join(lines)
