"""The reference speed: the fastest plain decoder on this machine for a stack, which every speed-up is also
given against. llama.cpp's plain decoding of the same GGUF file where it runs (on our 2-core CPUs it reads
the Qwen2.5-Coder-1.5B about twice as fast as our fastest baseline); else our own baseline, named with its
precision. A ratio against a baseline that a setting makes 3x faster is not a result."""
from __future__ import annotations

import torch

from . import llama_cpp


def entry(strategy: str | None, precision: str, how: str, tokens_per_s: float | None = None) -> dict:
    """What a `vs ref` ratio is taken against, and how it was measured (the bench's and the CLI's `reference`);
    strategy None: no plain decoder ran (a bench without llama_cpp and baseline rows)."""
    what = (f"llama.cpp plain decoding ({llama_cpp.PROGRAMS[llama_cpp.PLAIN]}) of the same GGUF file"
            if strategy == llama_cpp.PLAIN else f"our baseline in {precision}" if strategy else
            "none: this run measured no plain decoder (add llama_cpp or baseline to --strategies)")
    return {"strategy": strategy, "what": what, "tokens_per_s": tokens_per_s, "how": how}


def measure(stack, prompt_ids: list[int], sampling, max_new_tokens: int) -> dict:
    """llama.cpp's plain decoding of this very prompt, now (prompt read included, as ours); where it cannot
    run, an entry whose `how` says why in one line and whose speed is None."""
    threads = torch.get_num_threads()
    try:
        run, _ = llama_cpp.generate_for(stack, llama_cpp.PLAIN, prompt_ids, sampling, max_new_tokens)
    except llama_cpp.LlamaCppMissing as exc:
        return entry("baseline", stack.precision(), f"llama.cpp did not run: {exc}")
    return entry(llama_cpp.PLAIN, stack.precision(), f"measured just now on this prompt, {threads} threads, "
                 "prompt read included", run.new_tokens / run.seconds)
