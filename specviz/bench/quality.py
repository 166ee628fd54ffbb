"""`python -m specviz.bench.quality`: how far each precision's model is from the GGUF file's own weights.

The reference is the file's weights exactly: the file de-quantised to float32 (`--dtype float32`; its copy is made on
first use). On the same held-out Python (HumanEval's prompts with their canonical solutions, from --first on, cut in
chunks of --context tokens as llama-perplexity cuts them: each chunk read afresh, its second half scored), each
precision gives per scored token: the KL divergence from the reference's next-token distribution, whether its top
token is the reference's, and the log-probability of the real next token (perplexity). llama.cpp's row is its own
logits of the same file on the same tokens, read from `llama-perplexity --kl-divergence-base` (which stores each
distribution's log-probabilities in 16 bits: its KL is good to about 1e-4 nats). Prints a table; --out writes JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..llama_cpp import program
from ..markdown import md_table
from ..models import ModelLoadError, load_model, precision_name, resolve
from ..prompts import humaneval_path

REFERENCE = "float32"
LLAMA_CPP = "llama.cpp"


def heldout_text(first: int) -> str:
    """HumanEval's problems from `first` on, each prompt followed by its canonical solution."""
    import gzip
    with gzip.open(humaneval_path(), "rt") as lines:
        problems = [json.loads(line) for line in lines]
    return "\n\n".join(p["prompt"] + p["canonical_solution"] for p in problems[first:])


def llama_cpp_logits(gguf: Path, text: str, context: int, chunks: int, threads: int, folder: Path):
    """llama.cpp's tokens [chunks, context] of the text and its log-probabilities [chunks, scored, vocab] (float32)."""
    text_file, base = folder / "heldout.txt", folder / "llama.kld"
    text_file.write_text(text)
    perplexity = program("llama-perplexity")
    if perplexity is None:
        raise ModelLoadError("llama-perplexity is not built here (bash scripts/setup.sh builds it); "
                             "or pass --no-llama-cpp")
    done = subprocess.run([str(perplexity), "-m", str(gguf), "-f", str(text_file), "-c", str(context),
                           "--chunks", str(chunks), "-t", str(threads), "-b", str(context),
                           "--kl-divergence-base", str(base)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not base.is_file():
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit code {done.returncode}"]
        raise ModelLoadError(f"llama-perplexity failed: {last[0].strip()[:200]}")
    raw = base.read_bytes()
    if raw[:8] != b"_logits_":
        raise ModelLoadError(f"{base} is not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw, np.int32, 3, 8)
    tokens = np.frombuffer(raw, np.int32, n_chunk * n_ctx, 20).reshape(n_chunk, n_ctx)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    scored = n_ctx - 1 - n_ctx // 2
    rows = np.frombuffer(raw, np.uint16, n_chunk * scored * nv, 20 + 4 * n_chunk * n_ctx).reshape(n_chunk, scored, nv)
    head = np.ascontiguousarray(rows[..., :4]).view(np.float32)          # per row: scale, min log-probability
    log_probs = rows[..., 4:4 + n_vocab].astype(np.float32) * head[..., :1] + head[..., 1:2]
    return tokens, log_probs


def model_log_probs(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    """Log-probabilities [chunks, scored, vocab] of each chunk read afresh, at llama-perplexity's scored positions."""
    n_ctx = tokens.shape[1]
    out = []
    with torch.inference_mode():
        for chunk in tokens:
            logits = model(torch.from_numpy(chunk.astype(np.int64))[None]).logits[0, n_ctx // 2:n_ctx - 1].float()
            out.append(torch.log_softmax(logits, -1).numpy())
    return np.stack(out)


def compare(reference: np.ndarray, other: np.ndarray, tokens: np.ndarray) -> dict:
    """Mean KL(reference || other) in nats, top-1 agreement and perplexity over the scored tokens."""
    n_ctx = tokens.shape[1]
    following = tokens[:, n_ctx // 2 + 1:]
    kl = np.concatenate([(np.exp(ref.astype(np.float64)) * (ref.astype(np.float64) - theirs)).sum(-1)
                         for ref, theirs in zip(reference, other)])         # a chunk at a time: 0.3 GB, not 3
    nll = -np.take_along_axis(other, following[..., None], -1)[..., 0].astype(np.float64)
    return {"kl": float(kl.mean()), "top1": float((reference.argmax(-1) == other.argmax(-1)).mean()),
            "perplexity": float(np.exp(nll.mean())), "tokens": int(following.size)}


def bits_per_weight(gguf: Path) -> list[list]:
    """Per tensor type of the file: its weights and bits per weight (as stored)."""
    from ..cpu.file_model import tensors
    kinds: dict[str, list[int]] = {}
    import gguf as gguf_package
    for name, (qtype, data) in tensors(gguf).items():
        kind = gguf_package.GGMLQuantizationType(qtype).name
        weights = int(np.prod(data.shape)) if qtype in (0, 1) else None
        if weights is None:
            per, size = gguf_package.GGML_QUANT_SIZES[gguf_package.GGMLQuantizationType(qtype)]
            weights = data.size // size * per
        total = kinds.setdefault(kind, [0, 0])
        total[0] += weights
        total[1] += data.nbytes
    return [[kind, f"{w / 1e6:.0f}M", f"{8 * b / w:.2f}"] for kind, (w, b) in sorted(kinds.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.bench.quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b",
                        help="a GGUF model spec (default: the qwen-coder target)")
    parser.add_argument("--precisions", default="gguf,int4,int8", help="comma-separated, compared with float32")
    parser.add_argument("--first", type=int, default=100, help="the held-out text starts at this HumanEval problem")
    parser.add_argument("--context", type=int, default=512, help="tokens per chunk (llama-perplexity's -c)")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-llama-cpp", action="store_true", help="leave out llama.cpp's row")
    parser.add_argument("--out", help="a JSON file for the table")
    args = parser.parse_args(argv)
    try:
        location, gguf_file = resolve(args.model)
        if gguf_file is None:
            raise ModelLoadError(f"{args.model!r} is not a GGUF file: the reference is a GGUF file's own weights")
        gguf = Path(location) / gguf_file
        with tempfile.TemporaryDirectory() as folder:
            if args.no_llama_cpp:
                tokens, theirs = None, None
            else:
                tokens, theirs = llama_cpp_logits(gguf, heldout_text(args.first), args.context, args.chunks,
                                                  args.threads, Path(folder))
        reference_model = load_model(args.model, REFERENCE)
        if tokens is None:
            ids = reference_model.tokenizer(heldout_text(args.first), add_special_tokens=False)["input_ids"]
            tokens = np.array(ids[:args.context * args.chunks]).reshape(-1, args.context)
        reference = model_log_probs(reference_model.model, tokens)
        del reference_model
        rows = {}
        for precision in args.precisions.split(","):
            model = load_model(args.model, precision).model
            rows[precision_name(precision)] = compare(reference, model_log_probs(model, tokens), tokens)
        if theirs is not None:
            rows[f"{LLAMA_CPP} (its own logits of the file)"] = compare(reference, theirs, tokens)
    except (ModelLoadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = {f"{REFERENCE} (the file's weights)": compare(reference, reference, tokens), **rows}
    table = md_table(["precision", "KL to the file's model (nats)", "top-1 agreement", "perplexity"],
                     [[name, f"{r['kl']:.4f}", f"{100 * r['top1']:.1f}%", f"{r['perplexity']:.3f}"]
                      for name, r in rows.items()],
                     "lrrr")
    print(f"{args.model}: {tokens.size} tokens of HumanEval/{args.first}+ (prompts with their solutions), "
          f"{rows[next(iter(rows))]['tokens']} scored, chunks of {args.context}")
    print(table)
    print("\nbits per weight, as the file stores them:")
    print(md_table(["type", "weights", "bits per weight"], bits_per_weight(gguf), "lrr"))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "first": args.first, "context": args.context,
                                              "chunks": int(tokens.shape[0]), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
