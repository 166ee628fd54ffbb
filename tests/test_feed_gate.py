"""The feed gate: a lower stage's guess joins the draft's forward only where its learnt chance pays for what it adds."""
from tiny import TinyTokenizer, tiny_model

from specviz.backends.choose import open_cache
from specviz.decode.drafters import Drafter, ModelDrafter
from specviz.decode.drafters.base import Guess
from specviz.decode.drafters.base import PRIORS, FeedGate
from specviz.decode.engine import Decoder
from specviz.decode.tree import TreeSpec

# seconds by tokens fed (index n): a 0.5B draft on 2 AVX2 cores, where one more token adds 35%, and on AVX512-VNNI,
# where it adds 3%
STEEP = (0.0, 0.0061, 0.0083, 0.0111, 0.0147, 0.0170, 0.0200)
FLAT = (0.0, 0.0069, 0.0071, 0.0081, 0.0113, 0.0125, 0.0141)
TARGET = {1: 0.026, 2: 0.031, 3: 0.038, 4: 0.039, 6: 0.056, 8: 0.064, 12: 0.093, 16: 0.116}


def test_a_guess_joins_only_where_its_chance_pays_for_what_it_adds():
    unsure, copied = Guess([7], ("ngram < 0.3",)), Guess([4, 5], ("copy", "copy, later"))
    # on the steep curve a 1-in-12 trigram guess would add 2.2 ms to save 6.1 ms a twelfth of the time; a copy pays
    assert FeedGate(STEEP).choose([unsure, copied], nodes=2) == [0, 1]
    # where a token adds 3% of a forward even the unsure guess pays, and the copy's second token with the first
    assert FeedGate(FLAT).choose([unsure], nodes=1) == [1] and FeedGate(FLAT).choose([copied], nodes=1) == [2]
    # the likelier guesses first, while the curve's next token is worth their chance
    assert FeedGate(FLAT).choose([unsure, copied], nodes=2) == [0, 2]


def test_the_gate_learns_a_stage_that_is_never_right_and_stops_feeding_it():
    gate = FeedGate(STEEP)
    copied = Guess([4], ("copy",))
    assert gate.choose([copied], nodes=1) == [1] and gate.chance("copy") == PRIORS["copy"]
    for _ in range(6):
        gate.learn("copy", False)
    assert gate.choose([copied], nodes=1) == [0]
    for _ in range(30):                 # the text turns repetitive: copies come back
        gate.learn("copy", True)
    assert gate.choose([copied], nodes=1) == [1]


class Useless(Drafter):
    """A lower stage that is sure of a token the draft never picks (the one after the last, the tiny draft's vocabulary
    being 64 tokens): every guess fed is a token of a forward bought in vain."""
    kind, name = "lookup", "useless"

    def expand(self, tree, nodes, context):
        return [None for _ in nodes]

    def guess(self, sequence, n):
        return Guess([(sequence[-1] + 1) % 64], ("copy",))


def priced(run, draft="draft") -> float:
    """A run's seconds by the curves: the target's forward of each round's tree, the draft's forwards (its prompt read
    aside, the same in every run)."""
    target = [TARGET[max(k for k in TARGET if k <= max(n, 1))] for n in range(17)]
    draft_s = sum(STEEP[min(n, len(STEEP) - 1)] for step in run.steps for n in step.forwards.get(draft, []))
    prompt_read = STEEP[min(run.steps[0].forwards[draft][0], len(STEEP) - 1)]
    return sum(target[min(len(step.nodes), 16)] for step in run.steps) + draft_s - prompt_read


def test_a_useless_second_stage_slows_staged_by_at_most_3_percent_over_the_draft_alone():
    """Guessing never changes the tree, only what a level's forward costs: with the gate a stage that is never right
    costs what its first few guesses taught the gate; fed whole, it costs staged a third more a level."""
    target, draft = tiny_model("llama"), tiny_model("llama", noise=0.3)
    spec = TreeSpec(shape="dynamic", budget=8, max_depth=8, level_width=1)

    def run(lower, gate=None):
        drafter = ModelDrafter(draft, backend=open_cache, name="draft", lower=lower, gate=gate)
        return Decoder(open_cache(target, "target"), TinyTokenizer(), [3, 1, 4, 1, 5], drafter=drafter, tree=spec,
                       max_new_tokens=64).generate()

    alone, gated, fed_whole = run(None), run(Useless(), FeedGate(STEEP)), run(Useless())
    assert gated.tokens == alone.tokens == fed_whole.tokens
    assert [len(s.nodes) for s in gated.steps] == [len(s.nodes) for s in alone.steps]
    assert priced(gated) <= 1.03 * priced(alone)
    assert priced(fed_whole) > 1.03 * priced(alone)         # the mutant: a gate that feeds every guess
