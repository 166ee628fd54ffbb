"""`python -m specviz.bench.quality`: how far each precision's model is from the GGUF file's own weights, at every
position of a text.

The reference is the file's weights exactly: the file de-quantised to float32 (`--dtype float32`; its copy is made on
first use). Each text is read afresh: held-out Python (HumanEval's prompts with their canonical solutions, from
--first on, cut in chunks of --context tokens as llama-perplexity cuts them) and short prompts of one to three tokens
(code and prose: the next token after a one-token prompt is read from the first position's logits). At every
position each precision gives: the KL divergence from the reference's next-token distribution, whether its top token
is the reference's, and the log-probability of the real next token (perplexity). The first four positions are reported
on their own: the first carries the attention sink, a few values thousands of times the rest.

llama.cpp's row is its own logits of the same file on the same tokens, read from `llama-perplexity
--kl-divergence-base` (16-bit log-probabilities: its KL is good to about 1e-4 nats). llama-perplexity scores only the
second half of each chunk, so its row has those positions alone; the second table compares every model there.
Prints both tables; --out writes JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..peers.llama_cpp import program
from ..analysis.markdown import md_table
from ..models.load import ModelLoadError, load_model, resolve
from ..models.precision import precision_name
from .prompts import humaneval_path

REFERENCE = "float32"
LLAMA_CPP = "llama.cpp (its own logits of the file)"
SHORT_PROMPTS = ("def", "import", "class", "from", "#", "print", "for i in", "return", "if x", "while", "x =",
                 "The", "Hello", "Once upon a", "Question:", "In", "We", "It was", "Dear", "My name is")
POSITIONS = {"0": (0, 1), "1": (1, 2), "2": (2, 3), "3": (3, 4), "4-31": (4, 32), "32+": (32, None)}


def heldout_text(first: int) -> str:
    """HumanEval's problems from `first` on, each prompt followed by its canonical solution."""
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


def log_probs(model: torch.nn.Module, ids: np.ndarray) -> torch.Tensor:
    """Log-probabilities [positions, vocab] (float64) of one text read afresh."""
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0]
    return torch.log_softmax(logits.double(), -1)


def per_position(reference: torch.Tensor, other: torch.Tensor, ids: np.ndarray) -> dict[str, np.ndarray]:
    """At each position: KL(reference || other) in nats, whether the top tokens agree, and (where the text goes on)
    the negative log-probability of the real next token."""
    following = torch.from_numpy(ids[1:].astype(np.int64))
    return {"kl": (reference.exp() * (reference - other)).sum(-1).numpy(),
            "top1": (reference.argmax(-1) == other.argmax(-1)).numpy(),
            "nll": -other[:-1].gather(-1, following[:, None])[:, 0].numpy()}


def summary(scores: list[dict[str, np.ndarray]]) -> dict:
    """Mean KL, top-1 agreement and perplexity over every position of the texts, and the KL by position."""
    kl, top1 = np.concatenate([s["kl"] for s in scores]), np.concatenate([s["top1"] for s in scores])
    nll = np.concatenate([s["nll"] for s in scores])
    by_position = {}
    for name, (start, stop) in POSITIONS.items():
        values = np.concatenate([s["kl"][start:stop] for s in scores])
        by_position[name] = {"kl": float(values.mean()) if values.size else None, "tokens": int(values.size)}
    return {"kl": float(kl.mean()), "top1": float(top1.mean()), "perplexity": float(np.exp(nll.mean())),
            "tokens": int(kl.size), "by_position": by_position}


def second_half(scores: list[dict[str, np.ndarray]], n_ctx: int) -> dict:
    """Mean KL, top-1 agreement and perplexity at llama-perplexity's scored positions of each chunk (n_ctx // 2 to
    n_ctx - 2, each scored by the token after it)."""
    def part(key):
        return np.concatenate([s[key][n_ctx // 2:n_ctx - 1] for s in scores])
    kl = part("kl")
    return {"kl": float(kl.mean()), "top1": float(part("top1").mean()), "perplexity": float(np.exp(part("nll").mean())),
            "tokens": int(kl.size)}


def bits_per_weight(gguf: Path) -> list[list]:
    """Per tensor type of the file: its weights and bits per weight (as stored)."""
    import gguf as gguf_package

    from ..cpu.file_model import tensors
    kinds: dict[str, list[int]] = {}
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


def measure(spec: str, precisions: list[str], chunks: np.ndarray, short: list[np.ndarray], theirs) -> dict:
    """Every precision's rows against the float32 reference, a text at a time (all models loaded at once, so that no
    text's log-probabilities are kept: a 512-token chunk's are 0.6 GB per model). `theirs`: llama.cpp's
    log-probabilities at the chunks' second halves, or None."""
    reference = load_model(spec, REFERENCE)
    models = {precision_name(p): load_model(spec, p).model for p in precisions}
    exact_name = f"{REFERENCE} (the file's weights)"
    scores: dict[str, list] = {name: [] for name in [exact_name, *models, *([LLAMA_CPP] if theirs is not None else [])]}
    n_ctx = chunks.shape[1]
    for index, ids in enumerate([*chunks, *short]):
        exact = log_probs(reference.model, ids)
        scores[exact_name].append(per_position(exact, exact, ids))
        for name, model in models.items():
            scores[name].append(per_position(exact, log_probs(model, ids), ids))
        if theirs is not None and index < len(chunks):           # llama.cpp's positions alone, the rest left out
            padded = torch.full_like(exact, float("nan"))
            padded[n_ctx // 2:n_ctx - 1] = torch.from_numpy(theirs[index]).double()
            scores[LLAMA_CPP].append(per_position(exact, padded, ids))
    chunk_count = len(chunks)
    rows = {}
    for name, found in scores.items():
        halves = second_half(found[:chunk_count], n_ctx)
        rows[name] = {"second_half": halves} if name == LLAMA_CPP else {**summary(found), "second_half": halves}
    return rows


def tables(rows: dict) -> tuple[str, str]:
    """The KL by position (ours), and every model at llama-perplexity's positions."""
    def kl(value):
        return "n/a" if value is None else f"{value:.4f}"
    ours = [name for name in rows if "by_position" in rows[name]]
    by_position = md_table(["precision", *(f"KL at {p}" for p in POSITIONS), "KL, every position", "top-1",
                            "perplexity"],
                           [[name, *(kl(rows[name]["by_position"][p]["kl"]) for p in POSITIONS), kl(rows[name]["kl"]),
                             f"{100 * rows[name]['top1']:.1f}%", f"{rows[name]['perplexity']:.3f}"] for name in ours],
                           "l" + "r" * (len(POSITIONS) + 3))
    half = md_table(["precision", "KL to the file's model (nats)", "top-1 agreement", "perplexity"],
                    [[name, kl(r["second_half"]["kl"]), f"{100 * r['second_half']['top1']:.1f}%",
                      f"{r['second_half']['perplexity']:.3f}"] for name, r in rows.items()], "lrrr")
    return by_position, half


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
    parser.add_argument("--out", help="a JSON file for the tables")
    args = parser.parse_args(argv)
    try:
        location, gguf_file = resolve(args.model)
        if gguf_file is None:
            raise ModelLoadError(f"{args.model!r} is not a GGUF file: the reference is a GGUF file's own weights")
        gguf = Path(location) / gguf_file
        theirs = None
        with tempfile.TemporaryDirectory() as folder:
            if not args.no_llama_cpp:
                chunks, theirs = llama_cpp_logits(gguf, heldout_text(args.first), args.context, args.chunks,
                                                  args.threads, Path(folder))
        tokenizer = load_model(args.model, "gguf").tokenizer
        if theirs is None:
            ids = tokenizer(heldout_text(args.first), add_special_tokens=False)["input_ids"]
            chunks = np.array(ids[:args.context * args.chunks]).reshape(-1, args.context)
        short = [np.array(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in SHORT_PROMPTS]
        rows = measure(args.model, args.precisions.split(","), chunks, short, theirs)
    except (ModelLoadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    by_position, half = tables(rows)
    print(f"{args.model}: {chunks.size} tokens of HumanEval/{args.first}+ (prompts with their solutions) in chunks of "
          f"{args.context}, and {len(short)} short prompts ({sum(len(s) for s in short)} tokens), each read afresh")
    print("\nKL to the file's model (nats) by position, and over every position:")
    print(by_position)
    print("\nat llama-perplexity's positions (the second half of each chunk), beside llama.cpp's own logits:")
    print(half)
    print("\nbits per weight, as the file stores them:")
    print(md_table(["type", "weights", "bits per weight"], bits_per_weight(gguf), "lrr"))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "first": args.first, "context": args.context,
                                              "chunks": int(chunks.shape[0]), "short_prompts": list(SHORT_PROMPTS),
                                              "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
