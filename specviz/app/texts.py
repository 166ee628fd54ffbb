"""The page's words that are not computed: the introduction, the help under each view, and the CSS."""

INTRO = """
# specviz: watch speculative decoding at work
A language model writes one token (a word piece) at a time, and every token means reading **all** of the
model's weights from memory, which is slow. **Speculative decoding** lets cheap helpers *guess* several
tokens ahead; the big model (the **target**) then checks all the guesses in **one** pass and keeps the
ones it agrees with. The text comes out exactly as the target alone would write it, only faster.
**Staged** speculation (Spector & Ré, 2023) guesses a whole *tree* of alternatives, and speeds up the guesser
itself with an even cheaper one (an n-gram model). Press **Step** to watch one round, **Run** to play to the end,
and open **Compare** to race the strategies.
"""

TREE_HELP = """
**The speculative tree.** The grey box on the left is the last token written so far (the *root*). Every
box to its right is a guess: **blue** = the small draft model, **green** = the n-gram model, **purple** =
copying from earlier in the text (lookup). Branches are alternative guesses for the same position. The
target checks every box in one pass: the **bold line** is the path it accepted, faded boxes were rejected
(or never checked because a box before them was wrong). The **red** box at the end is the target's own next
token, which the same pass gives for free. Hover over a box for its probabilities: *q* (how likely the guesser
thought it), *p* (how likely the target thinks it) and the chance it was accepted.
"""

TEXT_HELP = """
**The text so far.** Each generated token is tinted by who proposed it. Grey is your prompt; tokens from the
latest step are outlined. Many blue/green tokens mean the guessers are doing the work and the target only checks.
"""

ACCEPT_HELP = """
**Where the tree wastes its budget.** Each cell is one position in the tree: columns are how far ahead of
the root (depth), rows are the guesser's 1st, 2nd, 3rd… choice at that spot. The number is the share of guesses
there that the target accepted, over all steps so far, and *n* how often a guess stood there. Dark cells with a
large *n* are budget spent in vain: a smaller or narrower tree would do as well.
"""

COMPARE_HELP = """
**The race.** The same prompt and settings run with plain decoding (*baseline*: one target pass per token),
single-stage *speculative* decoding (one draft proposes a chain) and *staged* decoding (a tree, drafted by a
model that is itself sped up by an n-gram model, plus a branch copied from earlier in the text), next to what you
would run instead: *llama_cpp*, llama.cpp's plain decoding of the same GGUF file with as many threads (the
**reference**: the fastest plain decoder on this machine, which every speed-up is also given against),
*llama_cpp_speculative*, llama.cpp's own speculation with the same draft file, and *hf_assisted*, transformers'
`generate()` with the same draft model (`assistant_model=`). Every lane is timed the same way: alone, one after
another, to its end, with nothing else of the app computing (the page only hears how far it got, every few
seconds). Then all lanes race on one clock, each replayed at its own times: at any moment each column shows how far
its strategy got in the same amount of its own compute time (reading the prompt included), whether or not a browser
watches on the same cores. Under greedy
decoding every lane of ours writes the same text; llama.cpp computes in its own numerics, and a difference there is
counted, not hidden.
"""

CHARTS_HELP = """
**What it cost.** *Latency*: time per generated token and in total, split into drafting, the target's verification
passes and overhead. *Tokens per target pass*: how many tokens each expensive pass produced (baseline is 1).
*Memory traffic*: bytes read from memory per generated token compared with plain decoding, as in the paper's
Table 1. On a big GPU decoding is limited by memory traffic, so fewer bytes per token means more speed.
"""

LOSSLESS_HELP = """
**Is it lossless?** Speculation promises text *distributed exactly* as the target alone would write it. Press
**Sample** to start many generations with different seeds (the prompt and settings on the left, *sample* under
Sampling), with plain decoding and with the chosen strategy, and keep the first token each one writes. The bars show
how often each token came out, beside the target's exact probability. A chi-square test then asks whether the
samples could come from one distribution: a p-value below 0.001 would mean a bug. Under greedy decoding it compares
the race's lanes token by token instead.
"""

CSS = """
.gen-text {font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 17px; line-height: 1.75;
           white-space: pre-wrap; word-break: break-word; max-height: 430px; overflow-y: auto;
           padding: 10px; border: 1px solid #ddd; border-radius: 6px; background: #fff; color: #111;}
.prompt-text {color: #6b6b6b; font-size: 14px;}
.tok {border-radius: 3px; padding: 0 1px;}
.tok-legend {font-size: 15px; margin-bottom: 6px; line-height: 2; color: #111;}
.tok-legend .tok {padding: 2px 6px; margin-right: 4px;}
.race-col {border: 1px solid #ddd; border-radius: 8px; padding: 8px; background: #fafafa; color: #111;}
.race-head {font-size: 16px; margin-bottom: 4px;}
.race-bar {height: 8px; background: #e6e6e6; border-radius: 4px; margin-bottom: 8px;}
.race-bar > div {height: 8px; background: #0072B2; border-radius: 4px;}
.race-col .gen-text {max-height: 300px; font-size: 15px;}
#status {min-height: 1.5em; font-size: 17px;}
#status .status-warn {background: #FBE3D6; border-left: 6px solid #D55E00; padding: 8px 12px; border-radius: 4px;
                      color: #111; font-weight: 600;}
"""
