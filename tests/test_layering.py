"""The four packages are floors: sandboxes <- mappa_envs <- baselines <- benchmarks. No module imports from a floor
above its own (not even inside a function), no modules import each other in a circle, and size tripwires (450 lines a
module, 80 a function) catch a module or function that has grown a second concern."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("sandboxes", "mappa_envs", "baselines", "benchmarks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute, at any depth of the file (functions included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            out |= {f"{target}.{a.name}" for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for floor in FLOORS for p in (ROOT / floor).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_module_imports_from_a_floor_above_its_own():
    offending = []
    for name, path in ((n, p) for f in FLOORS for p in (ROOT / f).rglob("*.py") for n in [_module_name(p)]):
        own = FLOORS.index(name.split(".")[0])
        above = {t.split(".")[0] for t in _imports(path)} & set(FLOORS[own + 1 :])
        offending += [f"{name} imports from {top}" for top in sorted(above)]
    assert not offending, "imports from a higher floor:\n" + "\n".join(sorted(offending))


def test_no_import_circles():
    graph = _graph()
    # a package's __init__ re-exporting its submodules is not a circle with them: leave out edges into a package
    # from its own submodules' point of view (sub -> its package __init__)
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for t in sorted(graph[node]):
            if state.get(t) == "open":
                circles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


# Tripwires, not goals (issue 32): code squeezed to fit them (packed lines, `# fmt: skip`) is worse than code a
# little longer. Over one, split where it reads better; never pack.
MAX_MODULE_LINES = 450


def test_modules_stay_readable_in_one_sitting():
    """No module of the four packages is over 450 lines (issue 17): tables of data go to data files, a second
    concern to a module of its own."""
    long = {
        str(p.relative_to(ROOT)): n
        for floor in FLOORS
        for p in (ROOT / floor).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


MAX_FUNCTION_LINES = 80


def test_functions_fit_on_a_screen():
    """No function or method of the four packages is over 80 lines, docstring and signature included (issue 17): a
    longer one is split into its steps."""
    long = {}
    for floor in FLOORS:
        for p in (ROOT / floor).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
