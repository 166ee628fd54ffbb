"""The Step's words: what one round did, in plain words for someone new to speculative decoding, and the
calibration the round's plan priced its guesses by."""
from __future__ import annotations

from ..decode.end_tokens import visible
from ..decode.reasons import reason
from ..decode.trace import StageInfo, StepRecord
from ..plots import KIND_WORDS, bonus_token, stage_colours
from ..plots.palette import COLOUR_NAMES


def _quote(text: str) -> str:
    return "`" + visible(text).replace("\n", "↵").replace("`", "'") + "`"


def _drafted_by(step: StepRecord) -> str:
    counts: dict[int, int] = {}
    for n in step.nodes[1:]:
        counts[n.stage] = counts.get(n.stage, 0) + 1
    parts = [f"{count} by the {KIND_WORDS.get(step.stages[s].kind, step.stages[s].kind)} "
             f"({_colour_name(step.stages, s)})" for s, count in sorted(counts.items())]
    return ", ".join(parts)


def _colour_name(stages: list[StageInfo], index: int) -> str:
    return COLOUR_NAMES.get(stage_colours(stages)[index], "")


def prompt_read_note(steps: list[StepRecord], prompt_tokens: int) -> str:
    """Where the last step is the one in which the draft model first read the text and it left part of it unread
    (specviz/decode/drafters/model.py, PromptWindow): how much it read, and why ('' otherwise)."""
    if not steps or len(steps[-1].stages) < 2 or steps[-1].stages[1].kind != "model":
        return ""
    draft = steps[-1].stages[1].name
    first = next((step for step in steps if step.forwards.get(draft)), None)
    if first is not steps[-1]:
        return ""
    read, text = first.forwards[draft][0], prompt_tokens + first.position
    if read >= text:
        return ""
    return (f"The draft model read {read} of the {text} tokens so far, the prompt's first ones and the last ones: "
            "reading costs it about a fifteenth of a target step a token, so it reads at most twice the tokens it "
            "will help write. What it leaves unread changes its guesses only; the target checks every one.")


def second_stage_note(step: StepRecord) -> str:
    """What the stages below the draft model did for it this round: how many of the guesses they handed it before it
    asked (it fed them beside the node above, so their scores came with that forward) and how many of its forwards
    that saved against one forward per level of guesses ('' where the draft has no stage below, or did not run)."""
    if len(step.stages) < 3 or step.stages[1].kind != "model":
        return ""
    forwards = len(step.forwards.get(step.stages[1].name, []))
    lower = {i for i, stage in enumerate(step.stages) if i >= 2 and stage.kind != "lookup"}
    drafted = [n for n in step.nodes[1:] if n.stage == 1 or n.stage in lower]
    if not lower or not forwards or not drafted:
        return ""
    handed = sum(1 for n in drafted if n.stage in lower)
    levels = len({step.nodes[n.parent].depth for n in drafted})
    saved = max(0, levels - forwards)
    words = KIND_WORDS.get(step.stages[min(lower)].kind, "stage below")
    return (f"The {words} handed the draft {handed} of these guesses before it asked for them; the draft ran "
            f"{forwards} forward{'s' if forwards != 1 else ''} for {levels} level{'s' if levels != 1 else ''} of "
            f"guesses, {saved} saved.")


def step_caption(step: StepRecord, greedy: bool = True) -> str:
    """What happened in one step, in plain words for someone new to speculative decoding."""
    made = len(step.committed_tokens)
    planned = f" **Plan:** {reason(step.plan)}" if step.plan is not None else ""
    if len(step.nodes) == 1 and step.strategy != "baseline":
        return (f"**Step {step.step + 1}.**{planned} The helpers had no guess this time, so the target made one token "
                f"alone, {_quote(''.join(step.committed_text))}, exactly as plain decoding would.")
    if len(step.nodes) == 1:
        return (f"**Step {step.step + 1} (plain decoding).** The target model read the text and predicted "
                f"one next token, {_quote(''.join(step.committed_text))}. One expensive forward pass made "
                "one token: this is the speed that speculation tries to beat.")
    drafted = len(step.nodes) - 1
    accepted = len(step.accepted_path) - 1
    branches = sum(1 for n in step.nodes[1:] if n.rank > 0)
    shape = "a single chain" if branches == 0 else f"a tree with {branches + 1} branches"
    lines = [f"**Step {step.step + 1}.**{planned} **Draft:** cheap helpers guessed {drafted} tokens ahead as {shape} "
             f"({_drafted_by(step)}).{(' ' + second) if (second := second_stage_note(step)) else ''}",
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
                 + (f"; plain decoding would have needed {made} passes, so {saved} "
                    f"{'was' if saved == 1 else 'were'} saved."
                    if saved > 0 else "; no pass saved this time, and the drafting time was spent in vain."))
    if step.finished:
        lines.append(f"The generation is finished ({'end of text' if step.finish_reason == 'eos' else 'token limit'}).")
    return " ".join(lines)
