"""What a speculative strategy's rounds cost against plain decoding, and what would make them pay: an analysis drawn
from a run's own clocks (its trace's phase times), for the app's verdict and the bench's report.

A round drafts, verifies once and commits some tokens. It beats plain decoding by (tokens per round x seconds per
plain token) / seconds per round. So for a goal G, a round that yields T tokens must take at most T x plain / G; where
it takes longer, the gap closes by a cheaper draft (the draft's share of a round, times a factor), or by more tokens
per round at today's cost. The target's prompt read is left out on both sides: it costs every strategy the same (the
bench's and the race's tokens/s include it, so their ratios sit closer to 1 than this one). Where the run says how much
of plain decoding's whole time that read took (`read_share`), the goal is taken as those tokens/s measure it: with a
share p of the whole, G over the whole needs (1 - p) / (1 / G - p) in decoding (1.40x for 1.25x at p = 0.3). A draft
model's own prompt read, in its first round, is a cost of speculation: counted, and named apart from the rounds'
drafting.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..decode.trace import Phase

GOAL = 1.25      # the speed-up over our own plain decoding the analysis measures against: staged's goal on 2 CPU cores


@dataclass(frozen=True)
class RoundCost:
    rounds: int
    tokens: float            # committed per round
    draft_s: float           # per round: every drafting stage's forwards
    read_s: float            # per round: the draft models' prompt read (once a generation), spread over its rounds
    verify_s: float          # per round: the target's forward
    other_s: float           # per round: building the tree, bookkeeping
    plain_token_s: float     # plain decoding's seconds per token, in the same run
    read_share: float = 0.0  # the target's prompt read's share of plain decoding's whole time, in the same run

    @classmethod
    def of(cls, rounds: int, tokens: int, decode_s: float, phase_s: dict[str, float],
           plain_token_s: float, read_share: float = 0.0) -> "RoundCost | None":
        """From totals over a run (or several): rounds, tokens committed, decoding seconds and their phases."""
        if rounds <= 0 or tokens <= 0 or decode_s <= 0 or plain_token_s <= 0:
            return None
        draft = sum(v for k, v in phase_s.items() if Phase.stage_of(k) is not None)
        read, verify = phase_s.get(Phase.PROMPT_READ, 0.0), phase_s.get(Phase.VERIFY, 0.0)
        return cls(rounds, tokens / rounds, draft / rounds, read / rounds, verify / rounds,
                   max(0.0, decode_s - draft - read - verify) / rounds, plain_token_s, min(max(read_share, 0.0), 1.0))

    @property
    def round_s(self) -> float:
        return self.draft_s + self.read_s + self.verify_s + self.other_s

    @property
    def speedup(self) -> float:
        """Over plain decoding, the prompt read aside."""
        return self.tokens * self.plain_token_s / self.round_s

    def decode_goal(self, goal: float = GOAL) -> float:
        """The speed-up in decoding that makes `goal` over the whole time, the target's prompt read included (infinity
        where even free decoding would not)."""
        rest = 1.0 / goal - self.read_share
        return (1.0 - self.read_share) / rest if rest > 0 else float("inf")

    def round_needed_s(self, goal: float = GOAL) -> float:
        return self.tokens * self.plain_token_s / self.decode_goal(goal)

    def draft_factor(self, goal: float = GOAL) -> float | None:
        """How many times cheaper the draft must get to reach the goal, all else as measured: None where the goal is
        met, infinity where even a free draft would not reach it."""
        gap = self.round_s - self.round_needed_s(goal)
        if gap <= 0:
            return None
        return float("inf") if self.draft_s <= gap else self.draft_s / (self.draft_s - gap)

    def tokens_needed(self, goal: float = GOAL) -> float:
        """Tokens a round must yield at today's cost per round to reach the goal."""
        return self.decode_goal(goal) * self.round_s / self.plain_token_s


def read_share(whole_s: float, decode_s: float) -> float:
    """The target's prompt read's share of plain decoding's whole time, from its whole and its decoding seconds (0 where
    the whole is unknown; RoundCost keeps it in [0, 1])."""
    return (whole_s - decode_s) / whole_s if whole_s > 0 else 0.0


def analysis(name: str, cost: RoundCost, goal: float = GOAL) -> str:
    """One paragraph: the round, its parts, the speed-up it makes, and what would reach the goal."""
    ms = lambda s: f"{s * 1e3:.0f} ms"     # noqa: E731
    read = f", the draft reading the prompt {ms(cost.read_s)} (once, spread over the rounds)" if cost.read_s else ""
    text = (f"Analysis of {name}'s rounds (this run's own clocks; the target's prompt read aside): a round took "
            f"{ms(cost.round_s)} (drafting {ms(cost.draft_s)}{read}, verifying {ms(cost.verify_s)}, the rest "
            f"{ms(cost.other_s)}) and committed {cost.tokens:.1f} tokens, which plain decoding makes in "
            f"{ms(cost.tokens * cost.plain_token_s)}: {cost.speedup:.2f}× in decoding. ")
    if cost.read_share:
        need = cost.decode_goal(goal)
        text += (f"The target's prompt read, alike for every strategy, took {cost.read_share:.0%} of plain decoding's "
                 f"whole time, and tokens/s count it: {goal:.2f}× there needs ")
        if need == float("inf"):
            return text + "more than any decoding can give."
        text += f"{need:.2f}× in decoding. "
    factor = cost.draft_factor(goal)
    if factor is None:
        return text + f"That meets {goal:.2f}×."
    reach = (f"a draft {factor:.1f}× cheaper ({ms(cost.draft_s)} → {ms(cost.draft_s / factor)} a round)"
             if factor != float("inf") else "no draft, however cheap (verifying alone costs more than that)")
    return text + (f"{goal:.2f}× needs a round of at most {ms(cost.round_needed_s(goal))}: {reach}, or "
                   f"{cost.tokens_needed(goal):.1f} tokens a round at today's cost.")
