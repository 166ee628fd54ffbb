"""The layout's rules, checked from the source: no import circle among specviz's modules, the decoding
core never imports what consumes it, and no module grows past MAX_LINES without saying why. The engine core
loads no backend and no machine state, nothing patches a model's methods at run time, one class has one name,
and no class grows past MAX_METHODS."""
import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

SPECVIZ = Path(__file__).resolve().parents[1] / "specviz"
CORE = {"tree", "sampling", "verify", "backend", "cache", "kv_model", "kv_dynamic", "kv_static", "kv_own", "kv_replay",
        "drafters", "engine", "trace", "metrics", "timing", "tree_builder", "strategies", "cpu"}
CONSUMERS = {"stack", "presets", "plots", "palette", "app", "bench", "train", "cli", "recording"}
MAX_LINES = 350
REASON = "Longer than"        # a docstring that says "Longer than 350 lines because …" lets a module grow
ENGINE_CORE = ("specviz.decode.engine", "specviz.decode.verify", "specviz.decode.tree", "specviz.decode.drafters")
BACKEND_PREFIXES = ("specviz.cpu", "specviz.profile.store")     # a backend's modules and the machine's measured state
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


def area(name: str) -> str:
    return name.split(".")[1] if "." in name else name


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_core_imports_no_consumer():
    bad = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                 if area(a) in CORE and area(b) in CONSUMERS)
    assert bad == []


def test_only_the_app_imports_the_app():
    """The app is the top layer: a helper it shares with another package lives below both. A package's
    `__main__` is a command's entry point, not a layer (`python -m specviz.recording` runs app/record.py)."""
    bad = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets
                 if area(b) == "app" and area(a) != "app" and not a.endswith(".__main__"))
    assert bad == []


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


def loaded_by(names: tuple[str, ...]) -> set[str]:
    """The specviz modules a fresh interpreter holds after importing `names` (an import in this process would
    see whatever earlier tests loaded)."""
    code = (f"import importlib, json, sys; [importlib.import_module(n) for n in {list(names)!r}]; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('specviz'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=SPECVIZ.parent).stdout
    return set(json.loads(out.splitlines()[-1]))


def backend_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in BACKEND_PREFIXES))


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


def test_the_engine_core_loads_no_backend():
    assert backend_modules(loaded_by(ENGINE_CORE)) == []


def test_no_model_method_is_patched_at_run_time():
    patched = {name: found for name, source in sources().items() if (found := method_patches(source))}
    assert patched == {}


def test_one_class_one_name():
    assert twice_named(classes(sources())) == {}


def test_no_class_has_more_than_15_methods():
    assert MAX_METHODS == 15
    assert too_many_methods(classes(sources())) == []


def test_the_core_checks_can_fail():
    assert "specviz.cpu.machine" in backend_modules(loaded_by(("specviz.decode.tree", "specviz.cpu.machine")))
    assert backend_modules({"specviz.profile.store", "specviz.cpu_tools",
                            "specviz.decode.tree"}) == ["specviz.profile.store"]
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
