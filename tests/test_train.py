"""Training helpers that shape the shipped draft's data."""
import numpy as np
import pytest
import torch
from tiny import tiny_model

from specviz.train import load_labelled, save_labelled, teacher_forced_labels


def test_teacher_forced_labels_are_the_models_top_k_at_every_position(tmp_path):
    model = tiny_model("llama")
    windows = np.random.default_rng(0).integers(0, 64, size=(3, 10))
    labels = teacher_forced_labels(model, windows, k=4)
    with torch.no_grad():
        logits = model(torch.from_numpy(windows)).logits
    expected_values, expected_idx = logits.topk(4, dim=-1)
    for row, label in enumerate(labels):
        assert label["tokens"] == windows[row].tolist() and label["prompt_len"] == 0
        assert (label["top_idx"][:, 0] == expected_idx[row, :, 0].numpy()).all()
        np.testing.assert_allclose(label["top_logit"], expected_values[row].numpy(), rtol=1e-2, atol=1e-2)
    save_labelled(labels, tmp_path / "shard_0000.npz")
    again = load_labelled([tmp_path / "shard_0000.npz"])
    assert [a["tokens"] for a in again] == [label["tokens"] for label in labels]
    assert all((a["top_idx"] == label["top_idx"]).all() for a, label in zip(again, labels))


def _mass_outside_active(negatives: int) -> float:
    """Train a fresh tied-embedding draft on labels inside the first 32 of 256 tokens; return the
    softmax mass its full-vocabulary output leaves on the 224 tokens it was never trained to predict."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specviz.train import train_steps
    torch.manual_seed(0)
    draft = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         tie_word_embeddings=True))
    generator = torch.Generator().manual_seed(1)

    def batches():
        while True:
            tokens = torch.randint(0, 32, (8, 16), generator=generator)
            nxt = (tokens * 3 + 1) % 32                       # a learnable rule inside the active set
            yield tokens, nxt[..., None], torch.zeros(nxt.shape + (1,)), torch.ones(nxt.shape)

    train_steps(draft, batches(), steps=150, lr=3e-3, minutes=5, active=torch.arange(32),
                negatives=negatives, log_every=10_000)
    with torch.no_grad():
        probs = draft(input_ids=torch.randint(0, 32, (4, 16), generator=generator)).logits.softmax(-1)
    return float(probs[..., 32:].sum(-1).mean())


def test_random_negatives_keep_untrained_tokens_from_soaking_up_probability():
    without, with_negatives = _mass_outside_active(0), _mass_outside_active(64)
    assert with_negatives < without / 2 and without > 0.3


def test_sampled_continuations_stay_with_their_own_prompts():
    """Batches are grouped by length and shuffled, so the pairs come back in another order than the
    prompts: each continuation must still be its own prompt's (greedy, so checkable one by one)."""
    from specviz.train.trigram import sample_continuations
    model = tiny_model("llama")
    prompts = [[5, 9, 2], [7], [1, 2, 3, 4, 5, 6], [8, 8], [3, 1, 4, 1, 5]]
    pairs = sample_continuations(model, prompts, new_tokens=6, batch_size=2, temperature=0.0, pad_id=63,
                                 minutes=5, seed=3)
    assert sorted(p for p, _ in pairs) == sorted(prompts)
    assert [p for p, _ in pairs] != prompts                   # the order really did change
    for prompt, continuation in pairs:
        alone = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                               pad_token_id=63)[0, len(prompt):].tolist()
        assert continuation == [t for t in alone if t != 63]


@pytest.mark.slow
def test_draft_text_command_writes_what_the_draft_continues(tmp_path):
    from specviz.stack.auto_trigram import read_draft_text
    from specviz.train.cli import main
    out = tmp_path / "smollm2.jsonl.gz"
    main(["draft-text", "--draft", "smollm2-135m", "--max-prompts", "4", "--batch-size", "2",
          "--new-tokens", "5", "--minutes", "5", "--out", str(out)])
    texts = read_draft_text(out)
    assert len(texts) == 4
    assert all('"""' in t or "'''" in t for t in texts)        # documented-function prompts, continued
