"""scripts/race_watched.py's checks on made-up races: the benchmark that holds the app's promise about a watched race
(its lanes as fast as headless, the same winner, a verdict soon after the lanes) must fail where a page slows it."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "race_watched.py"
spec = importlib.util.spec_from_file_location("race_watched", SCRIPT)
race_watched = importlib.util.module_from_spec(spec)
spec.loader.exec_module(race_watched)

BEFORE = {"llama_cpp": 10.0, "baseline": 8.0, "staged": 14.0}
AFTER = {"llama_cpp": 11.0, "baseline": 8.4, "staged": 13.0}


def watched(rates, verdict_s=5.0, lanes_s=(2.0, 2.0, 1.0)):
    return {"rates": rates, "verdict_s": verdict_s, "lanes_s": list(lanes_s)}


def test_a_race_as_fast_as_headless_passes_every_check():
    passed = race_watched.checks(watched({"llama_cpp": 10.5, "baseline": 8.1, "staged": 13.5}), BEFORE, AFTER)
    assert passed == {"llama_cpp": True, "baseline": True, "staged": True, "the winner": True, "the verdict": True}


def test_a_lane_slowed_by_the_page_a_changed_winner_and_a_late_verdict_fail():
    slowed = race_watched.checks(watched({"llama_cpp": 10.5, "baseline": 8.1, "staged": 0.84 * 13.0}), BEFORE, AFTER)
    assert not slowed["staged"] and slowed["llama_cpp"] and slowed["the winner"]
    lost = race_watched.checks(watched({"llama_cpp": 12.0, "baseline": 8.1, "staged": 11.5}), BEFORE, AFTER)
    assert not lost["the winner"] and lost["staged"] and lost["llama_cpp"]
    late = race_watched.checks(watched(AFTER, verdict_s=7.6), BEFORE, AFTER)
    assert not late["the verdict"] and all(late[lane] for lane in AFTER)


def test_where_headless_races_put_the_first_two_close_either_may_win_watched():
    close = {"llama_cpp": 13.0, "baseline": 8.0, "staged": 14.0}
    swapped = watched({"llama_cpp": 13.5, "baseline": 8.1, "staged": 13.2})
    assert race_watched.checks(swapped, close, close)["the winner"]


def test_the_table_names_each_lane_and_what_failed():
    slowed = watched({"llama_cpp": 10.5, "baseline": 8.1, "staged": 9.0})
    rounds = [{"before": BEFORE, "after": AFTER, "watched": slowed}]
    passed = race_watched.checks(rounds[0]["watched"], BEFORE, AFTER)
    text = race_watched.table(rounds, passed)
    assert "| staged | 14.0, **9.0**, 13.0 | NO |" in text and "| baseline | 8.0, **8.1**, 8.4 | yes |" in text
    assert "| the winner |" in text and "| verdict after the click | 5.0 s (lanes 5.0 s) | yes |" in text
