"""The repository reads as a product: a short README a newcomer can follow, one current table per machine in
BENCHMARKS, result files that name no machine's folders, no lab notebook in the code, and a Python project's
habits (pyproject.toml with ruff's settings, `ruff check` clean, a LICENSE). Each rule is a function that returns
what breaks it, tested below on small inputs that break it, so a rule that cannot fail is caught too."""
import gzip
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPER = "arxiv.org/abs/2308.04623"
COMMANDS = ("bash scripts/setup.sh && .venv/bin/python app.py",
            "bash scripts/setup.sh --with-browser && .venv/bin/python -m pytest -q")
README_CHARS, COMMAND_LINES, SENTENCE_WORDS = 12_000, 40, 40
BENCHMARKS_BYTES, RESULT_FILES, DOCS_BYTES, MARKDOWN_BYTES = 20_000, 30, 4_000_000, 80_000
CODE = ("specviz", "scripts", "tests", "app.py", ".ci")
BINARY_OR_DATA = (".json", ".jsonl", ".gz", ".png", ".npz", ".npy", ".safetensors")
MODEL_WRITTEN = ("assets/draft_text/",)    # code a model wrote for the trigram's corpus: its paths are examples

# An absolute path of a machine: its temporary folders, a home folder, the root user's folder. A path that starts
# after a word character, a dot or a tilde (a URL's path, ./tmp, ~/.cache) is not one.
MACHINE_PATH = re.compile(r"(?<![\w.~$/-])/(?:tmp|var/tmp|root)(?![\w.-])|(?<![\w.~$/-])/(?:home|Users)/[\w.-]+")
# "session" in the sense of a period of work; a browser's session is written as one ("browser session",
# "a visitor's session"), and names in code spans (`sessions.py`, SPECVIZ_MAX_SESSIONS) are not prose.
SESSION = re.compile(r"\bsessions?\b", re.IGNORECASE)
BROWSER_SESSION = re.compile(r"\b(?:browser|visitor'?s'?|user'?s'?|page'?s'?|gradio|http)\s+sessions?\b", re.IGNORECASE)
# a date, a commit named in prose, or a month and year: history, which git keeps
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"
                  r"|\bcommits?\s+[0-9a-f]{7,40}\b"
                  r"|\((?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\)"
                  r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? 20\d\d\b")


def tracked(*paths: str) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def text_of(name: str) -> str | None:
    """A tracked file's text (a gzipped one's too), or None for binary files."""
    data = (ROOT / name).read_bytes()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def prose(markdown: str) -> str:
    """Markdown without its front matter, fenced code blocks and inline code spans."""
    markdown = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.S)
    markdown = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", markdown)


def sentences(markdown: str) -> list[str]:
    """The prose's sentences: blocks split at blank lines, headings, list items and table rows, then at the
    punctuation that ends a sentence."""
    blocks, block = [], []
    for line in prose(markdown).splitlines():
        starts = re.match(r"\s*(#|[-*] |\d+\. |\||!\[)", line)
        if not line.strip() or starts:
            blocks.append(" ".join(block))
            block = []
        if line.strip() and not line.lstrip().startswith(("|", "![")):
            block.append(re.sub(r"^\s*(#+|[-*]|\d+\.)\s+", "", line.strip()))
    blocks.append(" ".join(block))
    return [s for b in blocks for s in re.split(r"(?<=[.!?])\s+", b) if s.strip()]


def long_sentences(markdown: str, limit: int = SENTENCE_WORDS) -> list[str]:
    return [f"{len(s.split())} words: {s[:100]}..." for s in sentences(markdown) if len(s.split()) > limit]


def readme_problems(readme: str) -> list[str]:
    problems = []
    if len(readme) > README_CHARS:
        problems.append(f"{len(readme)} characters (at most {README_CHARS})")
    if PAPER not in readme:
        problems.append(f"the paper ({PAPER}) is not linked")
    first = "\n".join(readme.splitlines()[:COMMAND_LINES])
    problems += [f"`{c}` is not in the first {COMMAND_LINES} lines" for c in COMMANDS if c not in first]
    return problems + long_sentences(readme)


def benchmarks_problems(benchmarks: str) -> list[str]:
    """At most BENCHMARKS_BYTES, and the first thing after the title is a table naming staged, llama.cpp and HF
    assisted generation."""
    problems = []
    if len(benchmarks.encode()) > BENCHMARKS_BYTES:
        problems.append(f"{len(benchmarks.encode())} bytes (at most {BENCHMARKS_BYTES})")
    lines = [line for line in benchmarks.splitlines() if line.strip() and not line.startswith("# ")]
    table = []
    for line in lines:
        if not line.lstrip().startswith("|"):
            break
        table.append(line)
    if not table:
        problems.append("it does not open on a table")
    named = " ".join(table).lower()
    problems += [f"its first table does not name {who}" for who in ("staged", "llama.cpp", "hf assisted")
                 if who not in named]
    return problems


def machine_paths(text: str) -> list[str]:
    return [m.group() for m in MACHINE_PATH.finditer(text)]


def work_sessions(text: str, markdown: bool) -> list[str]:
    """Lines that speak of a session other than a browser's."""
    text = prose(text) if markdown else text
    found = []
    for line in text.splitlines():
        if len(SESSION.findall(line)) > len(BROWSER_SESSION.findall(line)):
            found.append(line.strip()[:120])
    return found


def listing(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{name}: {item}" for name, items in found.items() for item in items)


def dated_lines(text: str) -> list[str]:
    return [line.strip()[:120] for line in text.splitlines() if DATE.search(line)]


def project_problems(pyproject: str, licence: str | None) -> list[str]:
    """pyproject.toml with ruff's settings (lines of at most 120, at least ruff's default rules and long lines),
    and an Apache-2.0 LICENSE."""
    ruff = tomllib.loads(pyproject).get("tool", {}).get("ruff", {})
    problems = [] if ruff else ["pyproject.toml has no [tool.ruff]"]
    if ruff and not ruff.get("line-length", 88) <= 120:
        problems.append(f"ruff's line length is {ruff['line-length']} (at most 120)")
    rules = set(ruff.get("lint", {}).get("select", ["E4", "E7", "E9", "F"]))
    if ruff and not {"E4", "E7", "E9", "F", "E501"} <= rules:
        problems.append(f"ruff selects {sorted(rules)}: not ruff's defaults and E501")
    if licence is None or "Apache License" not in licence or "Version 2.0" not in licence:
        problems.append("no Apache-2.0 LICENSE")
    return problems


def ruff_findings(*paths: str) -> str:
    """What `ruff check` (the settings in pyproject.toml) finds; empty where it finds nothing. ruff is pinned in
    requirements.txt, so a missing ruff is a broken set-up, not a reason to skip."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--config", str(ROOT / "pyproject.toml"), *paths], cwd=ROOT, capture_output=True, text=True)
    assert "No module named ruff" not in done.stderr, "ruff is not installed: bash scripts/setup.sh installs it"
    return "" if done.returncode == 0 else (done.stdout[-3000:] + done.stderr[-1000:]).strip()


# ---- the repository


def test_the_readme_is_short_links_the_paper_and_starts_with_the_two_commands():
    assert not readme_problems((ROOT / "README.md").read_text(encoding="utf-8"))


def test_benchmarks_is_short_and_opens_on_the_peers_table():
    assert not benchmarks_problems((ROOT / "docs/BENCHMARKS.md").read_text(encoding="utf-8"))


def test_the_docs_stay_small():
    results = tracked("docs/benchmarks")
    assert len(results) <= RESULT_FILES, f"{len(results)} files in docs/benchmarks (at most {RESULT_FILES})"
    docs = sum((ROOT / name).stat().st_size for name in tracked("docs"))
    assert docs <= DOCS_BYTES, f"docs/ holds {docs} bytes (at most {DOCS_BYTES})"
    markdown = sum((ROOT / name).stat().st_size for name in tracked("*.md"))
    assert markdown <= MARKDOWN_BYTES, f"the Markdown files hold {markdown} bytes (at most {MARKDOWN_BYTES})"


def test_no_tracked_file_outside_the_tests_names_a_machine_path():
    names = [name for name in tracked(".") if not name.startswith(("tests/", *MODEL_WRITTEN))]
    found = {name: paths for name in names if (text := text_of(name)) is not None and (paths := machine_paths(text))}
    assert not found, "name the repository's folders, or a variable, instead:\n" + listing(found)


def test_no_doc_or_result_file_speaks_of_work_sessions():
    names = tracked("*.md", "docs")
    found = {name: lines for name in names
             if (text := text_of(name)) is not None and (lines := work_sessions(text, name.endswith(".md")))}
    assert not found, "say what was measured, and when, instead (a browser's session is a 'browser session'):\n" \
        + listing(found)


def test_no_code_carries_dates_or_commits():
    """Code and comments say why the code is as it is today; the history is in git."""
    names = [name for name in tracked(*CODE) if not name.endswith(BINARY_OR_DATA)]
    found = {name: lines for name in names if (text := text_of(name)) is not None and (lines := dated_lines(text))}
    assert not found, "say why the code is as it is today; git keeps the history:\n" + listing(found)


def test_the_project_has_ruff_settings_and_a_licence():
    licence = ROOT / "LICENSE"
    assert not project_problems((ROOT / "pyproject.toml").read_text(),
                                licence.read_text() if licence.is_file() else None)


def test_ruff_check_is_clean():
    found = ruff_findings()
    assert not found, found


# ---- each rule fails on an input that breaks it


GOOD_README = ("# x\n\nStaged speculative decoding ([paper](https://arxiv.org/abs/2308.04623)).\n\n```bash\n"
               + "\n".join(COMMANDS) + "\n```\n")


def test_the_readme_rules_can_fail():
    assert readme_problems(GOOD_README) == []
    assert readme_problems(GOOD_README + "x" * README_CHARS)[0].endswith(f"(at most {README_CHARS})")
    assert readme_problems(GOOD_README.replace("2308.04623", "2308.00000")) == [f"the paper ({PAPER}) is not linked"]
    late = "# x\n" + "\n" * COMMAND_LINES + GOOD_README
    assert len(readme_problems(late)) == 2
    assert len(readme_problems(GOOD_README + "\n" + "word " * 41 + "end.\n")) == 1


def test_a_sentence_is_counted_across_lines_and_not_across_list_items_or_code():
    forty = " ".join(["word"] * 40)
    assert long_sentences(f"{forty}.\n") == []
    assert long_sentences(f"{forty[:100]}\n{forty[100:]} and more.\n")                 # one sentence, two lines
    assert long_sentences(f"- {forty}\n- {forty}\n") == []                             # two list items
    assert long_sentences(f"{forty}. {forty}.\n") == []
    assert long_sentences(f"```\n{forty} {forty}\n```\n`{forty} {forty}`\n") == []     # code is not prose
    assert long_sentences(f"---\ntitle: {forty} {forty}\n---\n") == []                 # nor the front matter


def test_the_benchmarks_rules_can_fail():
    table = "| decoder | tok/s |\n| --- | --- |\n| llama.cpp | 1 |\n| HF assisted | 1 |\n| staged | 2 |\n"
    assert benchmarks_problems(f"# Benchmarks\n\n{table}\nText.\n") == []
    assert benchmarks_problems(f"# Benchmarks\n\nText first.\n\n{table}") == [
        "it does not open on a table", "its first table does not name staged",
        "its first table does not name llama.cpp", "its first table does not name hf assisted"]
    assert benchmarks_problems(f"# B\n\n{table.replace('HF assisted', 'HF generate')}") == [
        "its first table does not name hf assisted"]
    too_long = f"# B\n\n{table}" + "x" * BENCHMARKS_BYTES
    assert benchmarks_problems(too_long) == [f"{len(too_long)} bytes (at most {BENCHMARKS_BYTES})"]


def test_the_machine_path_rule_can_fail():
    tmp, root, home = "/" + "tmp", "/" + "root", "/" + "home"
    assert machine_paths(f"--out {tmp}/k/x.json") == [tmp]
    assert machine_paths(f'"stored in {root}/.cache/specviz/auto.json"') == [root]
    assert machine_paths(f"cd {home}/alice/specviz") == [f"{home}/alice"]
    assert machine_paths(f"see {tmp}, then") == [tmp]
    assert machine_paths("~/.cache/specviz, out/tmp/x, https://example.org/root/x, /usr/bin/chromium, "
                         "/proc/stat, $SPECVIZ_CACHE/auto.json, ./tmp") == []


def test_the_work_session_rule_can_fail():
    word = "sess" + "ion"
    assert work_sessions(f"measured in this {word}", markdown=True)
    assert work_sessions(f"A {word} on a GPU could train more.", markdown=True)
    assert work_sessions(f'{{"round": "{word} 1, headless"}}', markdown=False)
    assert not work_sessions(f"each browser {word} has its own decoder; a visitor's {word} idles", markdown=True)
    assert not work_sessions(f"`SPECVIZ_MAX_{word.upper()}S` and `{word}s.py`", markdown=True)


def test_the_date_rule_can_fail():
    year = "20" + "26"
    assert dated_lines(f"# 0.1 until {year}-11-22") and dated_lines(f"x = 1  # before {year}-11-25 it was 2")
    commit = "f113" + "afa"
    assert dated_lines(f"# changed in commit {commit}") and dated_lines(f"# 0.1 until then ({commit})")
    assert dated_lines(f"# measured in Nov {year}")
    assert not dated_lines("x = 0x7fffffff  # the largest int32; sha256 abcdef0123456789 checked")
    assert not dated_lines("(1234567) rows and (abcdefa) names")     # all digits or all letters: no commit


def test_the_project_rules_can_fail():
    licence = (ROOT / "LICENSE").read_text()
    good = '[tool.ruff]\nline-length = 120\n[tool.ruff.lint]\nselect = ["E4", "E7", "E9", "E501", "F"]\n'
    assert project_problems(good, licence) == []
    assert project_problems(good.replace("120", "140"), licence) == ["ruff's line length is 140 (at most 120)"]
    assert project_problems(good.replace('"E501", ', ""), licence)[0].startswith("ruff selects")
    assert project_problems("[project]\nname = 'x'\n", licence) == ["pyproject.toml has no [tool.ruff]"]
    assert project_problems(good, None) == project_problems(good, "MIT License") == ["no Apache-2.0 LICENSE"]


def test_ruff_finds_a_long_line_and_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = " + " + ".join(["1"] * 40) + "\n")
    found = ruff_findings(str(bad))
    assert "E501" in found and "F401" in found
    bad.write_text("x = 1\n")
    assert ruff_findings(str(bad)) == ""
