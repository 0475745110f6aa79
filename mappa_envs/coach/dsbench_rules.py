"""A DSBench rule coach that credits partial progress: how far each code block got, which hand-over files exist and
look right, how close a submission came to valid.

The general :class:`~mappa_envs.coach.RuleBasedCoach` charges a fixed penalty per rule, so a weak team's data
engineer (an error and three missing files: 5 - 3 - 9) is clamped to 0 on every action and has nothing to learn
from. :class:`DSBenchCoach` builds each score from the progress the action made instead; its rules are in the class
docstring, and each evaluation's ``reasoning`` lists the points of every part. It reads only the coach input: the
task text (the row counts DSBench-lite states), the action's code and what it printed, the workspace files with
their authors and sizes (never their contents), the hand-over contract, and, unless ``use_outcome=False``, the
host's scoring of the submission at the final agent's last action.

>>> from mappa_envs.coach.dsbench_rules import failure
>>> f = failure("import pandas as pd\\ny = pd.read_csv('train.csv')['rentals']\\n",
...             'File "/tmp/code/cell_1.py", line 2, in <module>\\nKeyError: \\'rentals\\'')
>>> f.kind, f.line, f.lines
('KeyError', 2, 2)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from ..core.text import prose
from ..core.tools import get_tool
from .protocol import NEUTRAL_SCORE, CoachEvaluation, CoachInput, clamp
from .rule_based import RuleBasedCoach

_FRAME = re.compile(r'File "[^"]*cell[_\d]*\.py", line (\d+)')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b:? ?(.*)$", re.MULTILINE)
_SHAPE = re.compile(r"\((\d+),\s*(\d*)\)")
_ROWS = re.compile(r"train\.csv has (\d+) rows, test\.csv (\d+)")
_DECIMAL = re.compile(r"-?\d*\.\d+")
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
}
_SUBMISSION_GRADES = (  # (a phrase of scoring.py's reason, points out of 4, what it means)
    ("no submission.csv", 0.0, "no submission"),
    ("could not be parsed", 1.0, "a file that is not a CSV table"),
    ("is empty", 1.0, "an empty file"),
    ("not UTF-8", 1.0, "a file that is not text"),
    ("columns", 2.0, "a table with the wrong columns"),
    ("rows, expected", 3.0, "the right columns, the wrong number of rows"),
    ("ids", 3.0, "the right columns, ids that are not the test ids"),
    ("predictions", 3.5, "the right rows, predictions that cannot be scored"),
    ("probabilities", 3.5, "the right rows, predictions that cannot be scored"),
    ("RMSLE", 3.5, "the right rows, predictions that cannot be scored"),
    ("metric", 3.5, "the right rows, predictions that cannot be scored"),
)


@dataclass(frozen=True)
class Failure:
    """Where and why a code block stopped: the exception, the failing line of the block and the block's length."""

    kind: str
    message: str
    line: int | None
    lines: int
    """Lines of the block (0: its code is not known)."""
    statement: str

    @property
    def progress(self) -> float:
        """How far the block got, in [0, 1]: 0 for code that does not parse, else 0.2 (failed on its first line) to
        0.8 (on its last); 0.4 when the line is unknown."""
        if self.kind in ("SyntaxError", "IndentationError"):
            return 0.0
        if self.line is None or self.lines == 0:
            return 0.4
        return 0.2 + 0.6 * min(1.0, (self.line - 1) / max(1, self.lines - 1))

    def describe(self) -> str:
        where = f"line {self.line} of {self.lines or '?'}" if self.line else "an unknown line"
        said = f" `{self.statement}`" if self.statement else ""
        why = _WHY.get(self.kind.rpartition(".")[2], "an error")
        return f"{where}{said} raised {self.kind}: {self.message[:120]} ({why})"


def failure(code: str, stderr: str) -> Failure:
    """The failure of ``code`` from its ``stderr``: the last traceback frame in the block (``cell_N.py``) and the
    last exception line; unknown parts stay empty (an error without a traceback: a kill, a truncated stream)."""
    lines = code.splitlines()
    frames = _FRAME.findall(stderr)
    line = int(frames[-1]) if frames else None
    found = _EXCEPTION.findall(stderr)
    kind, message = found[-1] if found else ("error", stderr.strip().splitlines()[-1][:200] if stderr.strip() else "")
    statement = lines[line - 1].strip() if line is not None and 0 < line <= len(lines) else ""
    return Failure(kind, message.strip(), line, len(lines), statement)


def printed_shapes(text: str) -> list[tuple[int, int | None]]:
    """The shapes printed in ``text``: ``(258, 9)`` -> (258, 9), ``(258,)`` -> (258, None)."""
    return [(int(n), int(k) if k else None) for n, k in _SHAPE.findall(text)]


def row_counts(task: str) -> tuple[int, int] | None:
    """(train rows, test rows) as the task states them (DSBench-lite's "train.csv has N rows, test.csv M")."""
    m = _ROWS.search(task)
    return (int(m.group(1)), int(m.group(2))) if m else None


class _Card:
    """Points by part, each with the note that explains it."""

    def __init__(self) -> None:
        self.points: dict[str, float] = {}
        self.notes: list[str] = []

    def add(self, part: str, points: float, why: str) -> None:
        self.points[part] = self.points.get(part, 0.0) + points
        self.notes.append(f"{part} {points:+.2g}: {why}")

    @property
    def total(self) -> float:
        return sum(self.points.values())


@dataclass
class DSBenchCoach:
    """Each action's score is the sum of three parts (0 to 10), from the progress it made.

    - **Code (0-4)**: 1 + 3 x the mean progress of its blocks: a block that ran 1; one that failed 0.2 (first line)
      to 0.8 (last line), 0 when it does not parse (the failing statement and the exception are named); a timeout
      or out-of-memory 0.5; a block that failed on a hand-over file an earlier role owed and did not write 1 (it
      went as far as its inputs allowed; the blame is upstream). A block the sandbox lost is left out. No code: 0
      for an empty reply, 0.5 in a first turn; a later turn that concludes gets 3 when its files are delivered (or
      it owes none), 1 otherwise.
    - **Deliverable (0-5)**: 4 x the share of its contract files present (non-empty) and written by this agent,
      plus 1 for evidence they are well-formed, only when all are there: the data engineer printed shapes with
      test.csv's row count and a training row count (0.5 each, as the task states them; 0.5 unchecked when it
      does not), the modeler printed a validation score, the analyst printed a shape with test.csv's row count.
      At the final agent's last action with the host's scoring (``use_outcome``), the submission is graded
      instead: no file 0, not a table 1, wrong columns 2, wrong rows or ids 3, predictions that cannot be scored
      3.5, valid 4 + its quality (0-1). A role that owes nothing (the data engineer of ladder level 0) gets 2, +2
      when its code ran (it checked the given files). A role blocked by a missing upstream file gets 2 when it
      could not deliver.
    - **Report (0-1)**: a blocked role that names the missing file (or says one is missing) +1; a block that ran and
      printed something +1 otherwise.

    Inputs that are not DSBench's (no hand-over contract, a role without tools) are scored by the general rule
    coach; an input this coach cannot read is a recorded fallback (neutral 5, ``fallback_used``), not a crash.
    """

    use_outcome: bool = True
    """Read the host's scoring of the submission at the final action (``dsbench-rule``); False: judge the
    submission by its file and printout alone (``dsbench-rule-blind``)."""
    name: str = "dsbench-rule"

    def __post_init__(self) -> None:
        if not self.use_outcome and self.name == "dsbench-rule":
            self.name = "dsbench-rule-blind"
        # what it sees (mappa_envs.coach.information): the submission's scoring against the test answers at the final
        # action, or nothing of the answers or the outcome
        self.information = ("final-answer-key",) if self.use_outcome else ("none",)
        self._general = RuleBasedCoach()

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        if not inp.artifacts or not inp.tools:
            ev = self._general.evaluate(inp)
            return replace(
                ev, backend=self.name, reasoning=f"not a DSBench action (no contract or tools): {ev.reasoning}"
            )
        try:
            card = score_action(inp, self.use_outcome)
        except Exception as e:  # an input it cannot read: say so on the action, never crash the rollout
            return CoachEvaluation(
                score=NEUTRAL_SCORE,
                reasoning=f"could not score the action: {type(e).__name__}: {e}",
                backend=self.name,
                latency_s=time.perf_counter() - start,
                parse="fallback",
                fallback_used=True,
                fallback_reason=f"{type(e).__name__}: {str(e)[:200]}",
            )
        return CoachEvaluation(
            score=round(clamp(card.total), 2),
            reasoning="; ".join(card.notes),
            backend=self.name,
            latency_s=time.perf_counter() - start,
            parse="rule",
        )


def score_action(inp: CoachInput, use_outcome: bool = True) -> _Card:
    """The three parts of :class:`DSBenchCoach`'s score for one action."""
    contract = {role: tuple(files) for role, files in inp.artifacts}
    present = {f.path for f in inp.files if f.size > 0}
    blocked = [p for r in inp.earlier_roles for p in contract.get(r, ()) if p not in present]
    owed = contract.get(inp.role, ())
    mine = [p for p in owed if any(f.path == p and f.size > 0 and f.written_by == inp.agent for f in inp.files)]
    card = _Card()
    ran = _code_part(inp, owed, mine, blocked, card)
    graded = use_outcome and inp.outcome is not None and "valid" in inp.outcome
    if graded:
        _submission_part(inp, blocked, card)
    elif not owed:
        done = ran or (not inp.tool_status and inp.turn > 1)  # its code ran, or it concludes after an earlier turn
        card.add(
            "deliverable", 2 + (2 if done else 0), "owes no file" + (" and checked the given ones" if done else "")
        )
    elif blocked and len(mine) < len(owed):
        card.add("deliverable", 2, f"could not deliver: blocked by the missing upstream {', '.join(blocked)}")
    else:
        share = len(mine) / len(owed)
        missing = [p for p in owed if p not in mine]
        card.add("deliverable", 4 * share, f"wrote {len(mine)}/{len(owed)} of its files" + _listed(missing))
        if not missing:
            card.add("deliverable", *_well_formed(inp))
    said = prose(inp.output).lower()
    if blocked and (any(p.lower() in said for p in blocked) or "missing" in said):
        card.add("report", 1, f"names the missing upstream {', '.join(blocked)}")
    elif ran and any(s.strip() for s in inp.tool_stdout):
        card.add("report", 1, "its code printed what it did")
    return card


def _listed(missing: list[str]) -> str:
    return f" (missing {', '.join(missing)})" if missing else ""


def _code_part(inp: CoachInput, owed: tuple[str, ...], mine: list[str], blocked: list[str], card: _Card) -> bool:
    """The code part; returns whether every block that ran ran without error."""
    if not inp.output.strip():
        card.add("code", 0, "empty reply")
        return False
    if not inp.tool_status:
        if inp.turn <= 1:
            card.add("code", 0.5, "no code to run in its first turn")
        elif len(mine) == len(owed):
            card.add("code", 3, "concludes after delivering its files" if owed else "concludes")
        else:
            card.add("code", 1, "stops without delivering" + _listed([p for p in owed if p not in mine]))
        return False
    blocks = _calls(inp)
    progress, notes = [], []
    for i, status in enumerate(inp.tool_status):
        stderr = inp.tool_stderr[i] if i < len(inp.tool_stderr) else ""
        if status == "worker_lost":
            notes.append(f"block {i + 1} lost by the sandbox (left out)")
        elif status == "ok":
            progress.append(1.0)
        elif status in ("timeout", "oom"):
            progress.append(0.5)
            notes.append(f"block {i + 1} hit the {status} limit")
        else:
            f = failure(blocks[i] if i < len(blocks) else "", stderr)
            upstream = f.kind.endswith("FileNotFoundError") and any(p in f.message for p in blocked)
            progress.append(1.0 if upstream else f.progress)  # it went as far as its inputs allowed
            notes.append(f"block {i + 1}: {f.describe()}" + (", an upstream file: blocked" if upstream else ""))
    if not progress:
        card.add("code", 2, "; ".join(notes))
        return False
    mean = sum(progress) / len(progress)
    ok = sum(s == "ok" for s in inp.tool_status)
    card.add("code", 1 + 3 * mean, "; ".join([f"{ok}/{len(progress)} blocks ran", *notes]))
    return ok == len(progress)


def _calls(inp: CoachInput) -> list[str]:
    """The code of the action's tool calls, in order, as its tools read them from the reply ([] if unknown)."""
    try:
        return [c for name in inp.tools for c in get_tool(name).calls(inp.output)]
    except KeyError:  # a tool this process does not know: the failing lines stay unknown
        return []


def _well_formed(inp: CoachInput) -> tuple[float, str]:
    """Evidence, from what the action printed, that its files are right (points out of 1 and why)."""
    printed = "\n".join(inp.tool_stdout)
    shapes = printed_shapes(printed)
    counts = row_counts(inp.task)
    if inp.role not in ("data_engineer", "analyst"):  # the modeler: a validation score
        if _DECIMAL.search(printed):
            return 1.0, "printed a validation score"
        return 0.0, "printed no validation score"
    if counts is None:
        return 0.5, "the task states no row counts: shapes unchecked"
    n_train, n_test = counts
    rows = {n for n, _ in shapes}
    if inp.role == "analyst":
        if n_test in rows:
            return 1.0, f"printed a shape with test.csv's {n_test} rows"
        return 0.0, f"printed no shape with test.csv's {n_test} rows" + (f" (shapes {sorted(rows)})" if rows else "")
    points, why = 0.0, []
    if n_test in rows:
        points += 0.5
        why.append(f"X_test keeps test.csv's {n_test} rows")
    else:
        why.append(f"no printed shape has test.csv's {n_test} rows")
    if any(0 < n <= n_train and n != n_test for n in rows):
        points += 0.5
        why.append("a training shape printed")
    train_widths = {k for n, k in shapes if k and n != n_test}
    test_widths = {k for n, k in shapes if k and n == n_test}
    if train_widths and test_widths and not train_widths & test_widths:
        points /= 2
        why.append(f"train and test features differ in width ({sorted(train_widths)} vs {sorted(test_widths)})")
    return points, "; ".join(why)


def _submission_part(inp: CoachInput, blocked: list[str], card: _Card) -> None:
    """The final action's submission, graded by the host's scoring (how close an invalid one came)."""
    assert inp.outcome is not None
    if inp.outcome["valid"]:
        quality = float(inp.outcome.get("quality") or 0.0)
        card.add("deliverable", 4 + min(1.0, max(0.0, quality)), f"a valid submission, quality {quality:.3f}")
        return
    reason = str(inp.outcome.get("reason", ""))
    if blocked and "no submission.csv" in reason:
        card.add("deliverable", 2, f"no submission: blocked by the missing upstream {', '.join(blocked)}")
        return
    for phrase, points, meaning in _SUBMISSION_GRADES:
        if phrase in reason:
            card.add("deliverable", points, f"{meaning}: {reason[:160]}")
            return
    card.add("deliverable", 1, f"an invalid submission: {reason[:160]}")


__all__ = ["DSBenchCoach", "Failure", "failure", "printed_shapes", "row_counts", "score_action"]
