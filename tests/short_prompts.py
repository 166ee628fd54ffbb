"""One-token prompts, where the next token is read from the first position's logits (the attention sink's): a model
of the file's blocks must follow the file's float32 model there, not write digits."""
from __future__ import annotations

import torch

ONE_TOKEN = ("def", "import", "class", "The", "Hello", "#", "print", "for", "from", "Once")
NEAR_TIE = 0.2         # nats between the float model's top two: rounding at later positions may break such a tie


def greedy_disagreements(exact, ours, tokenizer, prompt: str, steps: int = 8) -> list[tuple[int, float]]:
    """Along the float model's own greedy text after `prompt`, every position (with the float model's margin there)
    where `ours` picks another top token. None at all means both write the same greedy text: each follows the
    other's path one token at a time."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    found = []
    with torch.inference_mode():
        for _ in range(steps):
            feed = torch.tensor([ids])
            exact_top = torch.log_softmax(exact(feed).logits[0, -1].double(), -1).topk(2)
            if int(ours(feed).logits[0, -1].argmax()) != int(exact_top.indices[0]):
                found.append((len(ids) - 1, float(exact_top.values[0] - exact_top.values[1])))
            ids.append(int(exact_top.indices[0]))
    return found


def beyond_near_ties(found: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(position, margin) for position, margin in found if margin > NEAR_TIE]
