"""llama.cpp, the fastest plain decoder of GGUF files on a CPU, as a peer: its own programs, run as a user runs them.

`llama-completion` is its plain decoding and `llama-speculative-simple` its own draft-model speculation (a
chain of `--spec-draft-n-max` tokens, 3 by default), both built by scripts/build_llama_cpp.sh into
`.venv/llama.cpp/bin` (or found in `SPECVIZ_LLAMA_CPP`, or on PATH). Each run reads the same GGUF files as
our engine, with the same number of threads. In the bench it writes exactly `max_new_tokens` tokens (`--ignore-eos`),
like for like with our lanes there; in the app's race it stops at the model's end of text, as ours do.

Its clocks are its own (`prompt eval` + `eval`, or `encoded` + `decoded`): they include reading the prompt,
as our lanes' clocks do, and leave out loading the model. The text arrives on stdout as it is made; each
chunk's arrival is noted, and the arrivals are placed on llama.cpp's own clock so that the last one lands
at its total. Its numerics are not ours (4-bit weights times 8-bit activations, and products that depend on
the batch), so its text is compared with our baseline's and a mismatch is counted, never hidden.
"""
from __future__ import annotations

import codecs
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from .. import operator_environment
from ..decode.sampling import Sampling

PLAIN, SPECULATIVE = "llama_cpp", "llama_cpp_speculative"
PEERS = (PLAIN, SPECULATIVE)
PROGRAMS = {PLAIN: "llama-completion", SPECULATIVE: "llama-speculative-simple"}
BENCH_PROGRAM = "llama-bench"
DIR_ENV = "SPECVIZ_LLAMA_CPP"
CONTEXT = 4096                      # tokens of KV cache: a prompt and its output (the model's 32k would waste memory)
TIMEOUT_S = 600


class LlamaCppMissing(RuntimeError):
    """llama.cpp cannot run this: the message is one line for the user."""


@dataclass
class LlamaRun:
    text: str                               # the new text (the prompt's echo removed)
    chunks: list[tuple[float, str]]         # (seconds on llama.cpp's clock, text) as stdout delivered them
    seconds: float                          # llama.cpp's own clock: the prompt's read and the decoding
    new_tokens: int                         # tokens it generated
    target_forwards: int                    # the target's forward passes (plain: one per token after the first)
    drafted: int | None = None              # speculative: tokens the draft proposed, and those accepted
    accepted: int | None = None


def program(name: str) -> Path | None:
    """Where llama.cpp's program `name` is: in the folder SPECVIZ_LLAMA_CPP names where it is set (only there:
    a folder without it turns llama.cpp off), else this environment's build, else PATH."""
    chosen = os.environ.get(DIR_ENV)
    if chosen is not None:
        return Path(chosen) / name if (Path(chosen) / name).is_file() else None
    built = Path(sys.prefix) / "llama.cpp" / "bin" / name
    found = built if built.is_file() else shutil.which(name)
    return Path(found) if found else None


def missing_reason(peer: str, target_gguf: Path | None, draft_gguf: Path | None) -> str | None:
    """Why this peer cannot run on this stack (one line), or None when it can."""
    if program(PROGRAMS[peer]) is None:
        return (f"llama.cpp is not installed here ({PROGRAMS[peer]} not found): bash scripts/setup.sh builds it "
                f"into .venv/llama.cpp, or set {DIR_ENV} to a folder holding its programs")
    if target_gguf is None:
        return "llama.cpp reads GGUF files, and this stack's target is not one"
    if peer == SPECULATIVE and draft_gguf is None:
        return "llama.cpp's speculation needs a GGUF draft model, and this stack's first draft is not one"
    return None


def sampling_args(sampling: Sampling) -> list[str]:
    """The same sampling as ours: greedy, or temperature then top-k then top-p with nothing else in the chain."""
    if sampling.greedy:
        return ["--temp", "0"]
    return ["--temp", str(sampling.temperature), "--top-k", str(sampling.top_k), "--top-p", str(sampling.top_p),
            "--min-p", "0", "--seed", str(sampling.seed)]


def generate(peer: str, target_gguf: Path, prompt: str, sampling: Sampling, max_new_tokens: int, threads: int,
             draft_gguf: Path | None = None, stop_at_end: bool = False) -> LlamaRun:
    """One generation by llama.cpp's own program for `peer`; raises LlamaCppMissing where it cannot run. It writes
    exactly max_new_tokens tokens (the bench's like-for-like), or with `stop_at_end` stops at the model's end of text
    as its users see it (the app's race)."""
    reason = missing_reason(peer, target_gguf, draft_gguf)
    if reason:
        raise LlamaCppMissing(reason)
    # -p, not -f: a prompt read from a file loses its last newline
    args = [str(program(PROGRAMS[peer])), "-m", str(target_gguf), "-p", prompt, "--no-escape",
            "-n", str(max_new_tokens), "-t", str(threads), "-c", str(CONTEXT), *sampling_args(sampling)]
    args += [] if stop_at_end else ["--ignore-eos"]
    if peer == PLAIN:
        args += ["-no-cnv", "--simple-io", "--no-warmup"]
    else:
        args += ["-md", str(draft_gguf), "--spec-type", "draft-simple", "-td", str(threads)]
    raw, log = _run(args)
    return _parse(peer, raw, log, prompt)


def _run(args: list[str]) -> tuple[list[tuple[float, bytes]], str]:
    """Run the program; its stdout in chunks with their arrival times, and its log (stderr)."""
    with tempfile.TemporaryFile() as log:
        started = perf_counter()
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                   env=operator_environment())
        watchdog = threading.Timer(TIMEOUT_S, process.kill)     # a program that hangs must not hang the bench or app
        watchdog.start()
        chunks = []
        try:
            while block := os.read(process.stdout.fileno(), 1 << 16):
                chunks.append((perf_counter() - started, block))
            code = process.wait()
        finally:
            watchdog.cancel()
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
    if code == -9 and perf_counter() - started >= TIMEOUT_S:
        raise LlamaCppMissing(f"{Path(args[0]).name} ran past {TIMEOUT_S} s and was stopped")
    if code != 0:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit code {code}"]
        raise LlamaCppMissing(f"{Path(args[0]).name} failed: {last[0].strip()[:200]}")
    return chunks, text


def _number(pattern: str, log: str) -> float:
    match = re.search(pattern, log)
    if match is None:
        raise LlamaCppMissing(f"llama.cpp's log lacks its timings ({pattern!r}): another version of its programs?")
    return float(match.group(1))


END_MARK = b" [end of text]\n"          # what llama-completion prints where the model ends its text


def _parse(peer: str, raw: list[tuple[float, bytes]], log: str, prompt: str) -> LlamaRun:
    """The new text (the prompt's echo and the program's closing newlines removed), placed on llama.cpp's clock."""
    if peer == PLAIN:
        seconds = (_number(r"prompt eval time =\s*([\d.]+) ms", log)
                   + _number(r"(?<!prompt )eval time =\s*([\d.]+) ms", log)) / 1e3
        runs = int(_number(r"(?<!prompt )eval time =\s*[\d.]+ ms /\s*(\d+) runs", log))
        new_tokens, forwards, drafted, accepted = runs + 1, runs + 1, None, None
        echo, closing = prompt, b"\n\n"
    else:
        seconds = _number(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", log) + \
            _number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", log)
        new_tokens = int(_number(r"n_predict\s*=\s*(\d+)", log))
        drafted, accepted = int(_number(r"n_drafted\s*=\s*(\d+)", log)), int(_number(r"n_accept\s*=\s*(\d+)", log))
        forwards = new_tokens - accepted         # each verification writes its accepted tokens and one of its own
        echo, closing = "\n\n" + prompt, b"\n\n\n\n"
    data, echo = b"".join(block for _, block in raw), echo.encode("utf-8")
    head = len(echo) if data.startswith(echo) else 0
    tail = len(data) - len(closing) if data.endswith(closing) else len(data)
    if data[:tail].endswith(END_MARK):         # it stopped at the model's end of text (not --ignore-eos)
        tail -= len(END_MARK)
    last = raw[-1][0] if raw else 0.0
    chunks, shown, received, decoder = [], head, 0, codecs.getincrementaldecoder("utf-8")("replace")
    for arrived, block in raw:
        received += len(block)
        end = min(received, tail)
        if end > shown:         # a character split between blocks arrives with the block that completes it
            piece = decoder.decode(data[shown:end], final=end == tail)
            chunks.append((max(0.0, arrived - last + seconds), piece))
            shown = end
    text = data[head:tail].decode("utf-8", "replace")
    return LlamaRun(text, chunks, seconds, new_tokens, forwards, drafted, accepted)


def same_text(ours: str, theirs: str) -> bool:
    """Whether two texts agree over the shorter of the two: llama.cpp's text is tokenized again by us, and a
    speculative round may end past ours."""
    return ours[: len(theirs)] == theirs[: len(ours)]


def token_chunks(run: LlamaRun, tokenizer, max_new_tokens: int) -> list[tuple[float, list[int]]]:
    """The run's first `max_new_tokens` tokens in our tokenizer's ids, in the chunks they arrived in (a
    speculative round may overshoot the count). Its text is tokenized again, whole and after each chunk,
    so the ids compare with our baseline's; a chunk takes the tokens its text completed."""
    final = tokenizer(run.text, add_special_tokens=False)["input_ids"][:max_new_tokens]
    chunks, text, done = [], "", 0
    for arrived, piece in run.chunks:
        text += piece
        upto = min(len(tokenizer(text, add_special_tokens=False)["input_ids"]), len(final))
        if upto > done:
            chunks.append((arrived, final[done:upto]))
            done = upto
        if done == len(final):
            break
    if done < len(final):
        chunks.append((run.seconds, final[done:]))
    return chunks


def gguf_file(spec: str | None) -> Path | None:
    """The GGUF file behind a model spec of ours, or None where it is not one (a hub id, the shipped draft)."""
    from ..models.load import ModelLoadError, resolve

    if spec is None:
        return None
    try:
        location, name = resolve(spec)
    except ModelLoadError:
        return None
    return Path(location) / name if name else None


def cost_curve(gguf: Path, threads: int, sizes=(1, 2, 4, 8, 16), repeats: int = 2) -> dict[int, float]:
    """Seconds per forward of n tokens by llama.cpp on this GGUF file (its own `llama-bench`, prompt
    processing of n tokens), the fastest plain decoder's cost of verifying n tokens."""
    bench = program(BENCH_PROGRAM)
    if bench is None:
        raise LlamaCppMissing(f"llama.cpp is not installed here ({BENCH_PROGRAM} not found)")
    args = [str(bench), "-m", str(gguf), "-p", ",".join(map(str, sizes)), "-n", "0", "-t", str(threads),
            "-r", str(repeats), "-o", "json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env=operator_environment())
    if done.returncode != 0:
        raise LlamaCppMissing(f"{BENCH_PROGRAM} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    return curve_of(done.stdout)


def curve_of(bench_json: str) -> dict[int, float]:
    """llama-bench's JSON rows as seconds per forward of n tokens (its avg_ns is nanoseconds per run)."""
    import json

    return {row["n_prompt"]: row["avg_ns"] / 1e9 for row in json.loads(bench_json)}


def generate_for(stack, peer: str, prompt_ids: list[int], sampling: Sampling, max_new_tokens: int,
                 stop_at_end: bool = False) -> tuple[LlamaRun, list[tuple[float, list[int]]]]:
    """llama.cpp on one of our stacks: its target's (and first draft's) GGUF file, the prompt as our tokenizer
    reads it back, as many threads as our engine; with the run's first max_new_tokens tokens in our ids, in the
    chunks they arrived in (token_chunks)."""
    import torch

    run = generate(peer, gguf_file(stack.target.name), stack.tokenizer.decode(prompt_ids), sampling, max_new_tokens,
                   torch.get_num_threads(), gguf_file(stack.assistant()[0]), stop_at_end)
    return run, token_chunks(run, stack.tokenizer, max_new_tokens)
