"""Where and why a DSBench code block stopped, and how far it got, for :mod:`mappa_envs.coach.dsbench_rules`.

How far a block got is counted in the statements that do work, not in lines: imports, ``pass``, bare constants
(docstrings) and assignments of a constant are left out, so padding a block with ``import os`` lines or blank ones
does not move a failure later; a statement spanning several lines counts once.

>>> f = failure("import pandas as pd\\ny = pd.read_csv('train.csv')['rentals']\\n",
...             'File "/tmp/code/cell_1.py", line 2, in <module>\\nKeyError: \\'rentals\\'')
>>> f.kind, f.line, f.lines, f.step, f.steps
('KeyError', 2, 2, 0, 1)
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FRAME = re.compile(r'File "(?:[^"]*/)?cell_\d+\.py", line (\d+)')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b:? ?(.*)$", re.MULTILINE)
_WHY = {
    "FileNotFoundError": "a file that is not in the workspace",
    "KeyError": "a column or key the data does not have",
    "ModuleNotFoundError": "a library that is not installed",
    "ImportError": "a library that is not installed",
    "NameError": "a name used before it was defined",
    "ValueError": "a value of the wrong kind (text left unencoded, missing values, shapes that do not match)",
    "TypeError": "a call with the wrong arguments",
    "AttributeError": "an attribute the object does not have",
    "SyntaxError": "code that does not parse",
    "IndentationError": "code that does not parse",
    "UnpicklingError": "a file that is not a pickle",
}
STALLED = 0.2
"""The progress of a block that ran out of time or memory: no more than a failure on its first statement."""


@dataclass(frozen=True)
class Failure:
    """Where and why a code block stopped: the exception, the failing line, and the failing statement's place among
    the block's working statements."""

    kind: str
    message: str
    line: int | None
    lines: int
    """Lines of the block (0: its code is not known)."""
    statement: str
    step: int | None = None
    """The failing statement's index among the working statements (None: not known)."""
    steps: int = 0
    """The block's working statements (0: not known)."""

    @property
    def progress(self) -> float:
        """How far the block got, in [0, 1]: 0 for code that does not parse, else 0.2 (failed on its first working
        statement) to 0.8 (on its last); 0.4 when the place is unknown."""
        if self.kind.rpartition(".")[2] in ("SyntaxError", "IndentationError", "TabError"):
            return 0.0
        if self.step is None or self.steps == 0:
            return 0.4
        return 0.2 + 0.6 * min(1.0, self.step / max(1, self.steps - 1))

    def describe(self) -> str:
        where = f"line {self.line} of {self.lines or '?'}" if self.line else "an unknown line"
        said = f" `{self.statement}`" if self.statement else ""
        why = _WHY.get(self.kind.rpartition(".")[2], "an error")
        return f"{where}{said} raised {self.kind}: {self.message[:120]} ({why})"


def _works(node: ast.stmt) -> bool:
    """A statement that does work (not an import, ``pass``, a bare constant or a constant assigned)."""
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
        return False
    constant = isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant)
    return not constant


def place(code: str, line: int | None) -> tuple[int | None, int]:
    """(index of the working statement holding ``line``, number of working statements) of ``code``'s top level;
    (None, 0) when it does not parse or the line is unknown. A failure on a non-working statement (an import) is
    placed at the next working statement."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return None, 0
    working = [s for s in body if _works(s)]
    if line is None or not working:
        return None, len(working)
    before = sum(1 for s in working if (s.end_lineno or s.lineno) < line)
    return min(before, len(working) - 1), len(working)


def failure(code: str, stderr: str) -> Failure:
    """The failure of ``code`` from its ``stderr``: the last traceback frame in the block (``.../cell_N.py``) and
    the last exception line; unknown parts stay empty (an error without a traceback: a kill, a truncated stream)."""
    lines = code.splitlines()
    frames = _FRAME.findall(stderr)
    line = int(frames[-1]) if frames else None
    found = _EXCEPTION.findall(stderr)
    kind, message = found[-1] if found else ("error", stderr.strip().splitlines()[-1][:200] if stderr.strip() else "")
    statement = lines[line - 1].strip() if line is not None and 0 < line <= len(lines) else ""
    step, steps = place(code, line)
    return Failure(kind, message.strip(), line, len(lines), statement, step, steps)


__all__ = ["STALLED", "Failure", "failure", "place"]
