"""A run's rounds priced by this machine's cost curves: the same rounds at the curves' prices (a projection), so that
two planners, or two strategies, compare on what their rounds did, free of these VMs' swings from minute to minute
(±30%, where the choices being compared differ by 1-5%). Each round costs the target's forward of its tree; each
draft forward costs the draft curve's price for the tokens it fed (the curve the planner has, its top draft's),
its round's first by the catch-up price (through the draft's prompt reader where the feed is that long), and each
draft model's first forward, its read of the prompt, is counted apart. Plain decoding costs a one-token forward
per token. The target's prompt read costs every strategy the same and is left out of both."""
from __future__ import annotations

from dataclasses import dataclass

from ..decode.planner import Costs


@dataclass(frozen=True)
class Priced:
    verify_s: float         # the target's forwards of the rounds' trees
    draft_s: float          # the draft models' forwards, their prompt read aside
    read_s: float           # the draft models' first forward: their read of the prompt
    plain_s: float          # plain decoding of as many tokens

    @property
    def ratio(self) -> float:
        """Plain decoding's price over this run's: above 1 where its rounds beat plain steps at these prices."""
        spent = self.verify_s + self.draft_s + self.read_s
        return self.plain_s / spent if spent > 0 else 0.0

    def to_dict(self) -> dict:
        return {"verify_s": self.verify_s, "draft_s": self.draft_s, "read_s": self.read_s, "plain_s": self.plain_s,
                "ratio": self.ratio}


def price(steps, costs: Costs, target: str) -> Priced:
    """steps: a run's StepRecords; costs: the curves its planner priced rounds with; target: the target's name (its
    forwards are the rounds' verifications, every other model's are drafting)."""
    verify = drafted = read = 0.0
    tokens, have_read = 0, set()
    for step in steps:
        tokens += len(step.committed_tokens)
        verify += costs.verify(len(step.nodes))
        for name, feeds in step.forwards.items():
            if name == target:
                continue
            for index, fed in enumerate(feeds):
                if name not in have_read:
                    read += costs.catch_up(fed)
                    have_read.add(name)
                elif index == 0:
                    drafted += costs.catch_up(fed)
                else:
                    drafted += costs.drafting(fed)
    return Priced(verify, drafted, read, tokens * costs.verify(1))
