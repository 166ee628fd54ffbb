"""Which drafters each strategy gets from a model stack."""
import pytest
import torch
from tiny import TinyTokenizer, save_with_word_tokenizer, tiny_model, tiny_stack
from toy_ngram import ToyBigram

from specviz.decode.drafters import LookupDrafter, ModelDrafter, NgramDrafter, cascade
from specviz.models.load import LoadedModel
from specviz.models.precision import precision_name
from specviz.stack.stack import Stack
from specviz.stack.strategies import STAGED_LOOKUP, default_tree


def stack(drafts, loaded=None):
    return tiny_stack(drafts, loaded=loaded)


def test_strategies_pick_stages_from_the_stack():
    s = stack(["small", "big.npz"], {"small": LoadedModel("small", tiny_model("llama", noise=0.2), TinyTokenizer()),
                                     "big.npz": ToyBigram.fit(64)})
    assert s.drafter_for("baseline") is None
    single = s.drafter_for("speculative")
    assert isinstance(single, ModelDrafter) and single.lower is None
    staged = s.drafter_for("staged")
    assert isinstance(staged.lower, NgramDrafter)
    assert [d.kind for d in cascade(staged)] == ["model", "ngram"]
    run = s.decoder([1, 2, 3], "staged", max_new_tokens=8).generate()
    assert [st.name for st in run.steps[0].stages] == ["tiny-target", "small", "big", "context lookup"]


def test_a_drafter_is_named_after_its_file_less_the_file_type_only():
    s = stack(["qwen2.5-coder-0.5b", "dir/table.npz"], {"qwen2.5-coder-0.5b": LoadedModel(
        "qwen2.5-coder-0.5b", tiny_model("llama", noise=0.2), TinyTokenizer()), "dir/table.npz": ToyBigram.fit(64)})
    assert [d.name for d in cascade(s.drafter_for("staged"))] == ["qwen2.5-coder-0.5b", "table"]


def test_drafter_only_and_invalid_cascades():
    s = stack(["lookup"])
    assert isinstance(s.drafter_for("tree"), LookupDrafter)
    with pytest.raises(ValueError, match="staged needs a draft model"):
        s.drafter_for("staged")
    with pytest.raises(ValueError, match="unknown strategy"):
        s.drafter_for("fastest")


def test_a_drafter_named_like_the_target_gets_a_unique_name():
    model = LoadedModel("target", tiny_model("llama"), TinyTokenizer())
    s = Stack(model, ["target", "lookup"], {"target": model})
    run = s.decoder([1, 2], "staged", max_new_tokens=4).generate()
    names = [st.name for st in run.steps[0].stages]
    assert len(set(names)) == len(names) == 4 and run.stats["draft_forwards"]


def test_default_trees():
    assert default_tree("speculative").shape == "chain"
    assert default_tree("staged").shape == "dynamic"
    assert default_tree("tree", 24).budget == 24
    lookups = default_tree("staged").lookup, default_tree("tree").lookup, default_tree("speculative").lookup
    assert lookups == (STAGED_LOOKUP, 0, 0) and lookups[0] > 0       # staged alone copies from the context
    assert default_tree("staged", lookup=0).lookup == 0 and default_tree("tree", lookup=5).lookup == 5
    assert (default_tree("tree").min_score, default_tree("staged", min_score=0.25).min_score) == (0.2, 0.25)
    staged, tree = default_tree("staged"), default_tree("tree")
    assert (staged.level_width, staged.min_score, tree.level_width) == (1, 0.5, 4)


@pytest.fixture
def target_probe(monkeypatch, preparing):
    """The target's probe layer timed as made-up seconds (float32 fastest): these tests choose a draft's precision,
    and the real probe (a 1.5B-shaped layer in every precision, tests/test_models.py) would take seconds each."""
    import specviz.models.precision as precision
    monkeypatch.setattr(precision, "_probe_layer", lambda dtype, **_: {n: (1.0 if dtype == "float32" else 2.0) * n
                                                                      for n in precision.PROBE_FEEDS})
    return preparing


def _save_target_and_draft(folder):
    """A tiny target and a perturbed draft, saved as model folders that share a word tokenizer."""
    for name, noise in (("target", 0.0), ("draft", 0.2)):
        save_with_word_tokenizer(tiny_model("llama", noise=noise), folder / name)


def test_a_draft_with_a_lower_stage_is_probed_with_the_batches_staged_feeds_it(tmp_path, monkeypatch, target_probe):
    """Staged feeds its draft levels of ~16 tokens; a chain feeds it one at a time. The dtype probe
    must time what the stack will run: a bfloat16 draft that is fast per token but slow per batch
    (an AVX2 CPU) stays float32 under a lower stage."""
    import specviz.stack.draft_precision as draft_precision
    import specviz.stack.stack as stack_module
    seen = []

    def fake_curves(models, sizes, context, reps):     # seconds by tokens fed, as on an AVX2 CPU
        seen.extend([tuple(sizes)] * len(models))
        bf16 = [next(model.parameters()).dtype == torch.bfloat16 for model in models]
        return [{n: (0.3 if b else 1.0) if n == 1 else (3.0 if b else 1.2) for n in sizes} for b in bf16]

    monkeypatch.setattr(draft_precision, "cost_curves", fake_curves)
    monkeypatch.setattr(stack_module, "auto_precision", lambda spec, *_: "float32")
    _save_target_and_draft(tmp_path)
    chain = Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft")], dtype="auto", profile=target_probe)
    candidates = len(draft_precision.draft_precisions(str(tmp_path / "draft"), "float32"))  # f32, bf16, int4 (, int8)
    assert seen == [(1,)] * candidates and chain.precision() == "float32 target, bfloat16 draft"
    seen.clear()
    staged = Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft"), "lookup"], dtype="auto",
                        profile=target_probe)
    assert seen == [(1, draft_precision.STAGED_LEVEL_TOKENS)] * candidates and staged.precision() == "float32"


def test_a_draft_timed_again_on_a_busy_machine_is_loaded_once_in_each_precision(tmp_path, monkeypatch, target_probe):
    """Where other work spoils a timing, prepare times the candidates again (machine_profile.SETTLE_TRIES in all): the
    same models, not each loaded anew (a 0.5B in three precisions takes 10-30 s on 2 cores)."""
    import specviz.profile.store as machine_profile
    import specviz.stack.draft_precision as draft_precision
    import specviz.stack.stack as stack_module
    loads, timings = [], []
    load_model = draft_precision.load_model

    def counted_load(spec, dtype, *args, **kwargs):
        loads.append(dtype)
        return load_model(spec, dtype, *args, **kwargs)
    monkeypatch.setattr(draft_precision, "load_model", counted_load)
    monkeypatch.setattr(draft_precision, "draft_probe_seconds",
                        lambda models, lower: timings.append(len(models)) or [1.0] * len(models))
    monkeypatch.setattr(machine_profile.OthersWatch, "share", lambda self: 1.0)          # busy, whatever was timed
    target_probe.busy_share = 0.25
    monkeypatch.setattr(machine_profile, "SETTLE_WAIT_S", 0.0)
    monkeypatch.setattr(stack_module, "auto_precision", lambda spec, *_: "float32")
    _save_target_and_draft(tmp_path)
    Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft"), "lookup"], dtype="auto", profile=target_probe)
    candidates = draft_precision.draft_precisions(str(tmp_path / "draft"), "float32")
    assert timings == [len(candidates)] * machine_profile.SETTLE_TRIES and sorted(loads) == sorted(candidates)


@pytest.mark.parametrize("fastest", ["bfloat16", "int4", "int8"])
def test_auto_dtype_keeps_a_draft_in_the_precision_whose_forwards_are_fastest(tmp_path, monkeypatch, fastest,
                                                                                target_probe):
    """A draft's precision moves acceptance, never the output: a float32 target with a bfloat16 or
    int4 draft still writes baseline's tokens."""
    import specviz.stack.draft_precision as draft_precision
    import specviz.stack.stack as stack_module
    _save_target_and_draft(tmp_path)
    monkeypatch.setattr(stack_module, "auto_precision", lambda spec, *_: "float32")
    monkeypatch.setattr(draft_precision, "draft_probe_seconds",
                        lambda models, lower: [1.0 if LoadedModel("", m, None).dtype == fastest else 3.0
                                               for m in models])
    s = Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft"), "lookup"], dtype="auto",
                   profile=target_probe)
    assert s.dtype == "float32" and s.loaded[str(tmp_path / "draft")].dtype == fastest
    assert s.precision() == f"float32 target, {precision_name(fastest)} draft"
    base = s.decoder([1, 2, 3, 4], "baseline", max_new_tokens=12, stop_at_eos=False).generate().tokens
    for strategy in ("speculative", "tree", "staged"):
        assert s.decoder([1, 2, 3, 4], strategy, max_new_tokens=12, stop_at_eos=False).generate().tokens == base
    # a tie keeps float32
    monkeypatch.setattr(draft_precision, "draft_probe_seconds", lambda models, lower: [1.0] * len(models))
    assert Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft"), "lookup"], dtype="auto",
                      profile=target_probe).precision() == f"float32 target, {precision_name(fastest)} draft"
    # ...but the choice stored on this machine stands
    target_probe.file.forget()
    assert Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft")], dtype="auto",
                      profile=target_probe).precision() == "float32"
    assert Stack.load(str(tmp_path / "target"), [str(tmp_path / "draft")], dtype="float32").precision() == "float32"
