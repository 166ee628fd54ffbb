"""Text a draft model writes, shipped so that the trigram built for its tokenizer on first use
(trigram:auto) also knows what the draft tends to say: the `draft-text` command.

The paper built its stage-2 n-gram from text its draft generated. A table of the draft's own habits
guesses the draft's next token better than source code alone, and in staged decoding guessing the
draft is the n-gram's whole job. The text is stored decoded (gzipped JSON lines, a few hundred KB),
so it needs no tokenizer to read and the trigram itself (MBs for a 152k vocabulary) is built locally.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..stack.auto_trigram import draft_text_path
from ..models.load import load_model
from .common import DATA, log
from .sources import documented_function_prompts
from .trigram import sample_continuations


def run_info_path(text_path: Path) -> Path:
    """Where the run that wrote `text_path` keeps its record (read by the `manifest` command)."""
    return DATA / f"draft_text_{Path(text_path).name.removesuffix('.jsonl.gz')}.json"


def cmd_draft_text(args) -> None:
    """Continue documented-function prompts (Python source, never HumanEval) with a draft model; save the text."""
    draft = load_model(args.draft, "float32")
    tok = draft.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts = documented_function_prompts(tok, args.max_prompts, args.max_prompt_tokens, args.seed + 1)
    pairs = sample_continuations(draft.model, prompts, args.new_tokens, args.batch_size, args.temperature,
                                 pad_id, args.minutes, seed=args.seed)
    out = Path(args.out or draft_text_path(args.draft))
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        for prompt, continuation in pairs:
            f.write(json.dumps({"text": tok.decode(prompt + continuation, skip_special_tokens=True)}) + "\n")
    info = {"command": args.command_line, "texts": len(pairs), "generated_tokens": sum(len(c) for _, c in pairs),
            "prompt_tokens": sum(len(p) for p, _ in pairs), "bytes": out.stat().st_size}
    DATA.mkdir(exist_ok=True)
    run_info_path(out).write_text(json.dumps(info, indent=1))
    log("saved", out, info)
