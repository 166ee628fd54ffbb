"""Which drafters each strategy gets from a model stack."""
import pytest

from specviz.drafters import LookupDrafter, ModelDrafter, NgramDrafter
from specviz.models import LoadedModel
from specviz.stack import Stack, default_tree
from tiny import TinyTokenizer, tiny_model
from toy_ngram import ToyBigram


def stack(drafts, loaded=None):
    target = LoadedModel("target", tiny_model("llama"), TinyTokenizer())
    return Stack(target, drafts, loaded or {})


def test_strategies_pick_stages_from_the_stack():
    s = stack(["small", "big.npz"], {"small": LoadedModel("small", tiny_model("llama", noise=0.2), TinyTokenizer()),
                                     "big.npz": ToyBigram.fit(64)})
    assert s.drafter_for("baseline") is None
    single = s.drafter_for("speculative")
    assert isinstance(single, ModelDrafter) and single.lower is None
    staged = s.drafter_for("staged")
    assert isinstance(staged.lower, NgramDrafter)
    assert [d.kind for d in staged.stages()] == ["model", "ngram"]
    run = s.decoder([1, 2, 3], "staged", max_new_tokens=8).generate()
    assert [st.name for st in run.steps[0].stages] == ["target", "small", "big", "context lookup"]


def test_drafter_only_and_invalid_cascades():
    s = stack(["lookup"])
    assert isinstance(s.drafter_for("tree"), LookupDrafter)
    with pytest.raises(ValueError, match="staged needs a draft model"):
        s.drafter_for("staged")
    with pytest.raises(ValueError, match="unknown strategy"):
        s.drafter_for("fastest")


def test_a_drafter_named_like_the_target_gets_a_unique_name():
    model = LoadedModel("target", tiny_model("llama"), TinyTokenizer())
    s = Stack(model, ["target", "lookup"], {"target": model})
    run = s.decoder([1, 2], "staged", max_new_tokens=4).generate()
    names = [st.name for st in run.steps[0].stages]
    assert len(set(names)) == len(names) == 4 and run.stats["draft_forwards"]


def test_default_trees():
    assert default_tree("speculative").shape == "chain"
    assert default_tree("staged").shape == "dynamic"
    assert default_tree("tree", 24).budget == 24
    assert (default_tree("staged").lookup, default_tree("tree").lookup, default_tree("speculative").lookup) == (10, 0, 0)
    assert default_tree("staged", lookup=0).lookup == 0 and default_tree("tree", lookup=5).lookup == 5
    assert (default_tree("tree").min_score, default_tree("staged", min_score=0.25).min_score) == (0.2, 0.25)
