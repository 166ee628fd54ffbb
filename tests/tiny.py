"""Tiny randomly initialised models built from configs, for fast offline tests."""
from __future__ import annotations

import copy
import functools

import torch

from specviz.cpu.matmul import install


class TinyTokenizer:
    """Decodes ids as <id>; enough for trace records."""
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def get_vocab(self):
        return {f"<{i}>": i for i in range(64)}


@functools.lru_cache(maxsize=None)
def tiny_model(family: str = "llama", seed: int = 0, vocab: int = 64, layers: int = 2, hidden: int = 32,
               dtype: torch.dtype = torch.float32, attn: str = "sdpa", noise: float = 0.0, noise_seed: int = 1):
    """noise > 0: the same model with Gaussian noise of that scale added to every weight, which
    makes a draft that agrees with the noiseless target part of the time."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if family == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None, attn_implementation=attn)
        model = LlamaForCausalLM(config)
    elif family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                            bos_token_id=None, eos_token_id=None, attn_implementation=attn)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(family)
    # Sharpen the output distribution so greedy paths are not near-ties and drafts can agree.
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    if noise:
        generator = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * noise * p.std())
    model.generation_config.eos_token_id = None
    model = model.to(dtype).eval().requires_grad_(False)
    install(model)              # as specviz.models.load does: the engine's products, where they apply
    return model


def tiny_int4_model(noise: float = 0.0, noise_seed: int = 1):
    """The llama family 64 wide in 4 bits, run by specviz's own forward (specviz/cpu/decoder.py) and the 4-bit kernel: a
    copy, since tiny_model's models are shared and quantizing replaces their layers."""
    from specviz.models.precision import quantize_in_place
    return quantize_in_place(copy.deepcopy(tiny_model("llama", hidden=64, noise=noise, noise_seed=noise_seed)), "int4")


class WordTokenizer(TinyTokenizer):
    """Each whitespace-separated word becomes one id (the sum of its code points, modulo the vocabulary)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [sum(map(ord, word)) % 64 for word in text.split()]}


def flat_plan():
    """Staged's plan on a machine where verifying costs nothing and a draft level a tenth of a token (a GPU's
    regime): minimum scores of 0.1. A tiny draft costs what its tiny target does, so a measured plan would let
    no guess join, and the tests of drafting would draft nothing."""
    from specviz.decode.costs import DRAFT_FEED, SIZES, TreePlan
    return TreePlan(dict.fromkeys(SIZES, 0.01), {1: 0.001, DRAFT_FEED: 0.001}, "pinned by the tests")


def pin_plan(stack, plan=flat_plan):
    """Give a stack that can run staged the plan `plan()` instead of one measured or stored."""
    stack.plans.pin(plan())
    return stack


def tiny_stack(drafts=("draft", "lookup"), tokenizer=None, noise: float = 0.3, loaded: dict | None = None,
               plan=flat_plan, profile=None, int4: bool = False):
    """The model stack the tests build: a tiny target and, where `drafts` names "draft", a noisy copy of
    it as the draft model (`loaded` adds other drafters, e.g. an n-gram table). plan: a function giving staged's
    plan (None: measured on first use, as a real stack's). profile: the machine profile it plans from (None: the
    default file's, specviz/profile/store.py). int4: both models 64 wide in 4 bits, run by specviz's own forward
    (specviz/cpu/decoder.py) as the real pair's are."""
    from specviz.models.load import LoadedModel
    from specviz.profile.store import Profile
    from specviz.stack.stack import Stack

    made = tiny_int4_model if int4 else functools.partial(tiny_model, "llama")
    tok = tokenizer or TinyTokenizer()
    sources = dict(loaded or {})
    if "draft" in drafts:
        sources["draft"] = LoadedModel("draft", made(noise=noise), tok)
    stack = Stack(LoadedModel("tiny-target", made(), tok), list(drafts), sources, profile=profile or Profile())
    return stack if plan is None else pin_plan(stack, plan)


# a word-level chat template: the user's turn between w1 and w2, then w3 opens the assistant's
WORD_CHAT_TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                      "{% if add_generation_prompt %}w3{% endif %}")


def save_with_word_tokenizer(model, path, chat_template: str | None = None) -> None:
    """Save a tiny model with a word-level tokenizer ("w0" .. "w63"), loadable as --target PATH."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
