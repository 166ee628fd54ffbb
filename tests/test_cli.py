"""End to end through the command line with the real SmolLM2 model (offline): `specviz generate`'s main in this
process (the interpreter's start and torch's import cost more than a 135M model's run), and once through a real
`python -m specviz` process."""
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch
from tiny import tiny_model

PROMPT = 'def running_max(values: list[int]) -> list[int]:\n    """Return the running maximum of values."""\n'
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def cli(*args, timeout=600):
    """`python -m specviz generate` in a process of its own. The offline preset unless a test names another: the
    default is chosen per machine."""
    preset = [] if "--preset" in args else ["--preset", "offline"]
    return subprocess.run([sys.executable, "-m", "specviz", "generate", *preset, *args], capture_output=True,
                          text=True, env=ENV, timeout=timeout)


def in_process(*args, reference=False) -> subprocess.CompletedProcess:
    """`specviz generate` through the same main as `python -m specviz`, in this process, the offline preset unless a
    test names another. No reference unless asked: llama.cpp's own run beside each is tested in
    tests/test_llama_cpp.py."""
    from specviz.cli import main
    preset = [] if "--preset" in args else ["--preset", "offline"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["generate", *preset, *args, *([] if reference else ["--no-reference"])])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def generate_json(strategy, *extra):
    result = in_process("--prompt", PROMPT, "--strategy", strategy, "--max-new-tokens", "24", "--dtype", "float32",
                        "--json", *extra)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def baseline():
    return generate_json("baseline")


@pytest.mark.slow
def test_staged_json_has_the_contract_fields_and_equals_baseline(baseline):
    out = generate_json("staged")
    for key in ["strategy", "prompt_tokens", "tokens", "text", "new_tokens", "target_forwards", "draft_forwards",
                "wall_s", "tokens_per_s", "bytes_read", "accept_by_depth", "mean_accepted_per_target_forward"]:
        assert key in out, key
    assert out["strategy"] == "staged" and out["new_tokens"] == 24 == len(out["tokens"]) and out["dtype"] == "float32"
    assert out["tokens"] == baseline["tokens"]
    assert out["text"] == baseline["text"]
    assert out["target_forwards"] < baseline["target_forwards"]
    assert [s["kind"] for s in out["stages"]][0] == "target" and len(out["stages"]) >= 3


@pytest.mark.slow
def test_tree_with_lookup_drafter_only_equals_baseline(baseline):
    out = generate_json("tree", "--draft", "lookup", "--tree-budget", "8")
    assert out["tokens"] == baseline["tokens"]
    assert out["draft_forwards"] == {}        # the lookup drafter runs no model


@pytest.mark.slow
def test_human_readable_output(baseline):
    result = in_process("--prompt", PROMPT, "--strategy", "baseline", "--max-new-tokens", "24", "--dtype", "float32")
    assert result.returncode == 0
    assert result.stdout.strip() == baseline["text"].strip()
    assert "tokens per target forward" in result.stderr


def assert_one_line_error(result, fragment):
    """Bad input ends with exit code 2 and one `error: ...` line, last, with no traceback. Progress a first
    use prints before it (a GGUF file's conversion, say) is not bad output."""
    assert result.returncode == 2, (result.returncode, result.stderr[-1000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error")]
    assert errors == lines[-1:] and lines[-1].startswith("error: ") and fragment in lines[-1], result.stderr


def run_main(capsys, *args):
    """The CLI in-process (same code path as `python -m specviz`, without the interpreter start)."""
    from specviz.cli import main
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.mark.parametrize("args,fragment", [
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file not found"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens"),
    (["--prompt", "x", "--max-new-tokens", "100000"], "max-new-tokens"),
    (["--prompt", "x", "--temperature", "-0.5"], "temperature"),
    (["--prompt", "x", "--temperature", "1", "--top-p", "1.5"], "top-p"),
    (["--prompt", "x", "--top-k", "-1"], "top-k"),
    (["--prompt", "x", "--tree-budget", "1000"], "budget"),
    (["--prompt", "x", "--lookup", "-1"], "lookup tokens"),
    (["--prompt", "x", "--min-score", "1.5"], "min score"),
    (["--prompt", "x", "--target", "/nonexistent/model"], "not found"),
    (["--prompt", "x", "--target", "./missing.gguf"], "not found"),
    (["--prompt", "x", "--device", "tpu"], "--device"),
])
def test_bad_input_gets_one_line_and_exit_2(capsys, args, fragment):
    assert_one_line_error(run_main(capsys, *args), fragment)


def test_bad_input_through_the_real_interpreter():
    assert_one_line_error(cli("--prompt-file", "/nonexistent/prompt.txt"), "prompt file not found")


def test_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(in_process("--prompt", "x", "--device", "cuda"), "CUDA")


@pytest.mark.slow
def test_unloadable_model_and_prompt_too_long(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert_one_line_error(in_process("--prompt", "x", "--draft", str(tmp_path)), "could not load")
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("x = 1\n" * 3000)
    assert_one_line_error(in_process("--prompt-file", str(long_prompt), "--strategy", "baseline"), "context")


@pytest.mark.slow
def test_draft_with_another_tokenizer_is_refused(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(64)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(tmp_path)
    tiny_model("llama").save_pretrained(tmp_path)
    assert_one_line_error(in_process("--prompt", "x", "--strategy", "tree", "--draft", str(tmp_path)),
                          "different tokenizers")


def test_a_plain_language_prompt_goes_in_as_chat_unless_told_otherwise(tmp_path, capsys):
    """As on the page: plain language is a user's turn of the model's chat template, Python source is continued as
    written, and --prompt-format says which; a model without a template takes plain language as written, and refuses
    chat asked for by name in one line."""
    from tiny import WORD_CHAT_TEMPLATE, save_with_word_tokenizer

    chatty, plain = tmp_path / "chatty", tmp_path / "plain"
    save_with_word_tokenizer(tiny_model("llama"), chatty, WORD_CHAT_TEMPLATE)
    save_with_word_tokenizer(tiny_model("llama"), plain)

    def run(target, prompt, *extra):
        result = run_main(capsys, "--target", str(target), "--prompt", prompt, "--strategy", "baseline",
                          "--max-new-tokens", "2", "--dtype", "float32", "--no-reference", "--json", *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout)

    chat = run(chatty, "w5 w6 w7")
    assert (chat["prompt_format"], chat["prompt_tokens"]) == ("chat", 6)             # w1 w5 w6 w7 w2 w3
    written = run(chatty, "w5 w6 w7", "--prompt-format", "completion")
    assert (written["prompt_format"], written["prompt_tokens"]) == ("completion", 3)
    assert run(chatty, "w5(w6)")["prompt_format"] == "completion"                      # code, as HumanEval's
    assert run(chatty, "w5(w6)", "--prompt-format", "chat")["prompt_tokens"] == 4 + 3
    assert run(plain, "w5 w6 w7")["prompt_format"] == "completion"         # a base model's: as written
    assert_one_line_error(run_main(capsys, "--target", str(plain), "--prompt", "w5 w6 w7", "--strategy", "baseline",
                                   "--dtype", "float32", "--no-reference", "--prompt-format", "chat"),
                          "--prompt-format completion")
