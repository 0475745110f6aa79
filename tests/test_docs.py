"""Every ```python sample of README.md and docs/**/*.md (not docs/runs/) runs (the samples of one page in order, in
one namespace), a sample's shown output (a ```text block right after it) is what it prints, and every relative link
of README.md and docs/**/*.md leads to a file (and heading) that exists."""

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

import mappa_envs.tasks.sql_query  # noqa: F401  (registers its tool before any page snapshots the registry)
from mappa_envs.core import tools

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
SAMPLED = [ROOT / "README.md", *DOCS, *sorted((ROOT / "docs" / "envs").glob("*.md"))]
"""The pages whose ```python samples run: the README and the user docs (docs/runs/ holds run records)."""
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def samples(text: str) -> list[tuple[str, str | None]]:
    """Each ```python block of a page with its shown output: the ```text block that follows it with nothing between
    them but blank lines or one paragraph that says it ``prints``; None where it shows none."""
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        shown = None
        if i + 1 < len(fences) and fences[i + 1].group(1) == "text":
            between = text[m.end() : fences[i + 1].start()].strip()
            if not between or ("prints" in between and "\n\n" not in between):
                shown = fences[i + 1].group(2)
        out.append((m.group(2), shown))
    return out


def test_a_shown_output_is_the_text_block_right_after_a_sample():
    page = (
        "```python\nprint(1)\n```\n\nIt prints:\n\n```text\n1\n```\n"
        "```python\nx = 2\n```\nA tree.\n\nMore.\n```text\na/\n```\n```bash\nls\n```\n```python\ny = 3\n```\n"
    )
    assert samples(page) == [("print(1)\n", "1\n"), ("x = 2\n", None), ("y = 3\n", None)]


def test_docs_exist():
    names = {p.name for p in DOCS}
    pages = {
        "quickstart.md",
        "concepts.md",
        "adding-a-task.md",
        "coach.md",
        "training.md",
        "results.md",
        "benchmarking.md",
    }
    assert pages <= names


@pytest.mark.parametrize("page", SAMPLED, ids=[str(p.relative_to(ROOT)) for p in SAMPLED])
def test_code_samples_run(page, tmp_path, monkeypatch):
    blocks = samples(page.read_text())
    if page.name in ("results.md", "cli.md"):
        assert not blocks  # tables only; cli.md: the generated command reference (tests/test_cli_reference.py)
        return
    if page == ROOT / "docs" / "envs" / "README.md":
        return  # the table of the environments: each page has its samples
    assert blocks, f"{page.name} has no code sample"
    monkeypatch.chdir(tmp_path)
    # A page may register tools (the tutorial replaces the shipped 'sql' tool with its copy): the tool registry is
    # restored afterwards, so that what runs next imports the shipped modules as on a fresh interpreter.
    monkeypatch.setattr(tools, "_TOOLS", dict(tools._TOOLS))
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for i, (code, shown) in enumerate(blocks):
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"{page.name}[{i}]", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{page.name}, sample {i + 1} failed: {type(e).__name__}: {e}") from e
        if shown is not None:
            got = [line.rstrip() for line in printed.getvalue().rstrip("\n").splitlines()]
            assert got == [line.rstrip() for line in shown.rstrip("\n").splitlines()], (
                f"{page.name}, sample {i + 1} prints otherwise than shown:\n{printed.getvalue()}"
            )
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


LINKED_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCED = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.DOTALL)
"""A code span: a run of backticks up to the next run of the same length, within one paragraph."""
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^[ \t]*\[[^\]\n]+\]:[ \t]*<?(\S+?)>?(?:[ \t]+\"[^\"\n]*\")?[ \t]*$", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t#]*$", re.MULTILINE)


def _blank(match: re.Match) -> str:
    """The match with every character but its line breaks replaced by a space (line numbers and offsets kept)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def _prose(page: Path) -> str:
    """The page's text with fenced code blocks blanked (a link in a code sample is not a link)."""
    return FENCED.sub(_blank, page.read_text())


def _anchors(page: Path) -> set[str]:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for text in HEADING.findall(_prose(page)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {slug if i == 0 else f"{slug}-{i}" for slug, count in seen.items() for i in range(count + 1)}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``page`` (inline, image or reference definition, outside
    code) whose file or heading does not exist, or that leaves ``root``; web and mail links are not followed."""
    text = INLINE_CODE.sub(_blank, _prose(page))
    found = sorted((m.start(1), m.group(1)) for pattern in (LINK, REFERENCE) for m in pattern.finditer(text))
    broken = []
    for offset, target in found:
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:...
            continue
        path, _, anchor = target.partition("#")
        where = f"{page.relative_to(root)}:{text.count(chr(10), 0, offset) + 1}: {target}"
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(root):
            broken.append(f"{where} (outside the repository: a clone does not have it)")
        elif not file.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and file.suffix == ".md" and anchor.lower() not in _anchors(file):
            broken.append(f"{where} (no such heading in {file.relative_to(root)})")
    return broken


def test_relative_links_resolve():
    broken = [b for page in LINKED_PAGES for b in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page.write_text(
        "# Top\n"
        "[ok](there.md) [ok](there.md#a-heading-with-code) [ok](#top) [web](https://example.org/x)\n"
        "[gone](missing.md) ![gone](img/missing.png)\n"
        "[bad anchor](there.md#nowhere) `[in code](missing.md)` [a link\nover two lines](gone.md)\n"
        "```\n[in a fence](missing.md)\n```\n"
        "[ref]: missing-too.md\n"
        "a lone ```python in prose\n\n[after it](missing-three.md) [out](../elsewhere.md)\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:3: missing.md (no such file)",
        "page.md:3: img/missing.png (no such file)",
        "page.md:4: there.md#nowhere (no such heading in there.md)",
        "page.md:5: gone.md (no such file)",
        "page.md:9: missing-too.md (no such file)",
        "page.md:12: missing-three.md (no such file)",
        "page.md:12: ../elsewhere.md (outside the repository: a clone does not have it)",
    ]
