"""No module-level mutable state in the round, the backends, the models or the profile: a machine profile, a cache or a
registry reaches them as a value (a stack holds its profile, specviz/profile/store.py). A module-level container that a
function of its module changes (append, pop, item assignment), or a name a function declares `global`, is state; a
table only read is a constant."""
import ast
from pathlib import Path

SPECVIZ = Path(__file__).resolve().parents[1] / "specviz"
STATELESS = ("decode", "backends", "models", "profile")
CONTAINERS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
MADE = {"list", "dict", "set", "OrderedDict", "defaultdict", "Counter", "deque"}
CHANGES = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add", "discard"}


def _container(value: ast.expr | None) -> bool:
    if isinstance(value, CONTAINERS):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) in MADE
    return False


def module_state(source: str) -> list[str]:
    """The module-level names of `source` that its functions change."""
    tree = ast.parse(source)
    containers = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _container(node.value):
            containers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and _container(node.value) and isinstance(node.target, ast.Name):
            containers.add(node.target.id)
    changed = set()
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                changed |= set(node.names)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CHANGES
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in containers):
                changed.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                changed |= {t.value.id for t in targets if isinstance(t, ast.Subscript)
                            and isinstance(t.value, ast.Name) and t.value.id in containers}
    return sorted(changed)


def test_the_round_the_backends_the_models_and_the_profile_keep_no_state_of_their_own():
    found = {str(path.relative_to(SPECVIZ)): state
             for package in STATELESS for path in sorted((SPECVIZ / package).rglob("*.py"))
             if (state := module_state(path.read_text()))}
    assert found == {}


def test_the_state_check_can_fail():
    # the process's current profile, as a stack of them that a test pushed its own onto
    assert module_state("_PROFILES = [object()]\ndef isolated(p):\n    _PROFILES.append(p)\n") == ["_PROFILES"]
    assert module_state("SEEN: dict = {}\ndef note(k):\n    SEEN[k] = 1\n") == ["SEEN"]
    assert module_state("count = 0\ndef tick():\n    global count\n    count += 1\n") == ["count"]
    assert module_state("from collections import OrderedDict\nHELD = OrderedDict()\ndef drop():\n"
                        "    HELD.popitem()\n") == ["HELD"]
    assert module_state("NAMES = {1: 'a'}\ndef name(k):\n    return NAMES[k]\n") == []       # a table read only
    assert module_state("def f():\n    seen = []\n    seen.append(1)\n") == []                   # a function's own
