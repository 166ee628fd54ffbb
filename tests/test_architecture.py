"""The layout's rules, checked from the source. specviz/ is packages by role, and each package's docstring says what
it may import: an import of a package (or module) it does not name fails here, so the docstrings are the rules. No
circle between packages or between modules; decode/ reaches a model only through backends/interface.py, and importing
it loads no cache kind and no machine state; only the app imports the app. No module grows past MAX_LINES without
saying why, nothing patches a model's methods at run time, one class has one name, and no class grows past
MAX_METHODS."""
import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SPECVIZ = Path(__file__).resolve().parents[1] / "specviz"
ROOT = "specviz"            # the package root (the version, where files live): below every package, any may import it
THE_ROUND = "decode"
THE_INTERFACE = "specviz.backends.interface"
THE_APP = "app"
MAY_IMPORT = re.compile(r"may\s+import\s+(.*?)\.(?!py)(?:\s|$)", re.IGNORECASE | re.DOTALL)
NAMED = re.compile(r"\b([a-z_]+)/(?:([a-z_]+)\.py)?")
MAX_LINES = 350
REASON = "Longer than"        # a docstring that says "Longer than 350 lines because …" lets a module grow
MODEL_METHODS = {"forward", "__call__", "__class__", "generate", "prepare_inputs_for_generation"}
MAX_METHODS = 15


def modules() -> dict[str, Path]:
    out = {}
    for path in SPECVIZ.rglob("*.py"):
        parts = path.relative_to(SPECVIZ.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The specviz modules `name` imports (a package's own children are not counted for its face)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    if path.name == "__init__.py":
        found = {f for f in found if not f.startswith(name + ".")}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def package(name: str) -> str:
    """The package a module belongs to: `decode` for specviz.decode.drafters.base, ROOT for the root itself."""
    return name.split(".")[1] if "." in name else ROOT


def is_command(name: str, path: Path) -> bool:
    """A command's entry point, not a layer: a `__main__`, or a module at the top of specviz/ (cli, prepare)."""
    return name.endswith(".__main__") or (name.count(".") == 1 and path.name != "__init__.py")


def packages() -> dict[str, Path]:
    return {p.name: p / "__init__.py" for p in sorted(SPECVIZ.iterdir()) if (p / "__init__.py").is_file()}


def may_import(doc: str) -> set[str] | None:
    """What a package's docstring says it may import (`It may import models/, backends/interface.py and cpu/.`), as
    dotted names; None where it does not say."""
    said = MAY_IMPORT.search(doc)
    if said is None:
        return None
    return {f"{ROOT}.{p}.{m}" if m else f"{ROOT}.{p}" for p, m in NAMED.findall(said.group(1))}


def rules() -> dict[str, set[str] | None]:
    return {name: may_import(ast.get_docstring(ast.parse(init.read_text())) or "") for name, init in packages().items()}


def layered_graph() -> dict[str, set[str]]:
    """Each module's imports, commands left out: they sit above every layer."""
    mods = modules()
    return {name: targets for name, targets in graph().items() if not is_command(name, mods[name])}


def outside_its_rule(edges: dict[str, set[str]], allowed: dict[str, set[str] | None]) -> list[str]:
    """The imports that reach a package (or a module) the importer's package does not say it may import."""
    bad = []
    for name, targets in edges.items():
        own = package(name)
        for target in sorted(targets):
            if package(target) in (own, ROOT):
                continue
            if own == ROOT or not any(target == a or target.startswith(a + ".") for a in allowed.get(own) or ()):
                bad.append(f"{name} -> {target}")
    return sorted(bad)


def between_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out = defaultdict(set)
    for name, targets in edges.items():
        out[package(name)] |= {package(t) for t in targets if package(t) != package(name)}
    every = {package(n) for n in edges} | {package(t) for targets in edges.values() for t in targets}
    return {p: out.get(p, set()) for p in every}


def into_the_app(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, targets in edges.items() for target in targets
                  if package(target) == THE_APP and package(name) != THE_APP)


def out_of_the_round(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, targets in edges.items() if package(name) == THE_ROUND
                  for target in targets if package(target) not in (THE_ROUND, ROOT) and target != THE_INTERFACE)


def test_every_package_says_what_it_may_import():
    said = rules()
    assert {name for name, allowed in said.items() if allowed is None} == set()
    known = set(modules())
    assert sorted(f"{name}: {a}" for name, allowed in said.items() for a in allowed if a not in known) == []


def test_each_package_imports_only_what_its_docstring_names():
    assert outside_its_rule(layered_graph(), rules()) == []


def test_no_circle_between_packages():
    assert cycles(between_packages(layered_graph())) == []
    said = {name: {package(a) for a in allowed} for name, allowed in rules().items()}
    assert cycles(said) == []         # nor in what the docstrings allow


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_round_reaches_a_model_only_through_the_backend_interface():
    assert out_of_the_round(graph()) == []


def test_only_the_app_imports_the_app():
    assert into_the_app(graph()) == []


def test_modules_stay_small_or_say_why():
    big = {}
    for name, path in modules().items():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_LINES and REASON not in doc:
            big[name] = text.count("\n")
    assert big == {}


def test_the_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert imports("specviz.decode.tree", SPECVIZ / "decode/tree.py", {"specviz.decode.tree",
                                                                       "specviz.decode.trace"}) == set()
    assert "specviz.decode.trace" in imports("specviz.decode.engine", SPECVIZ / "decode/engine.py", set(modules()))
    assert may_import("The round. It may import backends/interface.py and cpu/. Not app/.") == {
        "specviz.backends.interface", "specviz.cpu"}
    assert may_import("Nothing said.") is None and may_import("It may import nothing but the package root.") == set()
    edges = {"specviz.decode.engine": {"specviz.backends.choose", "specviz.decode.tree", "specviz"},
             "specviz.stack.load": {"specviz.decode.engine", "specviz.app.stacks"},
             "specviz.app.race": {"specviz.stack.load"}, "specviz.recording.__main__": {"specviz.app.record"}}
    allowed = {"decode": {"specviz.backends.interface"}, "stack": {"specviz.decode"}}
    assert outside_its_rule(edges, allowed) == ["specviz.app.race -> specviz.stack.load",
                                                "specviz.decode.engine -> specviz.backends.choose",
                                                "specviz.recording.__main__ -> specviz.app.record",
                                                "specviz.stack.load -> specviz.app.stacks"]
    assert cycles(between_packages(edges)) == [["app", "stack"]]
    assert out_of_the_round(edges) == ["specviz.decode.engine -> specviz.backends.choose"]
    assert into_the_app(edges) == ["specviz.recording.__main__ -> specviz.app.record",
                                   "specviz.stack.load -> specviz.app.stacks"]


def loaded_by(names: tuple[str, ...]) -> set[str]:
    """The specviz modules a fresh interpreter holds after importing `names` (an import in this process would
    see whatever earlier tests loaded)."""
    code = (f"import importlib, json, sys; [importlib.import_module(n) for n in {list(names)!r}]; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('specviz'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SPECVIZ.parent).stdout
    return set(json.loads(out.splitlines()[-1]))


def beside_the_round(loaded: set[str]) -> list[str]:
    """What a process holds besides decode/, the root and the backend interface (a cache kind, cpu/, the profile)."""
    return sorted(m for m in loaded if package(m) not in (THE_ROUND, ROOT)
                  and m not in (THE_INTERFACE, THE_INTERFACE.rpartition(".")[0]))


def _is_class(node: ast.expr) -> bool:
    """Whether an expression names a class by its spelling (`Linear`, `torch.nn.Linear`, `type(x)`)."""
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "type"
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name[:1].isupper()


def method_patches(source: str) -> list[str]:
    """Where a source binds a method at run time: an assignment to a model method's attribute (`m.forward = ...`),
    a function or lambda assigned onto a class, setattr with a model method's name, or types.MethodType."""
    tree = ast.parse(source)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for target in targets:
                if not isinstance(target, ast.Attribute):
                    continue
                onto_class = _is_class(target.value) and (
                    isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions))
                if target.attr in MODEL_METHODS or onto_class:
                    found.append(f"line {node.lineno}: {ast.unparse(target)} = ...")
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func in ("types.MethodType", "MethodType"):
                found.append(f"line {node.lineno}: {func}(...)")
            elif func == "setattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value in MODEL_METHODS:
                found.append(f"line {node.lineno}: setattr(..., {node.args[1].value!r}, ...)")
    return found


def classes(sources: dict[str, str]) -> dict[str, list[tuple[str, int]]]:
    """Every class defined in the sources (by module name): its name -> [(module, methods defined in its body)]."""
    found = defaultdict(list)
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
                found[node.name].append((module, methods))
    return dict(found)


def twice_named(found: dict[str, list[tuple[str, int]]]) -> dict[str, list[str]]:
    return {name: sorted(module for module, _ in where) for name, where in found.items() if len(where) > 1}


def too_many_methods(found: dict[str, list[tuple[str, int]]]) -> list[str]:
    return sorted(f"{module}.{name}: {methods} methods" for name, where in found.items()
                  for module, methods in where if methods > MAX_METHODS)


def sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in modules().items()}


def test_importing_the_round_loads_no_cache_kind_and_no_machine_state():
    assert beside_the_round(loaded_by(tuple(sorted(n for n in modules() if package(n) == THE_ROUND)))) == []


def test_no_model_method_is_patched_at_run_time():
    patched = {name: found for name, source in sources().items() if (found := method_patches(source))}
    assert patched == {}


def test_one_class_one_name():
    assert twice_named(classes(sources())) == {}


def test_no_class_has_more_than_15_methods():
    assert MAX_METHODS == 15
    assert too_many_methods(classes(sources())) == []


def test_a_drafter_fills_six_methods():
    """The anchors' drafters have 2 to 5 (llama.cpp's common_speculative, vLLM's proposers): what a drafter knows
    of a path is one question (`seen`), and the stages below it are a chain of `lower` (`cascade`)."""
    tree = ast.parse((SPECVIZ / THE_ROUND / "drafters" / "base.py").read_text())
    drafter = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Drafter")
    public = sorted(f.name for f in drafter.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_"))
    assert public == ["commit", "expand", "guess", "kv_models", "seen", "start"]


def test_the_core_checks_can_fail():
    assert "specviz.cpu.machine" in beside_the_round(loaded_by(("specviz.decode.tree", "specviz.cpu.machine")))
    assert beside_the_round({"specviz", "specviz.profile.store", "specviz.backends", "specviz.backends.interface",
                             "specviz.backends.choose", "specviz.decode.tree"}) == ["specviz.backends.choose",
                                                                                    "specviz.profile.store"]
    patches = method_patches(
        "import types\n"
        "def fast(self, x):\n    return x\n"
        "def install(model, linear):\n"
        "    linear.forward = types.MethodType(fast, linear)\n"
        "    setattr(model, 'forward', fast)\n"
        "    torch.nn.Linear.extra_repr = fast\n"
        "    type(model).generate = lambda self: None\n"
        "    model.__class__ = Other\n")
    assert [p.split(":")[0] for p in patches] == ["line 5", "line 7", "line 8", "line 9", "line 5", "line 6"]
    # storing a callable on an instance, or replacing a child module, is no patch
    assert method_patches("def f(): pass\nclass A:\n    def __init__(self, g):\n        self.g = f\n"
                          "        self.h = g\n        setattr(parent, name, Child())\n") == []
    found = classes({"a": "class Decoder:\n    pass\n",
                     "b": "class Decoder:\n" + "".join(f"    def m{i}(self): pass\n" for i in range(16)),
                     "c": "class Small:\n    def m(self): pass\n"})
    assert twice_named(found) == {"Decoder": ["a", "b"]}
    assert too_many_methods(found) == ["b.Decoder: 16 methods"]
    assert too_many_methods(classes({"c": "class Small:\n    def m(self): pass\n"})) == []


MAX_ROUND_MODULES = 10      # gpt-fast's round reads in 2 modules; ours drafts a tree in three stages


def profiled(run, note) -> None:
    """run() with `note(frame, event, arg)` told of every call, on every thread: those run() starts, and the app's
    compute thread, which an earlier test in this worker may have started (threading.setprofile reaches only later
    threads)."""
    import threading

    from specviz.app.compute import COMPUTE
    threading.setprofile(note)
    sys.setprofile(note)
    COMPUTE.submit(sys.setprofile, note).result()
    try:
        run()
    finally:
        COMPUTE.submit(sys.setprofile, None).result()
        sys.setprofile(None)
        threading.setprofile(None)


def module_of(code) -> str | None:
    """The dotted name of the specviz module a code object belongs to (None outside specviz/)."""
    if not code.co_filename.startswith(str(SPECVIZ)):
        return None
    return ".".join(Path(code.co_filename).relative_to(SPECVIZ.parent).with_suffix("").parts)


def modules_entered(run) -> set[str]:
    """The modules of specviz/ whose code runs while `run()` does."""
    entered = set()

    def note(frame, event, _arg):
        name = module_of(frame.f_code) if event == "call" else None
        if name is not None:
            entered.add(name)
    profiled(run, note)
    return entered


def test_a_staged_round_reads_in_at_most_10_modules_of_the_round():
    """A reader follows one staged round (Decoder.step) with a model draft and a trigram below it through at most
    MAX_ROUND_MODULES modules of decode/."""
    from tiny import TinyTokenizer, tiny_stack

    from specviz.decode.drafters.ngram import KatzTrigram
    from specviz.decode.sampling import Sampling
    from specviz.stack.strategies import default_tree
    table = KatzTrigram.build([[(3 * i + j) % 40 for j in range(30)] for i in range(20)], 64)
    stack = tiny_stack(("draft", "trigram:auto"), TinyTokenizer(), loaded={"trigram:auto": table})
    decoder = stack.decoder([3, 6, 9, 12, 3, 6], "staged", default_tree("staged"), Sampling(), 24, stop_at_eos=False)
    decoder.step()
    entered = modules_entered(lambda: [decoder.step() for _ in range(3)])
    read = sorted(m for m in entered if package(m) == THE_ROUND)
    assert {"specviz.decode.engine", "specviz.decode.drafters.model", "specviz.decode.drafters.ngram"} <= set(read)
    assert len(read) <= MAX_ROUND_MODULES, read


MOST_STAYS = 2      # a visitor's first Step, from its settings to its decoder, enters each module at most this often


def stays(calls: list[tuple[str, str]]) -> dict[str, int]:
    """How often a reader following `calls` ((module, function) of each call, in order) enters each module to read
    something new: a run of calls within one module is one stay, and a stay that reads only functions read before (a
    value's constructor made again, a base class's __init__ for its second subclass) is no new reading."""
    counts: dict[str, int] = defaultdict(int)
    read: set[tuple[str, str]] = set()
    counted = False         # whether this stay has read something new
    for i, call in enumerate(calls):
        if i == 0 or calls[i - 1][0] != call[0]:
            counted = False
        if call not in read and not counted:
            counts[call[0]] += 1
            counted = True
        read.add(call)
    return dict(counts)


def calls_until(run, module: str, function: str) -> list[tuple[str, str]]:
    """(module, function) of each call into a module of specviz/ from another one while
    `run()` does, up to the first call of `function` in `module`: what a reader opens, not the calls within a module."""
    calls: list[tuple[str, str]] = []
    done: list[bool] = []

    def caller_module(frame) -> str | None:
        while frame is not None and module_of(frame.f_code) is None:
            frame = frame.f_back
        return None if frame is None else module_of(frame.f_code)

    def note(frame, event, _arg):
        name = module_of(frame.f_code)
        if event != "call" or done or name is None:
            return
        if name == module and frame.f_code.co_name == function:
            done.append(True)
        elif caller_module(frame.f_back) != name:
            calls.append((name, frame.f_code.co_name))
    profiled(run, note)
    assert done, f"{module}.{function} never ran"
    return calls


@pytest.mark.parametrize("int4", [False, True], ids=["float", "own-forward"])
def test_a_visitors_first_step_enters_no_module_more_than_twice(tiny_default, int4):
    """From the page's settings to the decoder of a visitor's first Step (staged, the preset loaded), a reader enters
    each module at most MOST_STAYS times: the stack's fixed facts (its tokenizer, its drafters' specs, the plan's key)
    are values made once, and the plan is read once per decoder. Opening the models' caches counts too, through
    transformers' modules (float) and through specviz's own forward and kernels (int4, as the real pair runs)."""
    from test_app import controls

    from specviz.app import events
    from specviz.app.sessions import Session
    tiny_default(int4=int4)
    session = Session()
    calls = calls_until(lambda: list(events.on_step(session, *controls(strategy="staged"))),
                        "specviz.decode.engine", "__init__")
    counted = stays(calls)
    assert {"specviz.app.events", "specviz.stack.stack", "specviz.stack.plans"} <= set(counted)
    assert ("specviz.backends.own" in counted) == int4 and "specviz.backends.choose" in counted
    assert max(counted.values()) <= MOST_STAYS, {m: n for m, n in counted.items() if n > MOST_STAYS} or counted


def test_stays_count_a_return_to_a_module_to_read_more_and_not_a_call_within_it():
    calls = [("a", "f"), ("a", "g"), ("b", "f"), ("a", "h"), ("c", "f"), ("c", "g"), ("a", "i")]
    assert stays(calls) == {"a": 3, "b": 1, "c": 1}
    assert stays([("a", "f"), ("b", "f"), ("a", "f"), ("b", "g"), ("a", "f")]) == {"a": 1, "b": 2}
    assert stays([("a", "f"), ("b", "f"), ("a", "f"), ("a", "g")]) == {"a": 2, "b": 1}     # f again, then g: new
    assert stays([]) == {}
