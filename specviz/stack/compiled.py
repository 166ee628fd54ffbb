"""A stack's models compiled for decoding (CUDA graphs on a GPU): the target and each draft model, and the static KV
cache length their decoders share. The first feed of each bucket size compiles (minutes on a small CPU)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backends.choose import open_cache
from ..models.load import LoadedModel, compile_model


@dataclass
class CompiledModels:
    target: object = None                   # the compiled target every decoder uses (None: not compiled)
    drafts: dict[str, object] = field(default_factory=dict)     # ...and compiled draft models, by spec
    static_len: int | None = None           # ...and the static KV cache length they share, if fixed


def draft_body(draft: LoadedModel, output_vocab: torch.Tensor | None) -> torch.nn.Module:
    """What a draft's static forwards run: the model, or its body where its output layer is computed for a
    vocabulary of its own (kv_model.KVModel)."""
    return draft.model.base_model if output_vocab is not None else draft.model


def compile_models(target: LoadedModel, drafts: dict[str, LoadedModel], vocabulary,
                   context: int | None = None) -> CompiledModels:
    """Compile the target's and the draft models' decoding forwards (drafts by spec; vocabulary: the stack's
    DraftVocabulary); decoders then keep their KV caches static. context: one static cache length for every decoder,
    compiled now for every bucket (else each decoder sizes its own and compiles what it meets)."""
    vocabs = {spec: vocabulary.for_draft(draft, []) for spec, draft in drafts.items()}
    compiled = CompiledModels(compile_model(target.model),
                              {spec: compile_model(draft_body(draft, vocabs[spec])) for spec, draft in drafts.items()},
                              context)
    if context is not None:
        warm = [(target.model, None, compiled.target)] + [
            (draft.model, vocabs[spec], compiled.drafts[spec]) for spec, draft in drafts.items()]
        with torch.inference_mode():
            for model, output_vocab, copy in warm:
                open_cache(model, "compile", output_vocab, static_len=context, compiled=copy).compile_buckets()
    return compiled
