"""Greedy exactness at the qwen-coder target's size, for a machine without its weights (issue 33).

A randomly initialised Qwen2 model of the 1.5B's shapes (`--projection` sizes), its output layer sharpened
so greedy choices are not near-ties, is the target; a noisy copy of it is the draft, so drafts are often
accepted. Every strategy, with target and draft compiled over static caches (CUDA graphs on a GPU), must
give plain decoding's tokens. Prints one line per strategy; exit status 1 on any mismatch.
  python scripts/gpu_exactness.py --device cuda --dtype float32
  python scripts/gpu_exactness.py --sizes tiny-qwen --device cpu      (a check here)
"""
import argparse
import sys
from time import perf_counter

import torch

from specviz.bench.projection import PROJECTION_SIZES, random_model
from specviz.backends.choose import open_cache
from specviz.decode.drafters import LookupDrafter, ModelDrafter
from specviz.decode.engine import Decoder, static_length
from specviz.models.load import compile_model
from specviz.stack.strategies import default_tree


class NumberTokenizer:
    """Token ids as text: the engine only decodes for its trace records."""
    eos_token_id = None

    def decode(self, ids, **_):
        return " ".join(map(str, ids))


def models(sizes: str, device: str, dtype: str):
    spec = PROJECTION_SIZES[sizes]
    target = random_model(spec["family"], spec["target"], spec["vocab"], device, dtype, 0)
    draft = random_model(spec["family"], spec["target"], spec["vocab"], device, dtype, 0)
    with torch.no_grad():
        for model in (target, draft):
            model.lm_head.weight.mul_(8.0)        # tied to the input embedding: both sharpen
        generator = torch.Generator(device=device).manual_seed(1)
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device=device, dtype=p.dtype) * 0.2 * p.std())
    return target, draft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="qwen-coder", choices=list(PROJECTION_SIZES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    target, draft = models(args.sizes, args.device, args.dtype)
    compiled_target, compiled_draft = compile_model(target), compile_model(draft)
    vocab = PROJECTION_SIZES[args.sizes]["vocab"]
    failures = 0
    for index in range(args.prompts):
        prompt = torch.randint(0, vocab, (40,), generator=torch.Generator().manual_seed(index)).tolist()
        outputs = {}
        for strategy in ("baseline", "speculative", "tree", "staged"):
            drafter = None if strategy == "baseline" else ModelDrafter(
                draft, compiled=compiled_draft, lower=LookupDrafter(vocab) if strategy == "staged" else None,
                backend=open_cache)
            started = perf_counter()
            tree = default_tree(strategy)
            cache = open_cache(target, "target", static_len=static_length(len(prompt), args.max_new_tokens, tree),
                               compiled=compiled_target)
            decoder = Decoder(cache, NumberTokenizer(), prompt, drafter=drafter, strategy=strategy, tree=tree,
                              max_new_tokens=args.max_new_tokens, stop_at_eos=False)
            outputs[strategy] = decoder.generate().tokens
            same = outputs[strategy] == outputs["baseline"]
            failures += not same
            print(f"prompt {index} {strategy:<11} {'identical' if same else 'DIFFERS'} "
                  f"{len(outputs[strategy])} tokens, {len(decoder.steps)} target passes, "
                  f"{perf_counter() - started:.1f} s (compiling included)", flush=True)
    print(f"{failures} mismatches ({args.sizes}, {args.device}, {args.dtype})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
