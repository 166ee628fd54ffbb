"""How a prompt is fed to the model, and which way it is fed unless told: the page, the CLI and the bench all ask here.

*chat* puts the prompt in the model's chat template as a user's turn, the assistant's turn opened; *completion* feeds
it as written. An instruct model answers plain language well only in chat; code (the HumanEval tasks, as in the
paper) is continued as written.
"""
from __future__ import annotations

import codeop
import warnings

PROMPT_FORMATS = ("chat", "completion")
CHAT, COMPLETION = PROMPT_FORMATS


class NoChatTemplate(ValueError):
    """Chat was asked of a model whose tokenizer has no chat template."""


def default_format(prompt: str, tokenizer=None) -> str:
    """Completion for a prompt that Python reads as code, or as code that goes on (the HumanEval tasks, `def fib(n):`,
    the page's days-of-the-week pattern, which is a tuple of names); chat for plain language, which Python refuses,
    where the model has a chat template (a `tokenizer` given without one, a base model's, takes text as written)."""
    if tokenizer is not None and not getattr(tokenizer, "chat_template", None):
        return COMPLETION
    with warnings.catch_warnings():         # a prose prompt may hold what Python warns about, e.g. "\d"
        warnings.simplefilter("ignore")
        try:
            codeop.compile_command(prompt, "<prompt>", "exec")     # None where the code is not finished: still code
        except (SyntaxError, ValueError, OverflowError):
            return CHAT
    return COMPLETION


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as a user's turn of the model's chat template, the assistant's turn opened."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate("This model has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_prompt(tokenizer, prompt: str, prompt_format: str) -> list[int]:
    """The prompt's token ids in that format; an empty prompt is refused."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {prompt_format!r}; choose {' or '.join(PROMPT_FORMATS)}")
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty")
    if prompt_format == CHAT:
        return chat_ids(tokenizer, prompt)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]
