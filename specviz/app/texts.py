"""The page's words that are not computed: the introduction, the help of each view, and the CSS.

Each view shows two sentences at most (`HELP[view].shown`); the rest opens on request (`HELP[view].more`), and
docs/REFERENCE.md ("The app, view by view") has all of it. How the race times its lanes is said in race.py's words
(IN_TURN, ONE_AFTER_ANOTHER), which tests/test_app.py checks against what time_lanes does.
"""
from __future__ import annotations

from dataclasses import dataclass

from .race import IN_TURN, ONE_AFTER_ANOTHER


@dataclass(frozen=True)
class Help:
    shown: str          # at most two sentences, always visible
    more: str = ""      # the rest, in a fold


TITLE = "# specviz: watch staged speculative decoding at work"

HELP = {
    "intro": Help(
        "Cheap helpers guess several tokens ahead, and the big model checks all the guesses in **one** pass: the text "
        "comes out exactly as the big model alone would write it, only faster. Press **Step** to watch one round, or "
        "open **Compare** to race the strategies.",
        "A language model writes one token (a word piece) at a time, and every token means reading **all** of the "
        "model's weights from memory, which is slow. **Speculative decoding** lets cheap helpers *guess* several "
        "tokens ahead; the big model (the **target**) then checks all the guesses in one pass and keeps the ones it "
        "agrees with. **Staged** speculation (Spector & Ré, 2023) guesses a whole *tree* of alternatives, and speeds "
        "up the guesser itself with an even cheaper one (an n-gram model). **Run** plays a generation to its end."),
    "tree": Help(
        "**The speculative tree**: every box right of the grey root is a guess, coloured by who guessed it; the "
        "**bold line** is the path the target accepted, and the **red** box is the target's own next token, free "
        "from the same pass. Hover over a box for its probabilities.",
        "**Blue** = the small draft model, **green** = the n-gram model, **purple** = copying from earlier in the "
        "text (lookup). Branches are alternative guesses for the same position. Faded boxes were rejected, or never "
        "checked because a box before them was wrong. The hover gives *q* (how likely the guesser thought the "
        "token), *p* (how likely the target thinks it) and the chance it was accepted."),
    "text": Help(
        "**The text so far**: each generated token is tinted by who proposed it, and the latest step's tokens are "
        "outlined. Grey is your prompt, and in chat mode the model's chat template around it."),
    "accept": Help(
        "**Where the tree wastes its budget**: each cell is one position in the tree (depth across, the guesser's "
        "1st, 2nd, 3rd… choice down), with the share of guesses there that the target accepted. Dark cells with a "
        "large *n* are budget spent in vain.",
        "The share counts every step so far, and *n* how often a guess stood there. A smaller or narrower tree would "
        "do as well where whole columns stay dark."),
    "compare": Help(
        "**The race**: plain decoding (*baseline*), one draft's chain (*speculative*) and *staged* on the same "
        "prompt, beside llama.cpp (the reference) and HF's assisted generation. Each lane is timed alone, then all "
        "race on one clock at their own speed.",
        f"How the lanes are timed: each step of each lane runs alone, with nothing else of the app computing (the "
        f"page hears how far they got every few seconds); {IN_TURN}, so that a change in the machine's speed touches "
        f"them alike; {ONE_AFTER_ANOTHER}. Then all lanes race on one clock, each replayed at its own times: at any "
        "moment each column shows how far its strategy got in the same amount of its own compute time (reading the "
        "prompt included), whether or not a browser watches on the same cores. *llama_cpp* reads the same GGUF file "
        "with as many threads: the fastest plain decoder on this machine, which every speed-up is also given "
        "against. *llama_cpp_speculative* uses the same draft file, *hf_assisted* is transformers' `generate()` "
        "with the same draft model (`assistant_model=`). Every lane stops at the model's end of text. Under greedy "
        "decoding every lane of ours writes the same text; llama.cpp computes in its own numerics, and a difference "
        "there is counted, not hidden."),
    "charts": Help(
        "**What it cost**: time per token split into drafting, verification and overhead; tokens per target pass "
        "(baseline makes 1); and bytes read from memory per token against plain decoding, as in the paper's "
        "Table 1.",
        "On a big GPU decoding is limited by memory traffic, so fewer bytes per token means more speed; on a small "
        "CPU each extra token verified also costs compute, which the regime panel below measures."),
    "lossless": Help(
        "**Is it lossless?** Speculation promises text *distributed exactly* as the target alone would write it: "
        "**Sample** draws the first token of many generations with plain decoding and with the chosen strategy, "
        "beside the target's exact probabilities.",
        "Choose *sample* under Sampling first; the prompt and settings on the left are used. A chi-square test then "
        "asks whether the samples could come from one distribution: a p-value below 0.001 would mean a bug. Under "
        "greedy decoding it compares the race's lanes token by token instead."),
}

MEASURED_TITLE = "How this was measured"
MORE_TITLE = "More about this view"

CSS = """
.gen-text {font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 17px; line-height: 1.75;
           white-space: pre-wrap; word-break: break-word; max-height: 430px; overflow-y: auto;
           padding: 10px; border: 1px solid #ddd; border-radius: 6px; background: #fff; color: #111;}
.prompt-text {color: #6b6b6b; font-size: 14px;}
.tok {border-radius: 3px; padding: 0 1px;}
.tok-legend {font-size: 15px; margin-bottom: 6px; line-height: 2; color: #111;}
.tok-legend .tok {padding: 2px 6px; margin-right: 4px;}
.race-col {border: 1px solid #ddd; border-radius: 8px; padding: 8px; background: #fafafa; color: #111;}
.race-head {font-size: 15px; margin-bottom: 4px;}
.race-bar {height: 8px; background: #e6e6e6; border-radius: 4px; margin-bottom: 8px;}
.race-bar > div {height: 8px; background: #0072B2; border-radius: 4px;}
.race-col .gen-text {min-height: 120px; max-height: 330px; font-size: 14px; line-height: 1.55;}
#lanes {gap: 10px;}
#status {min-height: 1.5em; font-size: 17px;}
#status .status-warn {background: #FBE3D6; border-left: 6px solid #D55E00; padding: 8px 12px; border-radius: 4px;
                      color: #111; font-weight: 600;}
"""
