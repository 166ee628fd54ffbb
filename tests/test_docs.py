"""The docs and the code name dates and commits, never numbered work periods: a reader cannot know
what such a number means. Checked over every tracked text file a user or a contributor reads."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ["README.md", "docs", "assets", "specviz", "tests", "app.py"]
DATA = (".json", ".jsonl", ".json.gz")                  # recorded data keeps what its run wrote
WORK_PERIOD = re.compile("sessions?" + r" [0-9]+", re.IGNORECASE)   # split, so this file does not match


def tracked_texts() -> dict[str, str]:
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    texts = {}
    for name in filter(None, names):
        data = (ROOT / name).read_bytes() if (ROOT / name).is_file() else b"\0"
        if name.endswith(DATA) or name == "tests/test_docs.py" or b"\0" in data:
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:                      # binary (images, archives)
            continue
    return texts


def test_no_numbered_work_periods():
    texts = tracked_texts()
    assert "README.md" in texts and "docs/BENCHMARKS.md" in texts
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
             for name, text in texts.items() for m in WORK_PERIOD.finditer(text)]
    assert not found, "name a date (and a commit) instead:\n" + "\n".join(found)
