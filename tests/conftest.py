import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)    # tiny models: threads only add overhead, and CI has two cores
# the tests need no network after setup: models load from the local caches, in this process and in the ones it starts,
# with no request to the hub first
os.environ.setdefault("HF_HUB_OFFLINE", "1")

settings.register_profile("specviz", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          max_examples=int(os.environ.get("SPECVIZ_EXAMPLES", "25")))
settings.load_profile("specviz")


# tests/test_blocks.py's tests that compile blocks.c anew (for every instruction set, changed copies that must fail,
# ARM64 under qemu): slow, as the other kernel builds are, marked here so that the file keeps to the kernels alone
KERNEL_BUILDS = {"test_every_build_computes_the_definition_bit_for_bit",
                 "test_a_kernel_that_sums_in_another_order_for_many_rows_fails_these_tests",
                 "test_a_columns_product_that_sums_in_another_order_fails_these_tests",
                 "test_an_amx_product_that_sums_in_another_order_fails_these_tests",
                 "test_arm64_builds_compute_the_definition_bit_for_bit_under_emulation"}


# The files that take longest on 2 cores, longest first: pytest.ini hands whole files to the two workers in the order
# collected, and starting the long ones first keeps one worker from finishing minutes after the other
LONGEST_FIRST = ("test_qwen_coder.py", "test_space.py", "test_sampling_exact.py", "test_browser.py", "test_blocks.py",
                 "test_build.py", "test_under_load.py", "test_int4.py", "test_round_plan.py", "test_file_model.py",
                 "test_lossless.py")


@pytest.hookimpl(tryfirst=True)         # before `-m` selects: a browser test is a slow one too
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("browser") is not None or getattr(item, "originalname", None) in KERNEL_BUILDS:
            item.add_marker(pytest.mark.slow)
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))        # stable: each file's own order stays


@pytest.fixture(scope="session")
def kernel_builds(request, tmp_path_factory) -> Path:
    """A user cache (SPECVIZ_CACHE) for tests that build specviz's kernels in a fresh process: empty when this run
    starts, and shared by its workers (in the directory pytest gives the run, above each worker's own, which it cleans
    up as it does theirs). A build's library is named by its sources and flags and written whole, so each build
    compiles once a run (twice where two workers meet it at once), and each process loads the build it asked for."""
    under_xdist = hasattr(request.config, "workerinput")
    path = (tmp_path_factory.getbasetemp().parent if under_xdist else tmp_path_factory.getbasetemp()) / "kernel-builds"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    from tiny import TinyTokenizer
    return TinyTokenizer()


@pytest.fixture(scope="session")
def smollm2():
    """The real offline default target (SmolLM2-135M-Instruct), loaded once per test session."""
    from specviz.models.load import load_model
    return load_model("smollm2-135m")


@pytest.fixture
def own_profile(tmp_path, monkeypatch):
    """An empty profile of this machine (specviz/profile/store.py) in a file of this test's, with records of its own,
    as a new process has; the machine's real profile stays as setup left it. The test hands it to what it loads; what
    makes a profile of its own (the CLI, prepare, the processes it starts) reads the same file, as SPECVIZ_PROFILE
    names it. Nothing is measured outside `preparing`. Tests run beside another worker: what they measure is stored
    whatever the load (test_profile_store tests the guard)."""
    from specviz.profile.store import FILE, PROFILE_FILE, Profile
    monkeypatch.setenv(PROFILE_FILE, str(tmp_path / FILE))
    return Profile(tmp_path / FILE, busy_share=1.0)


@pytest.fixture
def preparing(own_profile):
    """An empty profile that this test measures into, as `python -m specviz.prepare` does."""
    with own_profile.preparing("the tests"):
        yield own_profile


FAILURES = Path(__file__).resolve().parents[1] / "out" / "failures"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing browser test leaves a screenshot and the page's HTML, and the report names the folder,
    so a failure on another machine can be read from its CI log without a rerun."""
    outcome = yield
    report = outcome.get_result()
    page = item.funcargs.get("page") if hasattr(item, "funcargs") else None
    if report.when != "call" or not report.failed or page is None:
        return
    folder = FAILURES / item.name
    folder.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(folder / "page.png"), full_page=True)
        (folder / "page.html").write_text(page.content(), encoding="utf-8")
        saved = f"screenshot and HTML of the page saved in {folder}"
    except Exception as exc:        # the browser itself may be what failed
        saved = f"could not save the page to {folder}: {exc}"
    report.sections.append(("browser page", saved))


# -- the app's offline preset on tiny random models (test_app, test_recording) ----------------------

@pytest.fixture
def own_stacks():
    """The app's loaded stacks for this test alone: none at first, and none of them left for the next test."""
    from specviz.app import stacks
    with stacks.isolated() as held:
        yield held


@pytest.fixture
def tiny_default(own_stacks):
    """The 'offline' preset replaced by tiny random models: a target, a noisy copy as draft, lookup."""
    from tiny import WordTokenizer, tiny_stack

    def install(drafts=("draft", "lookup"), int4: bool = False):
        return own_stacks.hold(("offline",), tiny_stack(drafts, WordTokenizer(), int4=int4))
    return install
