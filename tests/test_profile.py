"""This machine's profile (specviz/profile/store.py): only `python -m specviz.prepare` measures. A process that
generates times nothing, says in one line where the profile lacks a measurement, uses the stated defaults, and names
where each setting came from (the CLI's --json; the app's race shows the same)."""
import contextlib
import io
import json
from collections import Counter

import pytest

import specviz.profile.store as machine_profile
from specviz.stack import draft_precision
from specviz.models import precision
from specviz import prepare
from specviz.profile import tree_plans as tree_plan_store
from specviz.cli import main
from specviz.cpu import prompt_reader
from specviz.stack.presets import load_preset

pytestmark = pytest.mark.slow         # the real SmolLM2 stack
# every function that times something to fill the profile
TIMERS = [(precision, "_probe_layer"), (draft_precision, "draft_probe_seconds"), (prompt_reader, "choose"),
          (tree_plan_store, "measure")]


@pytest.fixture
def timers(monkeypatch) -> Counter:
    runs = Counter()
    for module, name in TIMERS:
        def counted(*args, _real=getattr(module, name), _name=name, **kwargs):
            runs[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return runs


def generate(*args) -> tuple[dict, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["generate", "--preset", "offline", "--strategy", "staged", "--prompt", "def add(a, b):\n",
                     "--max-new-tokens", "4", "--json", "--no-reference", *args])
    assert code == 0, err.getvalue()[-2000:]
    return json.loads(out.getvalue()), err.getvalue().strip().splitlines()


def test_a_generating_process_times_nothing_and_says_in_one_line_what_the_profile_lacks(own_profile, timers):
    run, said = generate()
    assert sum(timers.values()) == 0 and not own_profile.file.path().exists()
    assert [line for line in said if "profile" in line] == [said[-1]]
    assert said[-1].startswith("specviz: no machine profile here; stated defaults are used")
    draft_key = "draft assets/draft under a lower stage of a gguf target"
    assert f", {draft_precision.STATED_DRAFT} " in run["precision"]         # "gguf (...) target, int4 (...) draft"
    assert run["profile"][draft_key].startswith("a stated default") and len(run["profile"]) >= 3    # plan, reads too
    assert run["preset_reason"] == "asked for (--preset)"


def test_what_prepare_measured_is_what_a_later_process_reads_and_names(own_profile, timers):
    with own_profile.preparing("the tests"):
        load_preset("offline", "auto", profile=own_profile)     # measures the draft's precision, as prepare does
    assert timers["draft_probe_seconds"] == 1                                   # the counters see the timers run
    measured = dict(timers)
    run, said = generate()
    assert dict(timers) == measured                                             # the generating process timed nothing
    draft_key = "draft assets/draft under a lower stage of a gguf target"
    assert run["profile"][draft_key].startswith("measured ") and "by the tests" in run["profile"][draft_key]
    lacking = [line for line in said if "profile" in line]
    assert len(lacking) == 1 and draft_key not in lacking[0] and "lacks" in lacking[0]


def test_prepares_last_line_names_what_did_not_settle_and_what_stands(own_profile, monkeypatch):
    assert prepare.closing_line(own_profile) == "this machine's profile holds every measurement"
    own_profile.records.unsettled = {"probe layer in int8": "other work used 60% of the cores"}
    assert prepare.closing_line(own_profile) == ("could not settle: probe layer in int8 (other work used 60% of the "
                                                 "cores: the stated default stands); run `python -m specviz.prepare` "
                                                 "again on a machine at rest")
    with own_profile.preparing("the tests"):        # measured before: under --remeasure the earlier value stands
        own_profile.decided("probe layer in int4", lambda: {"1": 0.5})
    own_profile.records.unsettled = {"probe layer in int4": "other work used 55% of the cores"}
    assert "(other work used 55% of the cores: the profile's earlier value stands)" in prepare.closing_line(own_profile)


def test_remeasuring_on_a_busy_machine_keeps_the_profile(own_profile, monkeypatch):
    """`prepare --remeasure` beside other work: every key is measured again, none settles, and the profile keeps what it
    held (dropping it first would leave a busy machine on stated defaults). SPECVIZ_REMEASURE=1 asks the same."""
    with own_profile.preparing("the tests"):
        own_profile.decided("probe layer in int4", lambda: {"1": 0.5})
    monkeypatch.setattr(machine_profile, "SETTLE_WAIT_S", 0.0)          # prepare's own profile: the usual busy share
    monkeypatch.setattr(machine_profile.OthersWatch, "share", lambda self: 0.6)      # others use 60% of the cores
    tries = []
    monkeypatch.setattr(prepare, "measure_profile",
                        lambda profile: profile.decided("probe layer in int4", lambda: tries.append(1) or {"1": 9.0}))
    monkeypatch.setattr(prepare, "offline_presets", lambda: [])
    lines = []
    monkeypatch.setattr(prepare, "say", lines.append)
    assert prepare.main(["--remeasure"]) == 0
    assert len(tries) == machine_profile.SETTLE_TRIES                               # measured again, in vain
    assert own_profile.stored("probe layer in int4") == {"1": 0.5}                 # what it held stands
    assert "the profile's earlier value stands" in lines[-1]
    monkeypatch.setenv(machine_profile.REMEASURE, "1")
    tries.clear()
    assert prepare.main([]) == 0 and len(tries) == machine_profile.SETTLE_TRIES
    assert own_profile.stored("probe layer in int4") == {"1": 0.5}
