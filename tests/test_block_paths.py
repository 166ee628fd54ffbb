"""Where a GGUF file's K-quant products switch from the tiles to the packed columns: this machine's measured count,
taken up by every process that loads the file's blocks (specviz/models/block_paths.py, specviz/cpu/blocks.py)."""
from pathlib import Path

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
    assert blocks.crossover(tiles, {1: 0.9, 2: 0.9, 4: 1.5, 8: 3.0}) == 1
    assert blocks.crossover(tiles, {1: 1.1, 2: 0.9, 4: 1.5, 8: 3.0}) == 2
    assert blocks.crossover(tiles, {1: 1.5, 2: 1.5, 4: 1.9, 8: 3.0}) == 4
    assert blocks.crossover(tiles, {1: 1.5, 2: 1.5, 4: 2.1, 8: 3.0}) == 8
    assert blocks.crossover(tiles, {1: 1.1, 2: 1.1, 4: 2.5, 8: 4.5}) == 9       # never within the counts timed
    # one count's noise (the columns a hair slower at 8 rows, well ahead at 4 and 16) does not hand 4-15 to the tiles
    tiles[16] = 8.0
    assert blocks.crossover(tiles, {1: 1.5, 2: 1.5, 4: 1.5, 8: 4.1, 16: 4.0}) == 4


def test_prepare_measures_the_crossover_and_a_later_process_takes_it_up(preparing, kept_counts):
    from specviz.profile.store import Profile
    measured = block_paths.take_up(preparing)
    assert set(measured["from"]) == set(kept_counts)
    assert all(1 <= n <= max(blocks.TIMED_ROWS) + 1 for n in measured["from"].values())
    # each count a verified tree commonly feeds is timed on both paths, so a tie at one count cannot skip its neighbours
    timed = [set(times) for paths in measured["ms"].values() for times in paths.values()]
    assert all({str(n) for n in range(1, 7)} <= counts for counts in timed)
    assert blocks.columns_from() == measured["from"]
    blocks.set_columns_from({name: 1 << 20 for name in kept_counts})
    later = Profile(preparing.file.path())
    assert block_paths.take_up(later) == measured          # stored, and read back without timing anything
    assert blocks.columns_from() == measured["from"]
    assert "Q4_K from" in block_paths.describe(measured)


def test_a_process_with_nothing_stored_keeps_the_sources_counts(own_profile, kept_counts):
    assert block_paths.take_up(own_profile) is None
    assert blocks.columns_from() == kept_counts


def test_the_crossover_is_timed_on_weights_no_cache_holds():
    """A cache that held the weights would time the paths compute-bound, where a model's one-row product is not."""
    cache = blocks.last_level_cache_bytes()
    if Path("/sys/devices/system/cpu/cpu0/cache/index0/size").exists():
        assert cache >= 1 << 15                 # Linux names at least an L1 here
    for copy_bytes in (1 << 20, 16 << 20, 600 << 20):
        copies = blocks.ring_copies(copy_bytes, batch=4)
        assert copies >= 8
        assert copies * copy_bytes >= min(2 * (cache or 1 << 27), 1 << 30)
        assert (copies - 1) * copy_bytes < max(1 << 30, 8 * copy_bytes)
