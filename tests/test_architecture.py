"""The layout's rules, checked from the source: no import circle among specviz's modules, the decoding
core never imports what consumes it, and no module grows past MAX_LINES without saying why."""
import ast
from pathlib import Path

SPECVIZ = Path(__file__).resolve().parents[1] / "specviz"
CORE = {"tree", "sampling", "verify", "cache", "drafters", "engine", "trace", "metrics", "timing", "tree_builder",
        "strategies", "cpu"}
CONSUMERS = {"stack", "presets", "plots", "palette", "app", "bench", "train", "cli", "recording"}
MAX_LINES = 350
REASON = "Longer than"        # a docstring that says "Longer than 350 lines because …" lets a module grow


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
    assert imports("specviz.tree", SPECVIZ / "tree.py", {"specviz.tree", "specviz.trace"}) == set()
    assert "specviz.trace" in imports("specviz.engine", SPECVIZ / "engine.py", set(modules()))
