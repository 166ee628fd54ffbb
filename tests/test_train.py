"""Training helpers that shape the shipped draft's data."""
import numpy as np
import torch

from specviz.train import load_labelled, save_labelled, teacher_forced_labels
from tiny import tiny_model


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
    assert [a["tokens"] for a in again] == [l["tokens"] for l in labels]
    assert all((a["top_idx"] == l["top_idx"]).all() for a, l in zip(again, labels))
