"""Reproducible commands that build specviz's draft artifacts (assets/draft, assets/trigram.npz).

    python -m specviz.train data-eval        # target's greedy continuations of the HumanEval prompts
    python -m specviz.train data-target      # target-labelled training data (stdlib/site-packages prompts)
    python -m specviz.train data-corpus      # raw Python source, tokenised
    python -m specviz.train draft            # train the stage-1 draft model
    python -m specviz.train trigram          # build the stage-2 Katz-backoff trigram
    python -m specviz.train draft-text --draft qwen2.5-coder-0.5b   # text a preset's draft writes, for its trigram:auto
    python -m specviz.train agreement        # measure top-1 agreement on HumanEval continuations
    python -m specviz.train manifest         # write assets/manifest.json + MANIFEST.md from the runs
                                             # (--files-only: the files' sizes only)

assets/MANIFEST.md lists the exact commands and arguments that built the shipped artifacts.

Everything is seeded; intermediate data lives in data/ (gitignored). HumanEval is only ever used
for measuring: training prompts come from Python source files, never from HumanEval.
"""
from __future__ import annotations

import argparse
import sys

from .. import ASSETS
from .common import DATA, log, seed_everything
from .data import cmd_data_corpus, cmd_data_eval, cmd_data_target, cmd_data_teacher
from .draft import cmd_draft, cmd_output_vocab
from .draft_text import cmd_draft_text
from .evaluate import cmd_agreement
from .manifest import cmd_manifest
from .trigram import cmd_trigram


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("data-eval", help=cmd_data_eval.__doc__)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--k", type=int, default=8)
    p.set_defaults(func=cmd_data_eval)

    p = sub.add_parser("data-target", help=cmd_data_target.__doc__)
    p.add_argument("--max-prompts", type=int, default=8000)
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--minutes", type=float, default=30)
    p.set_defaults(func=cmd_data_target)

    p = sub.add_parser("data-corpus", help=cmd_data_corpus.__doc__)
    p.add_argument("--max-tokens", type=int, default=20_000_000)
    p.set_defaults(func=cmd_data_corpus)
    p = sub.add_parser("draft", help=cmd_draft.__doc__)
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--init", choices=["pca", "random"], default="pca")
    p.add_argument("--resume", default=None, help="continue training a saved draft directory")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--tokens-per-batch", type=int, default=4096)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--active-vocab", type=int, default=16384)
    p.add_argument("--minutes", type=float, default=25)
    p.add_argument("--corpus-minutes", type=float, default=0)
    p.add_argument("--corpus-steps", type=int, default=1000)
    p.add_argument("--corpus-batch", type=int, default=16)
    p.add_argument("--corpus-lr", type=float, default=3e-3)
    p.add_argument("--out", default=str(ASSETS / "draft"))
    p.add_argument("--negatives", type=int, default=2048,
                   help="random tokens from outside the active vocabulary added to each step's softmax")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward pass")
    p.add_argument("--labels", default="target", help="comma-separated labelled sets: target, teacher")
    p.set_defaults(func=cmd_draft)
    p = sub.add_parser("output-vocab", help=cmd_output_vocab.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--labels", default="target", help="the labelled sets the draft was trained on")
    p.add_argument("--with-corpus", action="store_true", help="the run had a corpus warm-up")
    p.add_argument("--active-vocab", type=int, default=16384)
    p.add_argument("--vocab-size", type=int, default=49152)
    p.set_defaults(func=cmd_output_vocab)
    p = sub.add_parser("data-teacher", help=cmd_data_teacher.__doc__)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--dtype", default="bfloat16", help="the target's dtype while labelling")
    p.set_defaults(func=cmd_data_teacher)
    p = sub.add_parser("trigram", help=cmd_trigram.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--max-prompts", type=int, default=8000)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--sample-minutes", type=float, default=8)
    p.add_argument("--corpus-tokens", type=int, default=10_000_000)
    p.add_argument("--target-text", action="store_true",
                   help="also count the target-labelled training sequences (data/target)")
    p.add_argument("--min-bigram", type=int, default=1)
    p.add_argument("--min-trigram", type=int, default=2)
    p.add_argument("--out", default=str(ASSETS / "trigram.npz"))
    p.set_defaults(func=cmd_trigram)

    p = sub.add_parser("draft-text", help=cmd_draft_text.__doc__)
    p.add_argument("--draft", required=True, help="a draft model spec, e.g. qwen2.5-coder-0.5b")
    p.add_argument("--max-prompts", type=int, default=8000)
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as the app's default race decodes")
    p.add_argument("--minutes", type=float, default=40)
    p.add_argument("--out", default=None, help="default: assets/draft_text/<draft>.jsonl.gz")
    p.set_defaults(func=cmd_draft_text)

    p = sub.add_parser("agreement", help=cmd_agreement.__doc__)
    p.add_argument("--draft", default=str(ASSETS / "draft"))
    p.add_argument("--trigram", default=str(ASSETS / "trigram.npz"))
    p.add_argument("--limit", type=int, default=None, help="only the first N HumanEval prompts")
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_agreement)
    p = sub.add_parser("manifest", help=cmd_manifest.__doc__)
    p.add_argument("--agreement", default=str(DATA / "agreement.json"))
    p.add_argument("--agreement-quick", default=str(DATA / "agreement_32.json"))
    p.add_argument("--acceptance", default="docs/benchmarks/humaneval164.json.gz",
                   help="a specviz.bench report whose tokens per target forward go in the manifest")
    p.add_argument("--notes", default=None, help="a markdown file to include under Notes")
    p.add_argument("--files-only", action="store_true",
                   help="keep the recorded runs' numbers, refresh the file list and sizes "
                        "(after replacing a recording)")
    p.set_defaults(func=cmd_manifest)
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.command_line = "python -m specviz.train " + " ".join(sys.argv[1:] if argv is None else argv)
    seed_everything(args.seed, args.threads)
    log(args.command_line)
    args.func(args)
