"""The shipped artifacts: the stage-1 draft, the stage-2 trigram and their manifest."""
import json
from pathlib import Path

import pytest
import torch

ASSETS = Path(__file__).resolve().parent.parent / "assets"
TARGET_VOCAB = 49152          # SmolLM2-135M-Instruct
TARGET_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
AGREEMENT_FLOOR = 0.35         # whole of HumanEval 0.41: see MANIFEST.md


def asset_files() -> list[str]:
    return sorted(str(p.relative_to(ASSETS)) for p in ASSETS.rglob("*") if p.is_file())


def test_assets_fit_the_size_budget():
    total = sum((ASSETS / f).stat().st_size for f in asset_files())
    assert total < 30 * 2 ** 20


def test_draft_loads_with_auto_model_and_shares_the_target_vocabulary():
    from transformers import AutoModelForCausalLM
    draft = AutoModelForCausalLM.from_pretrained(ASSETS / "draft", dtype=torch.float32)
    config = draft.config
    assert config.vocab_size == TARGET_VOCAB
    assert config.tie_word_embeddings
    for name, value in TARGET_IDS.items():
        assert getattr(config, name) == value
    fp32_bytes = sum(p.numel() * 4 for p in draft.parameters())
    assert fp32_bytes < 538_000_000 / 8          # < 1/8 of the target's bytes read per token
    with torch.no_grad():
        logits = draft(input_ids=torch.tensor([[1604, 275, 24, 104, 727]])).logits
    assert logits.shape == (1, 5, TARGET_VOCAB)
    assert torch.isfinite(logits).all()


def test_trigram_loads_as_its_stored_arrays_and_normalises():
    """What keeps the load short: each table in the file becomes one array of the model as it is stored, with no
    pass over its n-grams (no dict or list built per entry)."""
    from dataclasses import fields

    import numpy as np

    from specviz.decode.drafters.ngram import KatzTrigram
    trigram = KatzTrigram.load(ASSETS / "trigram.npz")
    with np.load(ASSETS / "trigram.npz") as stored:
        tables = {f.name for f in fields(trigram) if f.init and isinstance(getattr(trigram, f.name), np.ndarray)}
        assert tables == set(stored.files) - {"format", "vocab_size", "d2", "d3"}
        for name in tables:
            assert getattr(trigram, name).dtype == stored[name].dtype, name
    assert trigram.vocab_size == TARGET_VOCAB
    for context in ([], [1604], [1604, 275], [275, 24], [49000, 49001]):
        p = trigram.probs(context).double()
        assert p.shape == (TARGET_VOCAB,)
        assert abs(float(p.sum()) - 1.0) < 1e-4
        best = trigram.top(context, 3)
        assert best[0][1] == pytest.approx(float(p.max()), rel=1e-4)


def test_manifest_lists_every_asset_and_matches_the_markdown():
    manifest = json.loads((ASSETS / "manifest.json").read_text())
    assert set(manifest["files"]) == set(asset_files())
    for name, entry in manifest["files"].items():
        if name not in ("manifest.json", "MANIFEST.md"):     # index files: no own size
            assert entry["bytes"] == (ASSETS / name).stat().st_size
    markdown = (ASSETS / "MANIFEST.md").read_text()
    for artifact in manifest["artifacts"].values():
        assert artifact["command"] in markdown


@pytest.mark.slow
def test_shipped_draft_agrees_with_the_target_and_is_calibrated(smollm2):
    """On the target's own greedy continuations of HumanEval prompts, teacher-forced: the draft's
    top-1 must match often, and its top-1 probability must be about as high as that match rate
    (dynamic trees are grown by these probabilities: an underconfident draft starves them)."""
    from transformers import AutoModelForCausalLM

    from specviz.bench.prompts import load_prompts
    draft = AutoModelForCausalLM.from_pretrained(ASSETS / "draft", dtype=torch.float32)
    hits, confidence = [], []
    for prompt in load_prompts(limit=8):
        ids = smollm2.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            sequence = smollm2.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
            logits = draft(input_ids=sequence[:, :-1]).logits[0, len(ids) - 1:]
        top = logits.softmax(-1).max(-1)
        hits += (top.indices == sequence[0, len(ids):]).tolist()
        confidence += top.values.tolist()
    agreement, mean_confidence = sum(hits) / len(hits), sum(confidence) / len(confidence)
    assert agreement >= AGREEMENT_FLOOR
    assert abs(mean_confidence - agreement) < 0.1, (mean_confidence, agreement)
