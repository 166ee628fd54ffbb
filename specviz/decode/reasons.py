"""Why a planned round had its shape, in words, from its record in the trace (specviz/decode/trace.py PlanRecord): for
the Step caption and the CLI. Made when a view asks, not in the round: the round's timed bookkeeping keeps numbers
only."""
from __future__ import annotations

from .planner import FIRST_ROUNDS, PROBE_GUESSES
from .trace import PlanRecord


def reason(plan: PlanRecord) -> str:
    """Why a round had its shape, in a sentence, from a trace's plan record."""
    said = ", ".join(f"{rate:.0%} at depth {depth}" for depth, rate in enumerate(plan.rates[:3], 1))
    speed = plan.recent_tokens / plan.recent_ms * plan.plain_ms if plan.recent_ms > 0 else 0.0
    recent = (f"The last drafted rounds made {plan.recent_tokens:.1f} tokens in {plan.recent_ms:.0f} ms, {speed:.2f}x "
              f"a plain step's {plan.plain_ms:.0f} ms a token (their guesses were accepted {said})")
    wait = "a few" if plan.probe_wait is None else plan.probe_wait
    if plan.kind == "plain" and plan.probe_held:
        said = (f"{recent}: this round is a plain step. A probe is due, but the target's recent confidence predicts "
                f"a first guess passes {plan.predicted:.0%} of the time, too little to pay for the draft reading the "
                f"{plan.behind} tokens it missed.")
    elif plan.kind == "plain":
        said = f"{recent}: this round is a plain step; a small guess probes after {wait} plain steps in a row."
    elif plan.kind == "probe":
        said = (f"{recent}. After {wait} plain steps this round probes with up to {PROBE_GUESSES} guesses, "
                "whatever they cost, to see whether the text has turned predictable.")
    elif speed < 1.0:
        said = (f"{recent}: below plain decoding, but one round's yield is chance: a run drafts its first "
                f"{FIRST_ROUNDS} rounds, and after them until what its last rounds were worth beyond plain steps "
                "falls below nothing by more than their spread allows; each guess joins while its calibrated chance "
                "beats plain decoding's rate.")
    else:
        said = f"{recent}: this round drafts, and each guess joins while its calibrated chance beats that rate."
    return f"{said} {lookup_reason(plan)}".rstrip()


def lookup_reason(plan: PlanRecord) -> str:
    """Whether context lookup's copied tokens joined the round, and why, in a sentence ('' where it found none)."""
    found, joined = plan.lookup_found, plan.lookup_joined
    if not found:
        return ""
    odds = f"a calibrated chance of {plan.lookup_chance:.0%} against the {plan.lookup_price:.0%} its verifying costs"
    copied = f"Context lookup found {found} token{'s' if found != 1 else ''} to copy from the text"
    if joined == found:
        return f"{copied}, and all joined (the last with {odds})."
    if joined == 0:
        return f"{copied}; none joined: the first had {odds}."
    return f"{copied}; {joined} joined, and the next had {odds}."
