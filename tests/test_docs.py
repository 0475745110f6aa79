"""Every ```python sample of docs/*.md runs (the samples of one page in order, in one namespace)."""

import os
import re
from pathlib import Path

import pytest

DOCS = sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"quickstart.md", "concepts.md", "adding-a-task.md", "coach.md", "training.md", "results.md"} <= names


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
