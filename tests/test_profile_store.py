"""`auto` decides once per machine (specviz/profile/store.py): prepare measures, and a process started while the machine
is busy reads the stored decision instead of a slowed probe, so it never loads another stack or precision."""
import json
import os
import subprocess
import sys
import threading
import time
import types

import pytest

import specviz.profile.store as machine_profile
import specviz.models.precision as precision
import specviz.stack.presets as presets

# one probe layer's token, s
IDLE = {"float32": 0.040, "bfloat16": 0.030, "int4": 0.008, "int8": 0.0085, "gguf": 0.009}
# the same machine under load
BUSY = {"float32": 0.016, "bfloat16": 0.034, "int4": 0.019, "int8": 0.012, "gguf": 0.020}


def new_process(profile, monkeypatch, timings: dict) -> None:
    """What a process starting now sees: no probe measured in it yet, and the probe timing `timings`."""
    profile.restart()
    monkeypatch.setattr(precision, "_probe_layer", lambda dtype: {1: timings[dtype], 2: 2 * timings[dtype]})


@pytest.fixture
def store(own_profile):
    with own_profile.preparing("the tests"):        # as `python -m specviz.prepare` measures
        yield own_profile


def test_a_busy_machine_keeps_the_stored_precision_and_stack(store, monkeypatch):
    new_process(store, monkeypatch, IDLE)
    picked, token_s = precision.resolve_dtype("auto", store), presets.predicted_token_seconds(store)
    target = precision.auto_precision(presets.PRESETS["qwen-coder"].target, store)    # gguf where its file is here
    assert picked == "int4" and token_s == pytest.approx(IDLE[target] * 33)  # the idle machine's pick
    new_process(store, monkeypatch, BUSY)                  # a later process, started while others compute
    assert precision.resolve_dtype("auto", store) == picked
    assert presets.predicted_token_seconds(store) == token_s
    reason = precision.auto_reason(store)
    assert "measured" in reason and "auto.json" in reason       # says where it came from,
    assert str(store.file.path()) not in reason                      # but not the server's own path (a Space shows it)


def test_remeasuring_is_asked_for(store, monkeypatch):
    new_process(store, monkeypatch, IDLE)
    assert precision.resolve_dtype("auto", store) == "int4"
    new_process(store, monkeypatch, BUSY)
    with store.preparing("the tests", remeasure=True):
        assert precision.resolve_dtype("auto", store) == "int8"                           # measured again, and stored
    new_process(store, monkeypatch, IDLE)
    assert precision.resolve_dtype("auto", store) == "int8"
    store.file.forget()
    new_process(store, monkeypatch, IDLE)
    assert precision.resolve_dtype("auto", store) == "int4"


def test_another_machine_measures_anew(store, monkeypatch):
    new_process(store, monkeypatch, IDLE)
    assert precision.resolve_dtype("auto", store) == "int4"
    here = machine_profile.machine()
    monkeypatch.setattr(machine_profile, "machine", lambda: "another CPU")
    new_process(store, monkeypatch, BUSY)
    assert precision.resolve_dtype("auto", store) == "int8"
    assert set(json.loads(store.file.path().read_text())["machines"]) == {here, "another CPU"}     # each keeps its own
    monkeypatch.setattr(machine_profile, "machine", lambda: here)
    new_process(store, monkeypatch, BUSY)
    assert precision.resolve_dtype("auto", store) == "int4"


def test_a_changed_kernel_is_another_machine(monkeypatch):
    """What was timed on one build of specviz's kernels is not taken for another's: the machine key names the loaded
    library, whose file name is a digest of its sources and flags."""
    from specviz.cpu import build, kernels
    loaded, chosen, status = build.library()
    if loaded is None:
        pytest.fail(f"specviz's kernels did not build here: {status}")
    here = machine_profile.machine()
    assert kernels.version() in here and kernels.version().startswith("specviz-")

    class Rebuilt:
        _name = "/cache/kernels/specviz-0123456789ab.so"
    monkeypatch.setattr(build, "library", lambda: (Rebuilt(), chosen, status))
    assert machine_profile.machine() != here and machine_profile.machine().endswith("specviz-0123456789ab")


def test_concurrent_first_uses_measure_once(store):
    calls, results = [], []

    def measure():
        calls.append(1)
        return len(calls)
    threads = [threading.Thread(target=lambda: results.append(store.decided("key", measure)))
               for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert calls == [1] and results == [1, 1, 1, 1]


def test_a_damaged_store_is_measured_again(store):
    store.file.path().write_text("{not json")
    assert store.decided("key", lambda: 7) == 7
    assert store.decided("key", lambda: 8) == 7


def test_the_profile_is_parsed_once_and_again_when_another_process_replaces_it(store, monkeypatch):
    store.decided("key", lambda: 7)
    parses = []
    real_loads = json.loads
    monkeypatch.setattr(machine_profile.json, "loads", lambda text: parses.append(1) or real_loads(text))
    assert [store.stored("key", measured=False) for _ in range(5)] == [7] * 5
    assert len(parses) == 1
    other = real_loads(store.file.path().read_text())      # another process stores a new value, as prepare would
    other["machines"][machine_profile.machine()]["key"]["value"] = 8
    replaced = store.file.path().with_name("other")
    replaced.write_text(json.dumps(other))
    os.replace(replaced, store.file.path())
    assert store.stored("key", measured=False) == 8 and len(parses) == 2


def spin(seconds: float) -> int:
    end, turns = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        turns += 1
    return turns


def recorded_clocks(monkeypatch, readings: list[tuple[tuple[float, float], float]]) -> None:
    """The machine's clocks replaced by recorded readings, one per call of OthersWatch: (the cores' busy and all
    seconds since boot, this process's own CPU seconds). Read at the start and at the end of each measurement."""
    machine, own = iter([r[0] for r in readings]), iter([r[1] for r in readings])
    monkeypatch.setattr(machine_profile, "cpu_seconds", lambda: next(machine))
    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in ("strftime", "gmtime", "sleep")})
    clock.process_time = lambda: next(own)
    monkeypatch.setattr(machine_profile, "time", clock)


def test_what_is_timed_while_others_compute_is_measured_again_and_else_never_stored(store, monkeypatch):
    """The process's own work while it measures is no load; others' work past BUSY_SHARE of the cores is: prepare
    measures again, SETTLE_TRIES times in all, then stores nothing and names the key (its last line says it). On two
    cores, 0.5 s of wall time is 1 core-second: the process's own 0.5 s of busy time leaves others none; 1 s busy is
    others' 50%."""
    store.busy_share = 0.25
    monkeypatch.setattr(machine_profile, "SETTLE_WAIT_S", 0.0)
    recorded_clocks(monkeypatch, [((100.0, 400.0), 5.0), ((100.5, 401.0), 5.5),      # own work: others 0%
                                  ((110.0, 410.0), 6.0), ((111.0, 411.0), 6.5),      # others 50%
                                  ((112.0, 412.0), 7.0), ((113.0, 413.0), 7.5),      # again
                                  ((114.0, 414.0), 8.0), ((115.0, 415.0), 8.5),      # a third time: given up
                                  ((120.0, 420.0), 9.0), ((120.75, 421.0), 9.5),     # others 25%: not past it
                                  ((140.0, 440.0), 11.0), ((141.0, 441.0), 11.5),    # busy once,
                                  ((142.0, 442.0), 12.0), ((142.5, 443.0), 12.5),    # then at rest
                                  ((150.0, 450.0), 13.0), ((150.0, 450.0), 13.0)])   # no time passed: no load
    tries = []

    def measure():
        tries.append(1)
        return f"try {len(tries)}"
    assert store.decided("own work", lambda: "stored") == "stored"
    assert store.decided("busy", measure) == "try 3" and machine_profile.SETTLE_TRIES == 3
    assert store.records.unsettled == {"busy": "other work used 50% of the cores"}
    assert store.decided("a quarter", lambda: "stored too") == "stored too"
    stored = json.loads(store.file.path().read_text())["machines"][machine_profile.machine()]
    assert "own work" in stored and "a quarter" in stored and "busy" not in stored
    assert store.decided("settles", measure) == "try 5"               # its second try is stored
    stored = json.loads(store.file.path().read_text())["machines"][machine_profile.machine()]
    assert stored["settles"]["value"] == "try 5"
    assert store.decided("busy", lambda: "again") == "try 3"    # not timed again by this prepare: what it got
    store.records.unsettled = {}                   # the next prepare
    assert store.decided("busy", lambda: "at rest") == "at rest"      # measured again, now stored
    assert store.decided("busy", lambda: "again") == "at rest"


@pytest.mark.skipif(machine_profile.cpu_seconds() is None, reason="no /proc/stat to tell who used the cores")
def test_the_watch_sees_another_process_spin():
    """The real clocks: one other process spinning while this one spins shows as at least half a core's share (this
    process's own work is left out: the recorded clocks above). One spinner, not one per core: the other test worker
    is timing things too. Any other load on the machine only adds to what the watch sees."""
    cores = os.cpu_count() or 1
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                         # it is running
        watch = machine_profile.OthersWatch()
        spin(0.6)
        assert watch.share() > 0.5 / cores
    finally:
        spinner.kill()
        spinner.wait()

