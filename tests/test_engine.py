"""Decoder behaviour: trace records, statistics, stopping, and input validation."""
import json

import pytest
from tiny import TinyTokenizer, tiny_model

from specviz.backends.choose import open_cache
from specviz.decode.drafters import LookupDrafter, ModelDrafter
from specviz.decode.engine import Decoder
from specviz.decode.metrics import summarise
from specviz.decode.sampling import Sampling
from specviz.decode.trace import RunRecord, StepRecord
from specviz.decode.tree import TreeSpec

TOK = TinyTokenizer()


def staged_run(max_new_tokens=20, **kw):
    target = tiny_model("llama")
    drafter = ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache, lower=LookupDrafter(64))
    return Decoder(open_cache(target, "target"), TOK, [3, 1, 4, 1, 5, 9, 2, 6], drafter=drafter, strategy="staged",
                   tree=TreeSpec(budget=10), max_new_tokens=max_new_tokens, **kw)


def test_trace_records_round_trip_through_json():
    run = staged_run().generate()
    text = json.dumps(run.to_dict())
    again = RunRecord.from_dict(json.loads(text))
    assert again == run
    step = run.steps[0]
    assert StepRecord.from_dict(json.loads(json.dumps(step.to_dict()))) == step


def test_step_record_describes_the_round():
    decoder = staged_run()
    record = decoder.step()
    assert [s.kind for s in record.stages] == ["target", "model", "lookup"]
    root = record.nodes[0]
    assert root.parent == -1 and root.accepted and root.token == 6
    path = record.accepted_path
    assert path[0] == 0 and all(record.nodes[b].parent == a for a, b in zip(path, path[1:]))
    assert [n.accepted for n in record.nodes] == [n.id in path for n in record.nodes]
    # committed = accepted drafted tokens, then the target's bonus token
    assert record.committed_tokens[:-1] == [record.nodes[n].token for n in path[1:]]
    assert record.committed_stage[-1] == 0
    for node in record.nodes[1:]:
        assert 0 < node.draft_prob <= 1 and 0 <= node.target_prob <= 1
        assert node.stage in (1, 2)
        tried = record.nodes[node.parent].accepted
        assert (node.accept_prob is not None) == tried
    assert record.forwards["target"] == [len(record.nodes)]
    assert set(record.phase_s) >= {"tree", "verify", "bookkeeping", "stage1_draft"}
    assert record.bytes_read["target"] > 0 and record.wall_s >= sum(record.phase_s.values())    # the phases lie within


def test_statistics_add_up():
    run = staged_run(30).generate()
    s = run.stats
    assert s["new_tokens"] == len(run.tokens) == 30
    assert s["target_forwards"] == s["steps"] == len(run.steps)
    assert s["tokens_per_target_forward"] == pytest.approx(30 / len(run.steps))
    assert s["mean_accepted_per_target_forward"] == pytest.approx(
        sum(len(st.accepted_path) - 1 for st in run.steps) / len(run.steps))
    assert all(0 <= a <= 1 for a in s["accept_by_depth"])
    assert s["bytes_per_token"] == pytest.approx(sum(s["bytes_read"].values()) / 30)
    assert 0 < s["bytes_relative_to_baseline"]
    assert sum(s["phase_share"].values()) == pytest.approx(1.0, abs=0.05)
    assert summarise(run.steps) == {k: v for k, v in s.items() if k != "bytes_relative_to_baseline"}


def test_baseline_reads_exactly_the_baseline_bytes():
    run = Decoder(open_cache(tiny_model("llama"), "target"), TOK, [1, 2, 3], max_new_tokens=10).generate()
    assert run.stats["bytes_relative_to_baseline"] == pytest.approx(1.0)


def test_stops_at_eos_and_at_max_new_tokens():
    target = tiny_model("llama")
    free = Decoder(open_cache(target, "target"), TOK, [1, 2], max_new_tokens=12).generate()
    eos = free.tokens[4]
    target.generation_config.eos_token_id = eos
    try:
        run = Decoder(open_cache(target, "target"), TOK, [1, 2], drafter=ModelDrafter(target, backend=open_cache),
                      max_new_tokens=12).generate()
    finally:
        target.generation_config.eos_token_id = None
    assert run.tokens == free.tokens[: free.tokens.index(eos) + 1]
    assert run.steps[-1].finish_reason == "eos"
    assert free.steps[-1].finish_reason == "length" and len(free.tokens) == 12


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt=[]), "prompt is empty"),
    (dict(max_new_tokens=0), "max new tokens"),
    (dict(max_new_tokens=600), "exceeds the model's context"),
    (dict(max_new_tokens=490, tree=TreeSpec(lookup=30)), "exceeds the model's context"),   # fits without lookup
    (dict(tree=TreeSpec(lookup=-1)), "lookup tokens"),
    (dict(sampling=Sampling(temperature=-1)), "temperature"),
    (dict(sampling=Sampling(temperature=1, top_p=0)), "top-p"),
    (dict(sampling=Sampling(temperature=1, top_k=-2)), "top-k"),
    (dict(tree=TreeSpec(shape="spiral")), "tree shape"),
    (dict(tree=TreeSpec(budget=-1)), "budget"),
])
def test_bad_settings_raise_one_line_errors(kwargs, message):
    prompt = kwargs.pop("prompt", [1, 2, 3])
    with pytest.raises(ValueError, match=message) as info:
        Decoder(open_cache(tiny_model("llama"), "target"), TOK, prompt, **kwargs)
    assert "\n" not in str(info.value)


def test_a_target_cache_that_decoded_before_is_refused():
    used = open_cache(tiny_model("llama"), "target")
    Decoder(used, TOK, [1, 2, 3], max_new_tokens=2).generate()
    with pytest.raises(ValueError, match="must be fresh") as info:
        Decoder(used, TOK, [1, 2, 3], max_new_tokens=2)
    assert "\n" not in str(info.value)


def test_step_after_finish_is_refused():
    decoder = Decoder(open_cache(tiny_model("llama"), "target"), TOK, [1], max_new_tokens=1)
    decoder.step()
    with pytest.raises(RuntimeError):
        decoder.step()


def test_a_context_lookup_branch_is_credited_and_saves_target_forwards():
    """The tiny target falls into a loop after ~28 tokens, which context lookup copies."""
    def run(lookup):
        drafter = ModelDrafter(tiny_model("llama", noise=0.3), backend=open_cache)
        return Decoder(open_cache(tiny_model("llama"), "target"), TOK, [3, 1, 4, 1, 5, 9, 2, 6], drafter=drafter,
                       strategy="staged", tree=TreeSpec(budget=4, lookup=lookup), max_new_tokens=40).generate()
    plain, copied = run(0), run(8)
    assert copied.tokens == plain.tokens
    assert [s.kind for s in copied.steps[0].stages] == ["target", "model", "lookup"]
    assert [s.kind for s in plain.steps[0].stages] == ["target", "model"]
    lookup_nodes = [n for s in copied.steps for n in s.nodes if n.stage == 2]
    assert lookup_nodes and all(n.draft_prob == 1.0 for n in lookup_nodes)
    assert sum(s.committed_stage.count(2) for s in copied.steps) >= 5
    assert copied.stats["target_forwards"] < plain.stats["target_forwards"]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, top_k=20, seed=7)])
def test_a_decoder_given_the_prompts_prefill_writes_what_one_reading_it_writes(sampling):
    from specviz.decode.engine import prefill
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    read_once = prefill(prompt, open_cache(tiny_model("llama"), "prefill"))
    alone = staged_run(sampling=sampling)
    reads = []
    # the body runs in every feed
    hook = tiny_model("llama").base_model.register_forward_hook(lambda *args: reads.append(1))
    try:
        copied = staged_run(sampling=sampling, prefilled=read_once)
    finally:
        hook.remove()
    assert copied.target.committed == len(prompt) - 1 and not reads                 # the prompt is not read again
    assert copied.generate().tokens == alone.generate().tokens
    assert [s.accepted_path for s in copied.steps] == [s.accepted_path for s in alone.steps]
    assert staged_run(prefilled=read_once).generate().tokens == staged_run().generate().tokens   # reusable
    with pytest.raises(ValueError, match="another model or prompt"):
        Decoder(open_cache(tiny_model("llama"), "target"), TOK, prompt[:-2] + [7, 6], prefilled=read_once)
    with pytest.raises(ValueError, match="another model or prompt"):
        Decoder(open_cache(tiny_model("llama", noise=0.3), "target"), TOK, prompt, prefilled=read_once)


def test_a_drafter_given_the_prompts_prefill_copies_its_models_read():
    from specviz.decode.engine import prefill
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    draft = tiny_model("llama", noise=0.3)
    read_once = prefill(prompt, open_cache(tiny_model("llama"), "prefill"), [open_cache(draft, "prefill")])
    fed = []
    hook = draft.base_model.register_forward_hook(
        lambda module, args, kwargs, out: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        copied = staged_run(prefilled=read_once)
        run = copied.generate()
    finally:
        hook.remove()
    assert fed[0] == 1            # the root alone: the prompt came from the copy
    assert run.tokens == staged_run().generate().tokens
    target_only = prefill(prompt, open_cache(tiny_model("llama"), "prefill"))
    assert staged_run(prefilled=target_only).drafter.kv.committed == 0   # no read to copy


@pytest.mark.parametrize("shape, width", [("dynamic", 1), ("chain", 4), ("static", 4)])
def test_no_round_drafts_a_guess_it_has_no_room_to_commit(shape, width):
    """Near the end a round drafts no deeper than the tokens left but one (the target's token fills the last place),
    and on the last token it drafts nothing; the output is the one a run with room to spare begins with."""
    target = tiny_model("llama")
    copy = tiny_model("llama")      # the target's copy as draft: every guess passes, so each round drafts its deepest
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    runs = {}
    for n in (9, 40):
        drafter = ModelDrafter(copy, backend=open_cache, lower=LookupDrafter(64))
        runs[n] = Decoder(open_cache(target, "target"), TOK, prompt, drafter=drafter, strategy="staged",
                          tree=TreeSpec(shape=shape, budget=8, max_depth=4, level_width=width, lookup=4),
                          max_new_tokens=n, stop_at_eos=False).generate()
    assert runs[9].tokens == runs[40].tokens[:9]
    depths = [(9 - step.position, max(node.depth for node in step.nodes)) for step in runs[9].steps]
    assert all(deepest <= left - 1 for left, deepest in depths), depths
    assert any(left - 1 < 4 and deepest == left - 1 for left, deepest in depths if left > 1), depths
