"""One answer to 'what does strategy X run, with which tree': the CLI, bench and app all ask
specviz.stack.strategies."""
import pytest

from specviz.stack.strategies import (
    AUTO_SHAPE,
    STRATEGIES,
    check_strategy,
    default_tree,
    drafter_specs,
    shape_for,
    tree_for_lane,
)


def test_each_strategy_takes_its_drafters_from_the_cascade():
    cascade = ["draft-model", "trigram"]
    assert drafter_specs("baseline", cascade) == []
    assert drafter_specs("speculative", cascade) == drafter_specs("tree", cascade) == ["draft-model"]
    assert drafter_specs("staged", cascade) == cascade
    for bad in (["draft-model"], ["trigram", "draft-model"], ["draft-model", "trigram", "lookup"]):
        with pytest.raises(ValueError, match="staged needs a draft model"):
            drafter_specs("staged", bad)
    with pytest.raises(ValueError, match="unknown strategy 'fastest'"):
        check_strategy("fastest")


def test_a_race_lane_runs_its_own_default_tree_under_the_settings_of_staged():
    """The Compare race runs every lane with one set of settings: from staged's defaults each lane gets
    exactly the tree the CLI and the bench give that strategy."""
    chosen = default_tree("staged")
    for strategy in STRATEGIES[1:]:
        assert tree_for_lane(strategy, chosen, "staged") == default_tree(strategy)
    assert tree_for_lane("speculative", default_tree("tree", 5), "speculative").shape == "dynamic"   # chosen: kept
    assert shape_for("speculative", AUTO_SHAPE) == "chain" and shape_for("staged", AUTO_SHAPE) == "dynamic"
    with pytest.raises(ValueError, match="unknown tree shape"):
        shape_for("tree", "spiral")


def test_a_race_lane_grows_a_dynamic_tree_by_its_own_rule_at_the_size_the_user_set():
    """The app's settings (one budget and depth for every lane): staged takes one path a level while the draft
    is sure, tree its wide levels, and context lookup stays staged's."""
    from dataclasses import replace

    from specviz.decode.tree import TreeSpec
    app = TreeSpec(shape="dynamic", budget=12, max_depth=8, max_branch=4, lookup=3, min_score=0.2)
    staged, tree = tree_for_lane("staged", app, "staged"), tree_for_lane("tree", app, "staged")
    assert (staged.level_width, staged.planned, staged.lookup, staged.budget) == (1, True, 3, 12)
    assert (tree.level_width, tree.min_score, tree.lookup, tree.budget) == (4, 0.2, 0, 12)
    assert tree_for_lane("tree", replace(app, lookup=0), "tree") == replace(app, lookup=0)
    assert tree_for_lane("speculative", app, "staged") == default_tree("speculative")
