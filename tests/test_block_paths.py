"""Where a GGUF file's K-quant products switch from the tiles to the packed columns: this machine's measured count,
taken up by every process that loads the file's blocks (specviz/models/block_paths.py, specviz/cpu/blocks.py)."""

import pytest
import torch

from specviz.cpu import blocks, reference
from specviz.models import block_paths

pytestmark = pytest.mark.skipif(not blocks.columns_from(), reason="this build has no packed columns' path (AMX)")


@pytest.fixture
def kept_counts():
    kept = blocks.columns_from()
    yield kept
    blocks.set_columns_from(kept)


def test_rows_below_the_set_count_take_the_tiles_and_from_it_the_columns(kept_counts):
    """A packed copy of zeros gives the definition's product where the tiles run and another where the columns read
    it: so the count set is the count the products switch at."""
    from test_blocks import case
    w, x = case(reference.Q4_K, 6, 40, seed=3)
    K = x.shape[1]
    zeros = torch.zeros(blocks._kernel().block_packed_bytes(reference.Q4_K, K, 40), dtype=torch.uint8)
    w, x = torch.from_numpy(w), torch.from_numpy(x)
    blocks.set_columns_from({"Q4_K": 4})
    assert blocks.columns_from()["Q4_K"] == 4
    for n in range(1, 7):
        expected = torch.from_numpy(reference.product(reference.Q4_K, w.numpy(), x[:n].numpy()))
        assert torch.equal(blocks.product(reference.Q4_K, w, x[:n], zeros), expected) == (n < 4), n


def test_the_crossover_is_the_count_whose_choice_loses_least_over_the_counts_timed():
    tiles = {1: 1.0, 2: 1.0, 4: 2.0, 8: 4.0}
    assert block_paths.crossover(tiles, {1: 0.9, 2: 0.9, 4: 1.5, 8: 3.0}) == 1
    assert block_paths.crossover(tiles, {1: 1.1, 2: 0.9, 4: 1.5, 8: 3.0}) == 2
    assert block_paths.crossover(tiles, {1: 1.5, 2: 1.5, 4: 1.9, 8: 3.0}) == 4
    assert block_paths.crossover(tiles, {1: 1.5, 2: 1.5, 4: 2.1, 8: 3.0}) == 8
    assert block_paths.crossover(tiles, {1: 1.1, 2: 1.1, 4: 2.5, 8: 4.5}) == 9       # never within the counts timed
    # one count's noise (the columns a hair slower at 8 rows, well ahead at 4 and 16) does not hand 4-15 to the tiles
    tiles[16] = 8.0
    assert block_paths.crossover(tiles, {1: 1.5, 2: 1.5, 4: 1.5, 8: 4.1, 16: 4.0}) == 4


QWEN_DRAFT = "qwen2.5-coder-0.5b"      # a Q4_K_M file: Q4_K and Q6_K products among others, and forwards of ~30 ms


@pytest.fixture(scope="module")
def qwen_draft_blocks():
    from specviz.models.load import load_model
    return load_model(QWEN_DRAFT, dtype="gguf", profile=None)


def test_the_crossover_is_timed_on_the_models_own_forwards_both_paths_at_every_count(qwen_draft_blocks, kept_counts,
                                                                                      monkeypatch):
    """Products timed alone did not stand for a model's forward (module docstring), so each count of rows is timed as
    a forward of the model itself, once through the tiles and once through the columns, for each K-quant it holds."""
    from specviz.profile.cost_curve import CostSampler
    timed, sampled = [], []
    real_init, real_seconds = CostSampler.__init__, CostSampler.seconds

    def init(sampler, models, *args, **kwargs):
        sampled.extend(models)
        real_init(sampler, models, *args, **kwargs)

    def seconds(sampler, n, model=0):
        timed.append((n, blocks.columns_from()))
        return real_seconds(sampler, n, model)
    monkeypatch.setattr(CostSampler, "__init__", init)
    monkeypatch.setattr(CostSampler, "seconds", seconds)
    measured = block_paths.measure(qwen_draft_blocks.model, reps=1)
    assert sampled == [qwen_draft_blocks.model]
    assert block_paths.held(qwen_draft_blocks.model) == list(measured["from"]) and set(measured["from"]) == {"Q4_K",
                                                                                                          "Q6_K"}
    for name in measured["from"]:
        paths = {(n, counts[name] <= n) for n, counts in timed}
        assert paths >= {(n, columns) for n in block_paths.TIMED_ROWS for columns in (False, True)}, name
        assert set(measured["ms"][name]["tiles"]) == set(measured["ms"][name]["columns"]) == \
            {str(n) for n in block_paths.TIMED_ROWS}
    assert blocks.columns_from() == kept_counts          # measuring leaves the process's counts as they were


def test_prepare_measures_the_crossover_and_a_later_process_takes_it_up(qwen_draft_blocks, preparing, kept_counts,
                                                                         monkeypatch):
    from specviz.profile.store import Profile
    monkeypatch.setattr(block_paths, "REPS", 1)
    model = qwen_draft_blocks.model
    measured = block_paths.take_up(preparing, QWEN_DRAFT, model)
    assert set(measured["from"]) == {"Q4_K", "Q6_K"}
    assert all(1 <= n <= max(block_paths.TIMED_ROWS) + 1 for n in measured["from"].values())
    assert blocks.columns_from() == measured["from"]
    blocks.set_columns_from({name: 1 << 20 for name in kept_counts})
    later = Profile(preparing.file.path())
    assert later.stored(block_paths.key(QWEN_DRAFT)) == measured         # kept under the model's name
    assert block_paths.take_up(later, QWEN_DRAFT, model) == measured     # and read back without timing anything
    assert blocks.columns_from() == measured["from"]
    assert "Q4_K from" in block_paths.describe(measured)


def test_a_model_without_k_quants_stores_no_crossover_and_keeps_the_sources_counts(smollm2, preparing, kept_counts,
                                                                                    monkeypatch):
    from specviz.profile.cost_curve import CostSampler
    assert block_paths.held(smollm2.model) == []                       # Q4_1 and Q8_0: no columns' path
    monkeypatch.setattr(CostSampler, "__init__", lambda *_: pytest.fail("a sampler for a model with nothing to time"))
    assert block_paths.measure(smollm2.model) == {"from": {}, "ms": {}}
    assert block_paths.take_up(preparing, "smollm2-135m", smollm2.model) is None
    assert preparing.stored(block_paths.key("smollm2-135m"), measured=False) is None
    assert blocks.columns_from() == kept_counts


def test_a_process_with_nothing_stored_keeps_the_sources_counts(qwen_draft_blocks, own_profile, kept_counts):
    assert block_paths.take_up(own_profile, QWEN_DRAFT, qwen_draft_blocks.model) is None
    assert blocks.columns_from() == kept_counts
