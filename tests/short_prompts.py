"""One-token prompts, where the next token is read from the first position's logits (the attention sink's): a model
of the file's blocks must follow the file's float32 model there, not write digits."""
from __future__ import annotations

import torch

ONE_TOKEN = ("def", "import", "class", "The", "Hello", "#", "print", "for", "from", "Once")
NEAR_TIE = 0.2         # nats between the float model's top two: rounding at later positions may break such a tie


def greedy_disagreements(exact, ours, tokenizer, prompt: str, steps: int = 8) -> list[tuple[int, float]]:
    """Along the float model's own greedy text after `prompt`, the positions (and the float model's margin there)
    where `ours` picks another top token, the near ties aside."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    found = []
    with torch.inference_mode():
        for _ in range(steps):
            feed = torch.tensor([ids])
            exact_top = torch.log_softmax(exact(feed).logits[0, -1].double(), -1).topk(2)
            if int(ours(feed).logits[0, -1].argmax()) != int(exact_top.indices[0]):
                margin = float(exact_top.values[0] - exact_top.values[1])
                if margin > NEAR_TIE:
                    found.append((len(ids) - 1, margin))
            ids.append(int(exact_top.indices[0]))
    return found


def greedy_text(model, tokenizer, prompt: str, steps: int = 8) -> str:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return tokenizer.decode(ids)
