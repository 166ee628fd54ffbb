"""A draft model restricted to the tokens its n-gram stage's corpus holds, the special tokens and the
prompt's (specviz/stack/draft_vocabulary.py): its output layer is cut to those rows, it never drafts another
token, and every strategy still writes baseline's tokens."""
import copy
import functools
import sys
import threading

import pytest
import torch
from tiny import TinyTokenizer, tiny_model, tiny_stack

from specviz.backends.choose import open_cache, read_bytes, restricts_output
from specviz.backends.kv import CUTS_KEPT, output_rows
from specviz.cpu import kernels
from specviz.cpu.int4 import WIDE_GROUP, Int4Linear
from specviz.cpu.int8 import Int8Linear
from specviz.decode.drafters.ngram import KatzTrigram
from specviz.models.load import LoadedModel, _quantized
from specviz.decode.sampling import Sampling
from specviz.stack.strategies import STRATEGIES, default_tree
from specviz.decode.tree_builder import Proposal

SPECIAL = 63


class SpecialTokenizer(TinyTokenizer):
    all_special_ids = [SPECIAL]


@pytest.mark.parametrize("quantized", [Int8Linear, Int4Linear, functools.partial(Int4Linear, group=WIDE_GROUP)])
def test_a_quantized_output_layer_cut_to_some_rows_computes_those_outputs(quantized):
    torch.manual_seed(0)
    layer = quantized(torch.nn.Linear(640, 40))       # chunks of 8 blocks: 2 and a half
    if not restricts_output(layer):
        pytest.skip("an int4 layer on PyTorch's kernel (no rows kernel here) is not cut")
    ids = torch.tensor([3, 0, 17, 39, 21])              # for int4 not a whole tile of 4 rows
    part = layer.output_rows(ids)
    x = torch.randn(5, 640)
    if kernels.available():       # each output computed alone: the same bits
        assert torch.equal(part(x), layer(x)[:, ids])
    else:
        assert torch.allclose(part(x), layer(x)[:, ids], atol=1e-5)
    assert part(x).shape == (5, 5) and torch.equal(part.dequantized(), layer.dequantized()[ids])


def test_decoders_of_one_vocabulary_share_one_cut_of_the_output_layer():
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(64, 40))
    first, again = (output_rows(layer, torch.tensor([3, 0, 17])) for _ in range(2))
    assert again is first                                      # cut once: a race's lanes read one copy
    others = [output_rows(layer, torch.tensor([i, 20 + i])) for i in range(CUTS_KEPT)]
    assert output_rows(layer, torch.tensor([3, 0, 17])) is not first           # older cuts are let go
    assert torch.equal(others[-1].dequantized(), layer.dequantized()[[CUTS_KEPT - 1, 19 + CUTS_KEPT]])


def test_sessions_cutting_one_shared_layer_at_once_each_get_their_cut():
    layer = Int8Linear(torch.nn.Linear(64, 40))
    errors, wrong = [], []

    def session(i):
        try:
            for j in range(3000):
                ids = torch.tensor([(i + j) % 5, 20])
                if not torch.equal(output_rows(layer, ids).dequantized(), layer.dequantized()[ids]):
                    wrong.append(ids)
        except Exception as exc:         # a cut let go by one session while another read it
            errors.append(repr(exc))
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)          # threads take turns often, as a busy server's do
    try:
        threads = [threading.Thread(target=session, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(switch)
    assert errors == [] and wrong == []


def int8_draft_stack() -> tuple:
    """A tiny target, its noisy copy in int8 as draft, and a trigram whose corpus holds tokens 0-39 only."""
    draft = copy.deepcopy(tiny_model("llama", noise=0.3))
    _quantized(LoadedModel("draft", draft, None), "int8")
    corpus = [[(7 * i + j) % 40 for j in range(30)] for i in range(20)]
    table = KatzTrigram.build(corpus, 64)
    stack = tiny_stack(("draft", "trigram:auto"), SpecialTokenizer(), loaded={"trigram:auto": table})
    stack.loaded["draft"] = LoadedModel("draft", draft, SpecialTokenizer())
    return stack, draft


PROMPT = [5, 9, 44, 2, 50, 9]


def test_the_draft_predicts_only_corpus_special_and_prompt_tokens_and_reads_fewer_bytes():
    stack, draft = int8_draft_stack()
    full = read_bytes(draft)[0]
    assert stack.vocabulary.for_draft(stack.loaded["draft"], PROMPT) is None          # not restricted unless asked
    stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
    vocab = stack.vocabulary.for_draft(stack.loaded["draft"], PROMPT)
    assert vocab.tolist() == list(range(40)) + [44, 50, SPECIAL]
    kv = open_cache(draft, "draft", vocab)
    assert kv.weight_bytes == full - 21 * (32 + 4)          # 21 int8 rows of 32 weights and their scales left out
    with torch.inference_mode():
        logits = kv.feed_committed([1, 2, 3])
    assert torch.isinf(logits[:, 51:SPECIAL]).all() and torch.isfinite(logits[:, vocab]).all()


def test_a_draft_with_its_own_output_vocabulary_keeps_it():
    stack, _ = int8_draft_stack()
    stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
    own = torch.arange(0, 64, 2)
    stack.loaded["draft"].output_vocab = own
    assert stack.vocabulary.for_draft(stack.loaded["draft"], PROMPT) is own


def drafted_tokens(stack, strategy: str) -> tuple[list[int], set[int]]:
    """A greedy run's tokens and the tokens its draft model proposed (every path tried: min score 0)."""
    decoder = stack.decoder(PROMPT, strategy, default_tree(strategy, min_score=0.0), Sampling(),
                            max_new_tokens=24, stop_at_eos=False)
    tokens = decoder.generate().tokens
    return tokens, {n.token for step in decoder.steps for n in step.nodes[1:] if n.stage == 1}


def test_every_strategy_writes_baseline_tokens_with_the_cut_draft():
    stack, _ = int8_draft_stack()
    allowed = set(range(40)) | {44, 50, SPECIAL}
    assert drafted_tokens(stack, "staged")[1] - allowed             # uncut, it drafts other tokens
    stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
    runs = {s: drafted_tokens(stack, s) for s in STRATEGIES}
    for strategy, (tokens, drafted) in runs.items():
        assert tokens == runs["baseline"][0], strategy
        assert drafted <= allowed, strategy                 # the draft never proposes another token
    assert runs["staged"][1]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, top_p=0.9)])
def test_a_proposal_over_the_draft_vocabulary_is_the_whole_rows_distribution(sampling):
    """The tree builder takes a cut draft's probabilities over its vocabulary alone (tree_builder.Proposal): the same
    distribution as over every token, whose other tokens have none."""
    torch.manual_seed(3)
    support = torch.tensor([0, 2, 3, 7, 11, 40, 41, 60])
    row = torch.full((64,), float("-inf"))
    row[support] = torch.randn(len(support)) * 3
    cut, whole = Proposal(row, support, sampling), Proposal(row, None, sampling)
    assert torch.allclose(cut.whole(), whole.probs, atol=1e-6) and cut.whole().shape == (64,)
    assert cut.top(3) == whole.top(3) and set(cut.top(3)) <= set(support.tolist())
    assert all(abs(cut.prob(t) - whole.prob(t)) < 1e-6 for t in range(64))     # 0 off the vocabulary
    drawn = cut.draw(4, torch.Generator().manual_seed(0))
    assert len(set(drawn)) == len(drawn) and set(drawn) <= {t for t in support.tolist() if whole.prob(t) > 0}


def test_a_sampled_run_with_the_cut_draft_verifies_against_its_whole_distributions():
    stack, _ = int8_draft_stack()
    stack.vocabulary.restrict(stack.loaded.get("trigram:auto"), stack.tokenizer)
    decoder = stack.decoder(PROMPT, "staged", default_tree("staged", min_score=0.0), Sampling(temperature=1.0, seed=5),
                            max_new_tokens=16, stop_at_eos=False)
    decoder.generate()
    drafted = {n.token for step in decoder.steps for n in step.nodes[1:] if n.stage == 1}
    assert drafted and drafted <= set(range(40)) | {44, 50, SPECIAL}
