"""Every ```python sample of docs/*.md runs (the samples of one page in order, in one namespace)."""

import os
import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"quickstart.md", "concepts.md", "adding-a-task.md", "coach.md", "training.md", "results.md",
            "benchmarking.md"} <= names  # fmt: skip


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_code_samples_run(page, tmp_path, monkeypatch):
    blocks = BLOCK.findall(page.read_text())
    if page.name == "results.md":
        assert not blocks  # tables only
        return
    assert blocks, f"{page.name} has no code sample"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{page.name}[{i}]", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{page.name}, sample {i + 1} failed: {type(e).__name__}: {e}") from e
    assert os.getcwd() == str(tmp_path)


def _definitions(code: str) -> dict[str, str]:
    """Module-level functions, classes and assignments of ``code``, each as normalised source (imports and calls
    left out: the tutorial imports from the package and registers under its own id)."""
    import ast

    out = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = ast.unparse(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.unparse(node)
    return out


def test_the_tutorial_shows_the_code_the_package_runs():
    """docs/adding-a-task.md builds mappa/SQLQuery-v0 step by step: every definition of
    mappa_envs/tasks/sql_query.py is in it, identical but for the tutorial's env id and name."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "adding-a-task.md").read_text()
    tutorial = _definitions("\n".join(BLOCK.findall(page)))
    module = _definitions((root / "mappa_envs" / "tasks" / "sql_query.py").read_text())
    renamed = {
        k: v.replace("'tutorial/SQLQuery-v0'", "'mappa/SQLQuery-v0'").replace("'tutorial_sqlquery_v0'", "'sqlquery_v0'")
        for k, v in tutorial.items()
    }
    missing = sorted(set(module) - set(renamed))
    differ = sorted(k for k in module if k in renamed and renamed[k] != module[k])
    assert not missing and not differ, f"the tutorial lacks {missing} and differs from the module in {differ}"
