"""What each strategy runs and with which tree: the one answer the engine, the stack, the CLI, the bench
and the app ask.

| strategy      | drafters                                  | default tree                              |
| ------------- | ----------------------------------------- | ----------------------------------------- |
| `baseline`    | none                                      | none (the root alone)                     |
| `speculative` | the top stage                             | a chain, each round's length planned      |
| `tree`        | the top stage                             | dynamic, DYNAMIC_BUDGET nodes, min score  |
| `staged`      | the whole cascade (a model on top)        | a narrow dynamic tree (one path while the |
|               |                                           | draft is sure), plus a context-lookup     |
|               |                                           | branch                                    |

`TreeSpec()` itself is the engine's neutral tree (no minimum score, no lookup); the strategies'
defaults are `default_tree(strategy)`. Staged's tree and speculative's chain are planned round by round where the
stack has this machine's cost curves (specviz/decode/planner.py); a size or a minimum score given by hand, and the
`tree` strategy, keep a fixed rule (the static case, for teaching and for A/B runs).
"""
from __future__ import annotations

from dataclasses import replace

from ..decode.costs import MAX_NODES
from ..decode.tree import SHAPES, TreeSpec

STRATEGIES = ("baseline", "speculative", "tree", "staged")
CHAIN_LENGTH = 3               # speculative's chain where it is not planned: feeds of up to ~4 tokens cost what one
                               # does on a CPU
PLANNED_CHAIN = 8              # speculative's planned chain at most
DYNAMIC_BUDGET = 16            # tree: drafted nodes per round at most
STAGED_LOOKUP = 3              # context-lookup tokens staged verifies by default: feeds of up to ~4-8 tokens cost
                               # little more than one on a CPU (bench --cost-curve), longer ones do
DEFAULT_MIN_SCORE = 0.2        # tree: a path joins while the draft gives it this much (tuned on a 2-core CPU)
# staged's fixed rule: one path a level, grown while the draft gives it at least STAGED_MIN_SCORE, up to
# STAGED_BUDGET tokens. On a 2-core CPU each verified token past ~3 costs about a third of a one-token forward and
# a drafted one another third, so only likely guesses pay: on ten tuning prompts this narrow tree took 12% less
# time than tree's wide one (budget 16, width 4, min score 0.2). Staged's default tree is planned from this
# machine's cost curves (specviz/decode/costs.py); the fixed rule is for a stack that cannot plan, and for settings
# given by hand.
STAGED_BUDGET, STAGED_MIN_SCORE, STAGED_LEVEL_WIDTH = 6, 0.5, 1
AUTO_SHAPE = "auto"            # the UI's "the strategy's own shape"


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def is_ngram(spec: str) -> bool:
    return spec in ("trigram", "trigram:auto") or spec.endswith(".npz")


def is_non_neural(spec: str) -> bool:
    """Drafter specs that are not models: n-gram tables and context lookup."""
    return spec == "lookup" or is_ngram(spec)


def drafter_specs(strategy: str, drafts: list[str]) -> list[str]:
    """The drafter specs (top stage first) that `strategy` uses from a stack's cascade."""
    check_strategy(strategy)
    if strategy == "baseline" or not drafts:
        return []
    specs = list(drafts) if strategy == "staged" else list(drafts[:1])
    if strategy == "staged" and (len(specs) < 2 or any(is_non_neural(s) for s in specs[:-1])):
        raise ValueError("staged needs a draft model above a lower stage, e.g. --draft MODEL --draft trigram")
    return specs


def default_tree(strategy: str, budget: int | None = None, lookup: int | None = None,
                 min_score: float | None = None, max_depth: int | None = None) -> TreeSpec:
    """speculative drafts a chain; tree and staged a dynamic tree, and staged adds a context-lookup
    branch (`lookup` tokens; 0 = the paper's staged, whose n-gram stage only drafts for the draft)."""
    if lookup is None:
        lookup = STAGED_LOOKUP if strategy == "staged" else 0
    if strategy == "speculative":
        length = budget or PLANNED_CHAIN
        return TreeSpec(shape="chain", budget=length, max_depth=length, lookup=lookup, planned=budget is None)
    # min_score: stop growing where the draft is unsure. On a CPU each verified token costs 5-20% of
    # a one-token forward (bench --cost-curve), more than an unlikely node's chance of acceptance.
    if strategy == "staged":
        planned = min_score is None
        return TreeSpec(shape="dynamic", budget=budget or (MAX_NODES if planned else STAGED_BUDGET),
                        max_depth=max_depth or (MAX_NODES if planned else TreeSpec.max_depth),
                        min_score=STAGED_MIN_SCORE if planned else min_score, lookup=lookup,
                        level_width=STAGED_LEVEL_WIDTH, planned=planned)
    return TreeSpec(shape="dynamic", budget=budget or DYNAMIC_BUDGET, max_depth=max_depth or TreeSpec.max_depth,
                    min_score=DEFAULT_MIN_SCORE if min_score is None else min_score, lookup=lookup)


def shape_for(strategy: str, shape: str) -> str:
    """A shape the user picked, with `auto` resolved to the strategy's own."""
    if shape == AUTO_SHAPE:
        return "chain" if strategy == "speculative" else "dynamic"
    if shape not in SHAPES:
        raise ValueError(f"unknown tree shape {shape!r}; choose {AUTO_SHAPE}, {', '.join(SHAPES)}")
    return shape


def tree_for_lane(strategy: str, tree: TreeSpec, chosen: str) -> TreeSpec:
    """The tree `strategy` runs when the user set `tree` for strategy `chosen` (the Compare race runs
    every strategy with one set of settings): the chosen strategy's own defaults give every lane its own;
    otherwise speculative keeps its chain unless it was the one chosen, context lookup belongs to staged
    alone, and a dynamic tree grows by the lane's own rule (staged: one path a level while the draft is
    sure, by this machine's plan; the others: `tree`'s wide levels), within the size the user set."""
    if tree == default_tree(chosen):
        return default_tree(strategy)
    if strategy == "speculative" and tree.shape != "chain" and chosen != "speculative":
        tree = default_tree("speculative")
    if strategy != "staged":
        tree = replace(tree, lookup=0)
    if tree.shape == "dynamic":
        own = default_tree("staged" if strategy == "staged" else "tree")
        tree = replace(tree, level_width=own.level_width, min_score=own.min_score, planned=own.planned)
    return tree
