"""The analysis of a speculative strategy's rounds (specviz/analysis/round_cost.py), by hand, and where the app says
it."""
import math

import pytest

from specviz.app import words
from specviz.analysis.round_cost import RoundCost, analysis

# An AVX2 machine's staged run: 10 rounds of 260 ms (125 drafting, 129 verifying), 5 tokens each; plain 52 ms a token
AVX2 = dict(rounds=10, tokens=50, decode_s=2.6, phase_s={"stage1_draft": 1.2, "stage2_draft": 0.05, "verify": 1.29,
                                                          "tree": 0.03}, plain_token_s=0.052)


def test_a_round_and_what_would_reach_the_goal_by_hand():
    cost = RoundCost.of(**AVX2)
    assert cost.round_s == pytest.approx(0.26) and cost.tokens == 5
    assert (cost.draft_s, cost.verify_s, cost.other_s) == pytest.approx((0.125, 0.129, 0.006))
    assert cost.speedup == pytest.approx(1.0)
    assert cost.round_needed_s(1.25) == pytest.approx(0.208)
    assert cost.draft_factor(1.25) == pytest.approx(0.125 / (0.125 - 0.052))
    assert cost.tokens_needed(1.25) == pytest.approx(6.25)
    text = analysis("staged", cost)
    for words_ in ("a round took 260 ms", "drafting 125 ms", "verifying 129 ms", "5.0 tokens", "1.00× in decoding",
                   "at most 208 ms", "a draft 1.7× cheaper (125 ms → 73 ms a round)",
                   f"{cost.tokens_needed(1.25):.1f} tokens a round at today's cost"):
        assert words_ in text, words_


def test_a_goal_met_needs_nothing_and_a_dear_verification_no_draft_can_save():
    fast = RoundCost.of(**{**AVX2, "plain_token_s": 0.07})
    assert fast.speedup == pytest.approx(50 * 0.07 / 2.6) and fast.draft_factor(1.25) is None
    assert analysis("staged", fast).endswith("That meets 1.25×.")
    dear = RoundCost.of(**{**AVX2, "phase_s": {"stage1_draft": 0.02, "verify": 2.5}})
    assert math.isinf(dear.draft_factor(1.25))
    assert "no draft, however cheap" in analysis("staged", dear)


@pytest.mark.parametrize("bad", [dict(rounds=0), dict(tokens=0), dict(decode_s=0.0), dict(plain_token_s=0.0)])
def test_nothing_to_analyse_gives_none(bad):
    assert RoundCost.of(**{**AVX2, **bad}) is None


def test_the_race_verdict_analyses_staged_against_baseline_of_the_same_race():
    base = {"new_tokens": 50, "steps": 50, "wall_s": 2.6, "phase_s": {"verify": 2.58}}
    staged = {"new_tokens": 50, "steps": 10, "wall_s": 2.6, "phase_s": AVX2["phase_s"]}
    note = words.round_note({"baseline": base, "staged": staged})
    assert note == analysis("staged", RoundCost.of(**{**AVX2, "plain_token_s": 2.6 / 50}))
    assert words.round_note({"staged": staged}) == ""                  # no baseline lane: nothing to compare with
    assert words.round_note({"baseline": base, "speculative": staged}) == ""
    assert words.round_note({"baseline": base, "speculative": staged}, "speculative").startswith(
        "Analysis of speculative's rounds")


def test_a_draft_reading_the_prompt_is_named_apart_from_the_rounds_drafting():
    cost = RoundCost.of(**{**AVX2, "decode_s": 3.0, "phase_s": {**AVX2["phase_s"], "prompt_read": 0.4}})
    assert (cost.draft_s, cost.read_s, cost.other_s) == pytest.approx((0.125, 0.04, 0.006))
    assert cost.round_s == pytest.approx(0.3)
    assert cost.draft_factor(1.25) == pytest.approx(0.125 / (0.125 - (0.3 - 0.208)))   # the read is no draft forward
    assert "the draft reading the prompt 40 ms (once, spread over the rounds)" in analysis("staged", cost)
    assert "reading the prompt" not in analysis("staged", RoundCost.of(**AVX2))


def test_the_targets_prompt_read_raises_the_speed_up_decoding_needs():
    """Tokens/s that count the target's prompt read (the bench's, the race's) need more in decoding: with a share p of
    plain decoding's whole time, G over the whole is (1 - p) / (1 / G - p) in decoding."""
    cost = RoundCost.of(**AVX2, read_share=0.3)
    assert cost.decode_goal(1.25) == pytest.approx(0.7 / (0.8 - 0.3))          # 1.40
    assert cost.round_needed_s(1.25) == pytest.approx(5 * 0.052 / 1.4)
    assert cost.tokens_needed(1.25) == pytest.approx(1.4 * 0.26 / 0.052)
    assert cost.draft_factor(1.25) == pytest.approx(0.125 / (0.125 - (0.26 - 5 * 0.052 / 1.4)))
    text = analysis("staged", cost)
    for words_ in ("took 30% of plain decoding's whole time", "1.25× there needs 1.40× in decoding",
                   f"at most {5 * 0.052 / 1.4 * 1e3:.0f} ms"):
        assert words_ in text, words_
    assert RoundCost.of(**AVX2).decode_goal(1.25) == 1.25                       # no share given: the goal as it is
    hopeless = RoundCost.of(**AVX2, read_share=0.85)                             # 1 / 1.25 = 0.8 < 0.85
    assert math.isinf(hopeless.decode_goal(1.25))
    assert analysis("staged", hopeless).endswith("more than any decoding can give.")


def test_the_race_verdict_counts_the_baseline_lanes_prompt_read():
    base = {"new_tokens": 50, "steps": 50, "wall_s": 2.6, "phase_s": {"verify": 2.58}}
    staged = {"new_tokens": 50, "steps": 10, "wall_s": 2.6, "phase_s": AVX2["phase_s"]}
    note = words.round_note({"baseline": base, "staged": staged}, baseline_whole_s=3.25)
    assert note == analysis("staged", RoundCost.of(**{**AVX2, "plain_token_s": 2.6 / 50}, read_share=0.2))
    assert "took 20% of plain decoding's whole time" in note
