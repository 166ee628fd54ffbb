"""The app's words and coloured text: captions in plain words, the text tinted by stage, counters,
race columns and tables, all from trace records (HTML-escaped: token texts may come from a file)."""
from __future__ import annotations

import html

from ..decode.end_tokens import visible
from ..analysis.markdown import md_table
from ..analysis.round_cost import RoundCost, analysis, read_share
from ..plots.palette import KIND_COLOURS, ROOT_COLOUR
from ..plots import KIND_WORDS, stage_colours, stage_label
from ..stack.strategies import STRATEGIES
from ..decode.trace import Phase, StageInfo, StepRecord
from ..peers import llama_cpp
from .race import IN_TURN, ONE_AFTER_ANOTHER

def plan_note(lane: str, stats: dict) -> str:
    """Whether a lane's planned rounds fell back to plain steps, for a verdict (empty where none did)."""
    rounds = stats.get("rounds_by_plan") or {}
    plain, probes = rounds.get("plain", 0), rounds.get("probe", 0)
    if not plain:
        return ""
    copied = (stats.get("lookup_joined_by_plan") or {}).get("plain", 0)
    lookup = (f" Context lookup's copied tokens joined {copied} of those plain steps, where their chance paid for "
              "verifying them." if copied else "")
    return (f"{lane} took {plain} of its {sum(rounds.values())} rounds as plain steps, where its recent rounds "
            f"lost to plain steps by more than chance explains, and probed with a small guess {probes} time"
            f"{'s' if probes != 1 else ''}.{lookup}")


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
    parts = [f'<span class="prompt-text">{html.escape(visible(shown))}</span>']
    for s in steps:
        latest = s is steps[-1]
        for text, stage in zip(s.committed_text, s.committed_stage):
            parts.append(f'<span class="tok" data-stage="{stage}" style="{_token_style(colours[stage], latest)}" '
                         f'title="{html.escape(stage_label(stages, stage))}">{html.escape(visible(text))}</span>')
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


TIMED_ALONE = (f"**How it is timed.** Each step of each lane runs alone, with nothing else of the app computing (the "
               f"page hears of its progress only between steps, every few seconds): {IN_TURN}, so that a change in the "
               f"machine's speed touches them alike; {ONE_AFTER_ANOTHER}. The race then replays every lane at its own "
               "times.")
LANE_WORDS = {"llama_cpp": "llama.cpp's plain decoding", "llama_cpp_speculative": "llama.cpp's own speculation",
              "hf_assisted": "HF assisted generation"}


def race_time_note(total_s: float, lanes_s: float, timing_s: float, replay_s: float) -> str:
    """Where the time from Compare to the verdict went."""
    return (f"From Compare to this verdict {total_s:.1f} s: the lanes' own clocks add up to {lanes_s:.1f} s; timing "
            f"them took {timing_s:.1f} s (the rest: llama.cpp starting and loading its model, HF's set-up, progress "
            f"notes, and on a stack's first race our lanes' 2 untimed tokens each); the replay {replay_s:.1f} s.")


def recorded_timing(recorded: dict) -> str:
    how = recorded.get("timing") or "lanes stepped in turn, the page updated between steps"
    return f"**How it was timed.** Timings as recorded ({how})."


def timing_status(progress, elapsed_s: float) -> str:
    """What the page says while the lanes are timed: which lane runs, how far it got, which are done."""
    done = f" Done: {', '.join(progress.done)}." if progress.done else ""
    if progress.lane in LANE_WORDS:
        now = f"running {LANE_WORDS[progress.lane]} ({progress.lane}) to its end"
    elif progress.together:
        lanes = ", ".join(f"{lane} {tokens}/{progress.max_new_tokens}" for lane, tokens in progress.together.items())
        now = f"our lanes a step each in turn, tokens so far: {lanes}"
    else:
        now = f"{progress.lane} {progress.tokens}/{progress.max_new_tokens} tokens"
    return (f"Timing each lane alone (nothing else computes meanwhile; the race replays them together after): "
            f"{now}.{done} {elapsed_s:.0f} s so far.")


def sameness_note(differing: list[str], greedy: bool) -> str:
    """Whether the race's lanes wrote baseline's text: the promise under greedy decoding (in float32;
    in bf16/fp16 a batched pass may round a near-tie differently), a matter of chance when sampling.
    llama.cpp's lanes compute in their own numerics, so their difference is counted, not a bug of ours."""
    ours = [name for name in differing if name not in llama_cpp.PEERS]
    theirs = [name for name in differing if name in llama_cpp.PEERS]
    if not differing:
        return "Every lane wrote exactly baseline's text."
    if not greedy:
        return f"Sampled text differs between lanes ({', '.join(differing)}), as random draws do."
    note = "" if not ours else (f"Differs from baseline's text: {', '.join(ours)} (in float32 that would be a bug; "
                                "in bfloat16 a batched pass can round a near-tie differently). ")
    if theirs:
        note += (f"{', '.join(theirs)} wrote other text: llama.cpp computes with 8-bit activations and products "
                 "that depend on the batch, so a near-tie can go the other way.")
    return note.strip()


def verdict(stats: dict[str, dict]) -> str:
    """The race's answer in one sentence: which lane was fastest, by how much, against the reference (llama.cpp's plain
    decoding) and our baseline; the explanation is reference_note's, in the fold."""
    rates = {name: s["tokens_per_s"] for name, s in stats.items() if s}
    if not rates:
        return "No lane made a token."
    winner = max(rates, key=rates.get)
    best, ref, base = rates[winner], rates.get(llama_cpp.PLAIN), rates.get("baseline")
    against = ([f"{best / ref:.2f}× llama.cpp's plain decoding (the reference, {ref:.1f})"]
               if ref and winner != llama_cpp.PLAIN else [])
    against += [f"{best / base:.2f}× our baseline ({base:.1f})"] if base and winner != "baseline" else []
    who = f"**{winner}**" + (" (llama.cpp's plain decoding, the reference)" if winner == llama_cpp.PLAIN else "")
    sentence = f"{who} won at {best:.1f} tokens/s" + (": " + " and ".join(against) if against else "")
    ours = {name: rate for name, rate in rates.items() if name in STRATEGIES}
    fastest = max(ours, key=ours.get) if ours else None
    if winner not in STRATEGIES and fastest not in (None, "baseline"):
        sentence += f"; our fastest lane, {fastest}, made {ours[fastest]:.1f} ({ours[fastest] / best:.2f}×)"
    elif fastest == "baseline" and len(ours) > 1:
        sentence += "; no speculation beat our own plain decoding here"
    return sentence + ("." if ref else " (llama.cpp did not run, so there is no reference).")


def staged_note(stats: dict[str, dict]) -> str:
    """Why staged won or lost against speculative, in one sentence: the phase (drafting or verifying) where its time a
    token differed most in the outcome's direction, and what made it so: the draft models' forwards a token and what
    each cost (a lower stage's guess fed beside a node saves a forward where it is right, and makes the forward dearer
    either way), and the tokens a target pass. The draft models' prompt read, alike in both, is left out. '' unless
    both lanes made tokens."""
    staged, single = stats.get("staged") or {}, stats.get("speculative") or {}
    if not staged.get("tokens_per_s") or not single.get("tokens_per_s"):
        return ""

    def drafting_s(lane: dict) -> float:
        return sum(s for k, s in (lane.get("phase_s") or {}).items() if Phase.stage_of(k) is not None)

    def per_token(lane: dict, phase: str) -> float:
        seconds = drafting_s(lane) if phase == "drafting" else (lane.get("phase_s") or {}).get(Phase.VERIFY, 0.0)
        return seconds * 1e3 / max(lane.get("new_tokens") or 1, 1)

    def forwards(lane: dict) -> tuple[float, float]:
        runs = sum((lane.get("draft_forwards") or {}).values())
        return runs / max(lane.get("new_tokens") or 1, 1), drafting_s(lane) * 1e3 / runs if runs else 0.0
    ratio = staged["tokens_per_s"] / single["tokens_per_s"]
    saved = {phase: per_token(single, phase) - per_token(staged, phase) for phase in ("drafting", "verifying")}
    phase = (max if ratio >= 1 else min)(saved, key=saved.get)
    (drafted, each), (single_drafted, single_each) = forwards(staged), forwards(single)
    return (f"Staged {'beat' if ratio >= 1 else 'lost to'} speculative ({ratio:.2f}×), mostly in {phase} "
            f"({per_token(staged, phase):.1f} ms a token against {per_token(single, phase):.1f}): its draft models "
            f"ran {drafted:.2f} forwards a token at {each:.1f} ms each, against {single_drafted:.2f} at "
            f"{single_each:.1f}, and its target passes made {staged['tokens_per_target_forward']:.1f} tokens against "
            f"{single['tokens_per_target_forward']:.1f}.")


def sameness_line(differing: list[str], greedy: bool) -> str:
    """Whether every lane wrote the same text, in one sentence (sameness_note explains a difference)."""
    if not differing:
        return "Every lane wrote exactly baseline's text."
    if not greedy:
        return "Sampled text differs between lanes, as random draws do."
    ours = [name for name in differing if name not in llama_cpp.PEERS]
    return (f"Differs from baseline's text: {', '.join(differing)}"
            + (" (llama.cpp's own numerics)." if not ours else " (How this was measured says why)."))


def outcome(race, greedy: bool, timed_how: str) -> tuple[str, str]:
    """A finished race's answer (who won, by how much, against what; whether every lane wrote the same text) and
    what the "How this was measured" fold tells: how the lanes were timed, what the verdict rests on, where a
    staged round's time went."""
    stats = race.table_stats()
    answer = f"{verdict(stats)} {sameness_line(race.differing(), greedy)}"
    parts = [timed_how, f"**Against the reference.** {reference_note(stats)}",
             f"**The texts.** {sameness_note(race.differing(), greedy)}"]
    if why := staged_note(stats):
        parts.insert(1, f"**Staged against speculative.** {why}")
    if race.skipped:
        parts.append("**Not in the race.** " + " ".join(f"{name}: {why}" for name, why in race.skipped.items()))
    analysis = round_note(race.stats(), baseline_whole_s=race.own_times().get("baseline", 0.0))
    return answer, "\n\n".join(parts + ([analysis] if analysis else []))


def profile_note(said: dict[str, str], missing: str) -> str:
    """Where the race's machine-dependent settings came from: each group of settings with its source (this machine's
    profile, learnt from earlier runs, or a stated default), and the one line that says the profile lacks some."""
    groups: dict[str, list[str]] = {}
    for setting, source in said.items():
        groups.setdefault(source, []).append(setting)
    where = " ".join(f"{', '.join(settings)}: {source}." for source, settings in groups.items())
    return f"**Where the settings came from.** {where or 'nothing measured on this machine was needed.'}" + (
        f" {missing_sentence(missing)}" if missing else "")


def missing_sentence(missing: str) -> str:
    """Profile.missing_line as a sentence of the page ('' where nothing was missing)."""
    line = missing.removeprefix("specviz: ")
    return f"{line[:1].upper()}{line[1:]}." if line else ""


REFERENCE_WORDS = "llama.cpp plain, the fastest plain decoder here"


def compare_table_md(stats: dict[str, dict], precision: str = "") -> str:
    """The paper's Table 1 form: speed against the reference (llama.cpp's plain decoding, where it ran) and against
    our baseline (named with its precision), tokens per target pass and memory traffic relative to baseline."""
    stats = {k: v for k, v in stats.items() if v}
    if not stats:
        return ""
    base = stats.get("baseline", {}).get("tokens_per_s")
    ref = stats.get(llama_cpp.PLAIN, {}).get("tokens_per_s")
    rows = []
    for name, s in stats.items():
        rel = s.get("bytes_relative_to_baseline")
        rows.append([name, f"{s['tokens_per_s']:.2f}", f"{s['tokens_per_s'] / ref:.2f}×" if ref else "–",
                     f"{s['tokens_per_s'] / base:.2f}×" if base else "–",
                     f"{s['tokens_per_target_forward']:.2f}", f"{rel:.2f}×" if rel else "–"])
    baseline_words = f"vs our baseline ({precision})" if precision else "vs our baseline"
    return md_table(["strategy", "tokens/s", f"vs reference ({REFERENCE_WORDS})", baseline_words,
                     "tokens per target pass", "memory traffic vs baseline"], rows, "lrrrrr")


def reference_note(stats: dict[str, dict]) -> str:
    """The race's verdict against the reference: whether any strategy of ours beat llama.cpp's plain decoding,
    with the numbers, and what would change it where none did."""
    ref = (stats.get(llama_cpp.PLAIN) or {}).get("tokens_per_s")
    ours = {name: s["tokens_per_s"] for name, s in stats.items() if s and name in STRATEGIES}
    if not ref or not ours:
        return ("No reference in this race: llama.cpp did not run, so speed-ups are against our baseline only, "
                "which is not the fastest plain decoder a user may have.")
    best = max(ours, key=ours.get)
    if ours[best] >= ref:
        note = (f"{best} beats the reference, llama.cpp's plain decoding: {ours[best]:.1f} against {ref:.1f} tokens/s "
                f"({ours[best] / ref:.2f}×).")
        if best == "baseline" and len(ours) > 1:
            note += (" No speculation beat our own plain decoding here: on 2 cores each extra token verified costs "
                     "compute, a drafted token costs a third of a target forward, and the draft reads the prompt too; "
                     "'Why it is fast' below shows the cost curves.")
        return note
    return (f"No strategy of ours beats the reference on this machine: llama.cpp's plain decoding made {ref:.1f} "
            f"tokens/s, our fastest lane ({best}) {ours[best]:.1f} ({ours[best] / ref:.2f}×). What would change it: "
            "verification that costs little more than one token (on 2 cores each extra token verified costs "
            "compute: more cores, bf16 or AMX units, a GPU), a draft that costs less than a third of the target per "
            "token and per prompt token read, and cheap guesses accepted often; 'Why it is fast' below shows the cost "
            "curves and the analysis drawn from them.")


def round_note(stats: dict[str, dict], lane: str = "staged", baseline_whole_s: float = 0.0) -> str:
    """The analysis of a lane's rounds against baseline's plain decoding in the same race
    (specviz/analysis/round_cost.py): what a round cost, the speed-up that makes, and what would reach the goal. Empty
    where either lane is missing. baseline_whole_s: the baseline lane's whole time, its prompt read included (the race's
    tokens/s count it)."""
    run, base = stats.get(lane) or {}, stats.get("baseline") or {}
    if not run.get("steps") or not base.get("new_tokens"):
        return ""
    cost = RoundCost.of(run["steps"], run["new_tokens"], run["wall_s"], run.get("phase_s", {}),
                        base["wall_s"] / base["new_tokens"], read_share(baseline_whole_s, base["wall_s"]))
    return " ".join(part for part in (analysis(lane, cost) if cost else "", plan_note(lane, run)) if part)
