"""The four packages are floors: sandboxes <- mappa_envs <- baselines <- benchmarks. No module refers to a floor
above its own, by an import (not even inside a function) or by name in a string that something imports later (a
registry spec ``"pkg.mod:Cls"``, a coach spec, ``python -m pkg.mod``), and no entry point of pyproject.toml has a
package load code from a floor above it; no modules import each other in a circle (a module's import-time use of its
own package's ``__init__`` included); and size tripwires (450 lines a module, 80 a function) catch a module or
function that has grown a second concern. Inside baselines/, its sub-packages are floors the same way
(:data:`BASELINES_FLOORS`: the algorithm, weights, the configuration, a run's files, the Ray learner's parts, planning,
evaluation, the trainers).

The checks are functions of the sources, so the tests at the end plant a violation and see each check fail."""

import ast
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("sandboxes", "mappa_envs", "baselines", "benchmarks")

Modules = dict[str, tuple[str, bool]]
"""Module name -> (its source, whether it is a package's ``__init__``)."""

SPEC = re.compile(rf"^(?:{'|'.join(FLOORS)})(?:\.\w+)*(?::[\w.]+)?$")
"""A string naming a module of the four packages: ``pkg.mod:attr`` (a registry, coach or entry-point spec), or a
dotted module name (``python -m pkg.mod``, ``importlib.import_module``; counted when that module exists). A bare
package name (a folder's) is not a reference."""


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> Modules:
    """Every module of the four packages under ``root``."""
    return {
        _module_name(p, root): (p.read_text(), p.name == "__init__.py")
        for floor in FLOORS
        for p in (root / floor).rglob("*.py")
    }


@dataclass(frozen=True)
class Ref:
    """One reference from a module to another: an import statement, or a string naming a module."""

    target: str
    """The module (or package) referred to, absolute."""
    line: int
    text: str
    """How the source says it (``import x``, ``from x import a, b``, or the string)."""
    lazy: bool = False
    """Inside a function: it runs when the function is called, not when the module is imported."""
    names: tuple[str, ...] = ()
    """``from target import names``."""


def _walk(node: ast.AST, lazy: bool = False):
    """Every node under ``node``, with whether it sits inside a function."""
    for child in ast.iter_child_nodes(node):
        yield child, lazy
        yield from _walk(child, lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))


def references(name: str, source: str, is_package: bool, known: set[str]) -> list[Ref]:
    """Every import of module ``name`` (at any depth, functions included) and every string in it naming a module of
    the four packages (``known``: the modules that exist)."""
    package = name if is_package else name.rpartition(".")[0]
    out = []
    for node, lazy in _walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Ref(a.name, node.lineno, f"import {a.name}", lazy) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = tuple(a.name for a in node.names)
            out.append(Ref(target, node.lineno, f"from {target} import {', '.join(names)}", lazy, names))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SPEC.match(node.value):
            target = node.value.partition(":")[0]
            if ":" in node.value or ("." in target and target in known):  # not a bare package name
                out.append(Ref(target, node.lineno, repr(node.value), lazy))
    return out


def upward_references(modules: Modules) -> list[str]:
    """Each reference, import or string, from a module to a floor above its own."""
    problems = []
    for name, (source, is_package) in sorted(modules.items()):
        floor = name.split(".")[0]
        above = FLOORS[FLOORS.index(floor) + 1 :]
        for ref in references(name, source, is_package, set(modules)):
            if ref.target.split(".")[0] in above:
                problems.append(f"{name}:{ref.line} {ref.text} (a floor above {floor})")
    return problems


BASELINES_FLOORS = ("algorithm", "weights", "", "runs", "ray_learner", "planning", "evaluation", "training")
"""The sub-floors of baselines/, bottom to top: its sub-packages, and ``""`` for the modules directly in baselines/
(:data:`BASELINES_ROOT`: the configuration). A module refers to none above its own sub-floor, as between the four
packages. The package's ``__init__`` re-exports public names from any of them: it is above them all."""

BASELINES_ROOT = {"baselines.config", "baselines.fields"}
"""The modules directly in baselines/; a new one is placed in a sub-package, or here on purpose."""


def baselines_floor(name: str) -> int | None:
    """The sub-floor of a baselines module (or package), None for a module of another package."""
    parts = name.split(".")
    if parts[0] != "baselines":
        return None
    if len(parts) == 1:
        return len(BASELINES_FLOORS)
    return BASELINES_FLOORS.index(parts[1] if parts[1] in BASELINES_FLOORS else "")


def sub_floor_problems(modules: Modules) -> list[str]:
    """Each reference from a baselines module to a sub-floor above its own, and each module directly in baselines/
    that is not one of :data:`BASELINES_ROOT`."""
    problems = []
    for name, (source, is_package) in sorted(modules.items()):
        floor = baselines_floor(name)
        if floor is None or floor == len(BASELINES_FLOORS):
            continue
        parts = name.split(".")
        if len(parts) == 2 and parts[1] not in BASELINES_FLOORS and name not in BASELINES_ROOT:
            problems.append(f"{name}: a module directly in baselines/, not in a sub-package ({BASELINES_FLOORS})")
        for ref in references(name, source, is_package, set(modules)):
            target = baselines_floor(ref.target)
            if target is not None and target > floor:
                problems.append(
                    f"{name}:{ref.line} {ref.text} (a sub-floor above {BASELINES_FLOORS[floor] or 'baselines/'})"
                )
    return problems


def import_graph(modules: Modules) -> dict[str, set[str]]:
    """Module -> the modules it imports. An import of the module's own package (or an ancestor) is an edge when it
    runs at import time and takes something of the package's ``__init__``; importing a submodule through its package
    (``from . import sibling``) is an edge to the submodule only, and a function's import of its own package runs
    after the package is loaded."""
    graph = {}
    for name, (source, is_package) in modules.items():
        edges = set()
        for ref in references(name, source, is_package, set(modules)):
            if not ref.text.startswith(("import ", "from ")):
                continue  # a string: loaded on demand, not at import
            submodules = {f"{ref.target}.{n}" for n in ref.names} & set(modules)
            edges |= submodules
            if ref.target not in modules:
                continue
            own_package = name.startswith(ref.target + ".")
            if own_package and (ref.lazy or (ref.names and len(submodules) == len(ref.names))):
                continue
            edges.add(ref.target)
        graph[name] = edges - {name}
    return graph


def import_circles(modules: Modules) -> list[str]:
    graph, circles, state = import_graph(modules), [], {}

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
    return circles


def entry_point_problems(pyproject: str, modules: Modules) -> list[str]:
    """Entry points of pyproject.toml naming a module of the four packages: the module exists, and the package that
    loads the group (the modules naming the group in a string) is not on a floor below it."""
    project = tomllib.loads(pyproject).get("project", {})
    scripts = {**project.get("scripts", {}), **project.get("gui-scripts", {})}
    groups = {"[project.scripts]": scripts, **project.get("entry-points", {})}
    loaders: dict[str, set[str]] = {}
    for name, (source, _) in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in groups:
                loaders.setdefault(node.value, set()).add(name)
    problems = []
    for group, entries in groups.items():
        for key, value in entries.items():
            target = value.split()[0].partition(":")[0]
            floor = target.split(".")[0]
            if floor not in FLOORS:
                continue  # another distribution's code
            if target not in modules:
                problems.append(f"{group} {key} = {value!r}: no module {target}")
            for loader in sorted(loaders.get(group, ())):
                if FLOORS.index(floor) > FLOORS.index(loader.split(".")[0]):
                    problems.append(f"{group} {key} = {value!r} is loaded by {loader}, a floor below {floor}")
    return problems


def test_no_module_refers_to_a_floor_above_its_own():
    problems = upward_references(project_modules())
    assert not problems, "references to a higher floor:\n" + "\n".join(problems)


def test_no_import_circles():
    circles = import_circles(project_modules())
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_entry_points_name_modules_that_exist_on_a_floor_their_loader_may_use():
    problems = entry_point_problems((ROOT / "pyproject.toml").read_text(), project_modules())
    assert not problems, "entry points:\n" + "\n".join(problems)


def test_no_baselines_module_refers_to_a_sub_floor_above_its_own():
    problems = sub_floor_problems(project_modules())
    assert not problems, "references to a higher sub-floor of baselines/:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------ the checks catch what they are for
def test_a_registry_spec_naming_a_higher_floor_is_refused():
    """``register("x", "benchmarks.cli:main")`` in mappa_envs imports benchmarks when the env is made: refused, as
    a coach spec in baselines naming benchmarks would be; the same spec from benchmarks itself is fine."""
    modules = project_modules()
    plant = 'from .registry import register\n\nregister("x", "benchmarks.cli:main")\n'
    assert upward_references({**modules, "mappa_envs.planted": (plant, False)}) == [
        "mappa_envs.planted:3 'benchmarks.cli:main' (a floor above mappa_envs)"
    ]
    coach = 'from .config import TrainConfig\n\nCFG = TrainConfig(coach="benchmarks.report:Coach")\n'
    assert upward_references({**modules, "baselines.planted": (coach, False)}) == [
        "baselines.planted:3 'benchmarks.report:Coach' (a floor above baselines)"
    ]
    assert not upward_references({**modules, "benchmarks.planted": (plant.replace(".registry", "mappa_envs"), False)})


def test_an_import_time_use_of_the_own_package_is_an_edge_of_the_circle_check(tmp_path):
    """A copy of the four packages with one line planted at the top level of mappa_envs/coach/wrapper.py: taking a
    name from its own package (whose ``__init__`` imports the wrapper) is a circle; importing a sibling through the
    package, or the package inside a function, is not."""
    for floor in FLOORS:
        for p in (ROOT / floor).rglob("*.py"):
            (tmp_path / p.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, tmp_path / p.relative_to(ROOT))
    wrapper = tmp_path / "mappa_envs" / "coach" / "wrapper.py"
    original = wrapper.read_text()
    assert not import_circles(project_modules(tmp_path))
    for line, edge in [
        ("from mappa_envs.coach import coach_from_spec", "mappa_envs.coach.wrapper -> mappa_envs.coach"),
        ("from . import RuleBasedCoach", "mappa_envs.coach.wrapper -> mappa_envs.coach"),
        ("import mappa_envs.coach", "mappa_envs.coach.wrapper -> mappa_envs.coach"),
        ("from . import protocol", None),
        ("def later():\n    from mappa_envs.coach import coach_from_spec", None),
    ]:
        wrapper.write_text(f"{original}\n{line}\n")
        circles = import_circles(project_modules(tmp_path))
        if edge is None:
            assert not circles, line
        else:  # the planted edge closes a circle
            assert any(f"{edge} " in f"{c} " for c in circles), (line, circles)


def test_an_entry_point_loaded_from_a_lower_floor_is_refused():
    modules = project_modules()
    pyproject = """
[project.scripts]
mappa = "benchmarks.cli:main"
gone = "benchmarks.nothing_here:main"

[project.entry-points."mappa_envs.envs"]
theirs = "their_package.env:Env"
ours = "benchmarks.cli:main"
"""
    assert entry_point_problems(pyproject, modules) == [
        "[project.scripts] gone = 'benchmarks.nothing_here:main': no module benchmarks.nothing_here",
        "mappa_envs.envs ours = 'benchmarks.cli:main' is loaded by mappa_envs.registry, a floor below benchmarks",
    ]


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


def test_a_reference_to_a_higher_sub_floor_of_baselines_is_refused():
    """The algorithm importing the loop, lazily even, or naming it in a string, is refused; a module dropped directly
    into baselines/ is named; the loop importing the algorithm is fine."""
    modules = project_modules()
    lazy = "def f():\n    from baselines.training.loop import TrainerBase\n"
    assert sub_floor_problems({**modules, "baselines.algorithm.planted": (lazy, False)}) == [
        "baselines.algorithm.planted:2 from baselines.training.loop import TrainerBase (a sub-floor above algorithm)"
    ]
    spec = 'SPEC = "baselines.training.loop:TrainerBase"\n'
    assert sub_floor_problems({**modules, "baselines.weights.planted": (spec, False)}) == [
        "baselines.weights.planted:1 'baselines.training.loop:TrainerBase' (a sub-floor above weights)"
    ]
    assert sub_floor_problems({**modules, "baselines.stray": ("X = 1\n", False)}) == [
        f"baselines.stray: a module directly in baselines/, not in a sub-package ({BASELINES_FLOORS})"
    ]
    down = "from baselines.algorithm.losses import ppo_clip_loss\n"
    assert not sub_floor_problems({**modules, "baselines.training.planted": (down, False)})
