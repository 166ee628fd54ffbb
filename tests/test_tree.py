"""Tree structure, masks and shapes."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specviz.decode.tree import Tree, ancestor_matrix, best_static_shape, chain_shape, children_ranks, validate_shape


@st.composite
def random_parents(draw):
    n = draw(st.integers(1, 30))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@given(random_parents())
def test_ancestor_matrix_matches_walking_up(parents):
    seen = ancestor_matrix(parents)
    for i in range(len(parents)):
        expected = set()
        node = i
        while node >= 0:
            expected.add(node)
            node = parents[node]
        assert set(torch.nonzero(seen[i]).flatten().tolist()) == expected


@given(random_parents(), st.data())
def test_tree_paths_depths_and_ranks(parents, data):
    tree = Tree.with_root(7)
    for i, parent in enumerate(parents[1:], start=1):
        tree.add(parent, token=data.draw(st.integers(0, 50)), stage=1, draft_prob=0.5)
    for node in range(len(tree)):
        path = tree.path(node)
        assert path[0] == 0 and path[-1] == node
        assert tree.depths[node] == len(path) - 1
        assert all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    for node in range(len(tree)):
        assert [tree.ranks[c] for c in tree.children[node]] == list(range(len(tree.children[node])))


@given(st.integers(0, 64), st.integers(1, 12), st.integers(1, 6))
def test_best_static_shape_is_closed_and_has_budget_nodes(budget, depth, branch):
    shape = best_static_shape(budget, depth, branch)
    validate_shape(shape)
    assert len(shape) == len(set(shape))
    assert len(shape) <= budget
    assert all(len(p) <= depth and max(p) < branch for p in shape)
    if budget <= depth:       # enough room for a full chain: the budget is always filled
        assert len(shape) == budget


def test_best_static_shape_prefers_depth_on_rank_zero():
    shape = best_static_shape(6, max_depth=8, max_branch=4)
    assert (0, 0, 0) in shape and (1,) in shape
    assert (3,) not in shape


def test_chain_shape_and_children_counts():
    shape = set(chain_shape(3))
    assert shape == {(0,), (0, 0), (0, 0, 0)}
    assert children_ranks(shape, ()) == 1
    assert children_ranks(shape, (0, 0, 0)) == 0
    assert children_ranks({(0,), (1,), (2,)}, ()) == 3


@pytest.mark.parametrize("bad", [[(0, 0)], [(1,)], [(0,), (0, 2), (0, 0)]])
def test_validate_shape_rejects_open_shapes(bad):
    with pytest.raises(ValueError):
        validate_shape(bad)


def test_a_lookup_chain_shares_drafted_nodes_and_adds_the_rest():
    tree = Tree.with_root(7)
    a = tree.add(0, 3, 1, 0.6)
    tree.add(0, 4, 1, 0.3)
    tree.add(a, 5, 1, 0.5)
    tree.add_lookup_chain([3, 5, 9, 9], stage=2)
    assert tree.path_tokens(len(tree) - 1) == [7, 3, 5, 9, 9]
    assert len(tree) == 6                                   # 3 and 5 were shared, two 9s are new
    assert [n for n in range(len(tree)) if tree.point_mass[n]] == [a, 3, 4, 5]    # all four proposed by lookup
    assert tree.drawn == [False, True, True, True, False, False]
    assert [tree.stages[n] for n in (4, 5)] == [2, 2] and tree.draft_probs[4] == 1.0
