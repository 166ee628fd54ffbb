"""What a benchmark runs: the strategies (ours and transformers' peers) and the sampling settings."""
from __future__ import annotations

import re

from ..peers import llama_cpp
from ..stack.strategies import STRATEGIES
from ..peers.hf import PEERS
from ..decode.sampling import Sampling

ALL_STRATEGIES = llama_cpp.PEERS + PEERS + STRATEGIES
DEFAULT_SAMPLINGS = ("greedy", "topk50")


class BenchError(ValueError):
    """Bad benchmark settings; the message is one line meant for the user."""


def parse_sampling(name: str, seed: int = 0) -> Sampling:
    """"greedy", or '-'-joined parts "tempT", "topkK", "toppP" (T defaults to 1), e.g. "topk50", "temp0.7-topp0.9"."""
    if name == "greedy":
        return Sampling(0.0, seed=seed)
    values = {"temp": 1.0, "topk": 0, "topp": 1.0}
    for part in name.split("-"):
        match = re.fullmatch(r"(temp|topk|topp)([0-9.]+)", part)
        if not match:
            raise BenchError(f"unknown sampling {name!r}: use greedy or parts like topk50, temp0.7, topp0.9")
        key, value = match.groups()
        try:
            values[key] = int(value) if key == "topk" else float(value)
        except ValueError:
            raise BenchError(f"unknown sampling {name!r}: {value!r} is not a number") from None
    sampling = Sampling(values["temp"], values["topk"], values["topp"], seed)
    if sampling.greedy:
        raise BenchError(f"sampling {name!r} has temperature 0: call it greedy")
    sampling.validate()
    return sampling


def sampling_name(sampling: Sampling) -> str:
    """The name parse_sampling reads back: "greedy", or the parts that differ from their defaults."""
    if sampling.greedy:
        return "greedy"
    parts = [f"temp{sampling.temperature:g}" if sampling.temperature != 1.0 else "",
             f"topk{sampling.top_k}" if sampling.top_k else "",
             f"topp{sampling.top_p:g}" if sampling.top_p != 1.0 else ""]
    return "-".join(p for p in parts if p) or "temp1"


def with_seed(sampling: Sampling, seed: int) -> Sampling:
    return Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)


def usable_strategies(stack, wanted: list[str]) -> tuple[list[str], list[str]]:
    """The strategies this stack can run, and one note per strategy it cannot."""
    usable, notes = [], []
    for strategy in wanted:
        if strategy in llama_cpp.PEERS:
            reason = llama_cpp.missing_reason(strategy, llama_cpp.gguf_file(stack.target.name),
                                              llama_cpp.gguf_file(stack.assistant()[0]))
            if reason:
                notes.append(f"{strategy} skipped: {reason}")
                continue
        if strategy == "hf_assisted" and stack.assistant()[0] is None:
            notes.append("hf_assisted skipped: the stack has no neural draft model (pass --draft MODEL)")
            continue
        if strategy in STRATEGIES:
            try:
                stack.drafter_for(strategy)
            except ValueError as exc:
                notes.append(f"{strategy} skipped: {exc}")
                continue
            if strategy != "baseline" and not stack.drafts:
                notes.append(f"{strategy} skipped: the stack has no drafter")
                continue
        usable.append(strategy)
    return usable, notes

