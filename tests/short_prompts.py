"""One-token prompts, where the next token is read from the first position's logits (the attention sink's): a model
of the file's blocks must follow the file's float32 model there, not write digits."""
from __future__ import annotations

import torch

ONE_TOKEN = ("def", "import", "class", "The", "Hello", "#", "print", "for", "from", "Once")
NEAR_TIE = 0.2         # nats between the float model's top two: rounding at later positions may break such a tie


def greedy_disagreements(exact, ours, tokenizer, prompts, steps: int = 8) -> dict[str, list[tuple[int, float]]]:
    """For each prompt, along the float model's own greedy text after it, every position (with the float model's
    margin there) where `ours` picks another top token. None at all means both write the same greedy text: each
    follows the other's path one token at a time. The float model reads prompts of one length as one batch (it
    reads its weights once a step for all of them); `ours` reads each alone."""
    found: dict[str, list[tuple[int, float]]] = {}
    by_length: dict[int, list[str]] = {}
    for prompt in prompts:
        by_length.setdefault(len(tokenizer(prompt, add_special_tokens=False)["input_ids"]), []).append(prompt)
    for batch in by_length.values():
        ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in batch]
        with torch.inference_mode():
            for _ in range(steps):
                exact_top = torch.log_softmax(exact(torch.tensor(ids)).logits[:, -1].double(), -1).topk(2)
                for row, prompt in enumerate(batch):
                    best = int(exact_top.indices[row, 0])
                    if int(ours(torch.tensor([ids[row]])).logits[0, -1].argmax()) != best:
                        margin = float(exact_top.values[row, 0] - exact_top.values[row, 1])
                        found.setdefault(prompt, []).append((len(ids[row]) - 1, margin))
                    ids[row].append(best)
    return {prompt: found.get(prompt, []) for prompt in prompts}


def beyond_near_ties(found: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(position, margin) for position, margin in found if margin > NEAR_TIE]
