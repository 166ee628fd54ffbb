"""`python -m specviz.bench`: the paper's Tables 1 and 2 with our models, next to what a user has today. It may
import analysis/, backends/, cpu/, decode/, models/, peers/, plots/, profile/, recording/ and stack/.

One run times, on the same prompts and settings, transformers' `generate()` (plain, with the same
draft as `assistant_model=`, and with `prompt_lookup_num_tokens=`) and our baseline, speculative,
tree and staged decoders. The loop is prompt-major (every strategy runs on a prompt before the next
prompt), so machine noise hits all strategies alike. Every run generates exactly --max-new-tokens
tokens (end-of-sequence does not stop it), so tokens/s compare like with like.

Per strategy and sampling setting it reports tokens/s (median, p25, p75 over prompts; end to end,
prefill included, as a user would time it), the speedup against HF generate and against our baseline
(medians of per-prompt ratios), tokens per target forward, bytes read per token relative to our
baseline on the same prompt (Table 1), time shares, and, under greedy decoding, on how many prompts
the output is token-for-token identical to our baseline's. Output: a printed table, a JSON file
and plotly charts (HTML and PNG). Bad input gets one line on stderr and exit code 2.

The package: `settings` (what to run), `run` (timing one generation and the whole benchmark),
`report` (per-prompt comparisons, summaries, the table, JSON and charts), `projection` (replaying
our decisions, or recordings', on random models of other sizes: a projection, never a measurement) and `cli`.
"""
from .cli import build_parser, main
from .projection import PROJECTION_SIZES, format_projection, project
from .report import compare_rows, format_table, summarise, write_outputs
from .run import ForwardClock, run_bench, run_strategy
from .settings import ALL_STRATEGIES, BenchError, parse_sampling, sampling_name

__all__ = ["ALL_STRATEGIES", "BenchError", "ForwardClock", "PROJECTION_SIZES", "build_parser", "compare_rows",
           "format_projection", "format_table", "main", "parse_sampling", "project", "run_bench", "run_strategy",
           "sampling_name", "summarise", "write_outputs"]
