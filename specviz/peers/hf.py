"""What a user has today: transformers' `generate()`, plain, with an assistant model, or with prompt lookup.

Each call generates exactly `max_new_tokens` tokens (end-of-sequence does not stop it, as in the
engine's benchmark runs), so tokens/s compares like with like. Forward passes are counted with
forward hooks on the models, so the table can show tokens per target forward for these rows too.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter

import torch

from ..decode.sampling import Sampling

PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")
PROMPT_LOOKUP_TOKENS = 10        # transformers' documented example value


@dataclass
class PeerRun:
    tokens: list[int]
    wall_s: float
    target_forwards: int
    draft_forwards: int


@contextmanager
def count_forwards(*models: torch.nn.Module | None):
    """Yield a list whose entry i counts the top-level forward calls of models[i] in the block."""
    counts = [0] * len(models)
    handles = []
    for i, model in enumerate(models):
        if model is not None:
            def hook(module, args, output, i=i):
                counts[i] += 1
            handles.append(model.register_forward_hook(hook))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


def sampling_kwargs(sampling: Sampling) -> dict:
    if sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p}


class ArrivalClock:
    """A `generate(streamer=...)` streamer that notes when each chunk of new tokens arrives (seconds
    after `start`): assisted generation hands over every accepted run of tokens as one chunk."""

    def __init__(self):
        self.started = perf_counter()
        self.chunks: list[tuple[float, list[int]]] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:           # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        self.chunks.append((perf_counter() - self.started, value.reshape(-1).tolist()))

    def end(self) -> None:
        pass


def hf_generate(model: torch.nn.Module, prompt_ids: list[int], sampling: Sampling, max_new_tokens: int,
                assistant: torch.nn.Module | None = None, prompt_lookup_tokens: int | None = None,
                stop_at_eos: bool = False, streamer: ArrivalClock | None = None) -> PeerRun:
    """One `model.generate()` call; `assistant` = assisted generation, `prompt_lookup_tokens` = prompt
    lookup. Without `stop_at_eos` it makes exactly max_new_tokens tokens (the bench's like-for-like)."""
    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                  min_new_tokens=None, streamer=streamer, **sampling_kwargs(sampling))
    if not stop_at_eos:
        kwargs["eos_token_id"] = None
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    if prompt_lookup_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_tokens
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)
    with count_forwards(model, assistant) as counts, torch.inference_mode():
        started = perf_counter()
        if streamer is not None:
            streamer.started = started
        out = model.generate(ids, **kwargs)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        wall = perf_counter() - started
    return PeerRun(tokens=out[0, ids.shape[1]:].tolist(), wall_s=wall, target_forwards=counts[0],
                   draft_forwards=counts[1])
