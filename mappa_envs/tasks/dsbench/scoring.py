"""Scoring a DSBench submission on the host, from ``submission.csv`` only.

Nothing an agent wrote is ever unpickled or executed here: the scorer reads the bytes of ``submission.csv``
through :meth:`sandboxes.Session.read_file` (which refuses symlinks, named pipes, sockets, devices, directories,
hard links and paths leaving the workspace, without blocking), with a size cap derived from the expected number
of rows, parses them as text, validates them (columns, row count, ids, value types) and only then computes the
metric against ``test_answer.csv``.

Every failure is a :class:`Score` with ``valid=False``, a reason a person (or a coach) can act on, and quality 0.
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from .metrics import METRICS, canonical, quality
from .tasks import DSTask

SUBMISSION = "submission.csv"
Stage = Literal[
    "missing",
    "unreadable",
    "empty",
    "encoding",
    "parse",
    "duplicate_columns",
    "columns",
    "rows",
    "ids",
    "values",
    "metric",
]
"""Where an invalid submission failed, in the order the scorer checks (a coach grades how close it came by it):
no file, a file that cannot be read (unsafe, too large), empty, not UTF-8, not a CSV table, duplicate column names,
wrong columns, wrong row count, ids that are not the test ids (or repeated), predictions of the wrong kind, a metric
that cannot be computed."""
_MISSING = {"", "nan", "none", "null", "na", "n/a"}


@dataclass
class Score:
    valid: bool
    reason: str
    """Why the submission is invalid ("" when valid)."""
    metric: str
    value: float | None = None
    baseline: float | None = None
    """The trivial baseline's value of the metric on the same test rows."""
    quality: float = 0.0
    rows: int | None = None
    stage: Stage | None = None
    """Where an invalid submission failed (:data:`Stage`); None when valid."""

    @property
    def success(self) -> bool:
        """A valid submission, scored by the task's metric (DSBench's task completion)."""
        return self.valid

    @property
    def beats_baseline(self) -> bool:
        return self.valid and self.quality > 0

    def outcome(self) -> dict[str, Any]:
        d = asdict(self)
        d["success"] = self.success
        d["beats_baseline"] = self.beats_baseline
        return d

    def summary(self) -> str:
        if not self.valid:
            return f"invalid submission: {self.reason}"
        return (
            f"valid submission: {METRICS[self.metric].title} {self.value:.4g} "
            f"(trivial baseline {self.baseline:.4g}), normalised quality {self.quality:.3f}"
        )


class _Answers:
    """The host-side truth of a task: test answers (by id) and the trivial baseline's predictions."""

    def __init__(self, task: DSTask):
        metric = METRICS[task.metric]
        ans = pd.read_csv(task.answer_file, dtype=str, keep_default_na=False)
        ans.columns = [c.strip() for c in ans.columns]
        self.ids = [canonical(v) for v in ans[task.id_column]]
        if len(set(self.ids)) != len(self.ids):
            raise ValueError(f"{task.answer_file}: duplicate ids in the answers")
        self.index = {v: i for i, v in enumerate(self.ids)}
        truth = ans[list(task.target_columns)]
        if metric.kind == "label":
            self.truth = np.array([[canonical(v) for v in truth[c]] for c in truth.columns], dtype=object).T
        else:
            self.truth = _numeric(truth).to_numpy(dtype=float)
            if np.isnan(self.truth).any():
                raise ValueError(f"{task.answer_file}: non-numeric or missing answers for a {metric.kind} metric")
        self.baseline_pred = self._baseline(task, metric.kind)
        self.baseline = metric.fn(self.truth, self.baseline_pred)

    def _baseline(self, task: DSTask, kind: str) -> np.ndarray:
        train = pd.read_csv(task.train_file, dtype=str, keep_default_na=False)
        train.columns = [c.strip() for c in train.columns]
        n = len(self.ids)
        cols = []
        for c in task.target_columns:
            if c not in train.columns:  # e.g. one probability column per class of a single label column
                cols.append(np.full(n, 1.0 / len(task.target_columns)))
                continue
            col = [canonical(v) for v in train[c] if str(v).strip().lower() not in _MISSING]
            if kind == "label":
                cols.append(np.full(n, pd.Series(col).value_counts().idxmax(), dtype=object))
            else:
                vals = _numeric(pd.DataFrame({c: col}))[c].dropna().to_numpy(dtype=float)
                cols.append(np.full(n, float(vals.mean()) if len(vals) else 0.0))
        return np.stack(cols, axis=1)


def _numeric(df: pd.DataFrame) -> pd.DataFrame:
    out = {}
    for c in df.columns:
        s = df[c].astype(str).str.strip().str.lower().replace({"true": "1", "false": "0"})
        out[c] = pd.to_numeric(s, errors="coerce")
    return pd.DataFrame(out)


_cache: dict[tuple[str, str], _Answers] = {}
_lock = threading.Lock()


def answers(task: DSTask) -> _Answers:
    key = (task.id, str(task.answer_file))
    with _lock:
        if key not in _cache:
            _cache[key] = _Answers(task)
        return _cache[key]


def max_submission_bytes(task: DSTask) -> int:
    """Size cap of ``submission.csv``: generous for the expected rows (100 bytes per cell + 1 MB)."""
    n = len(answers(task).ids)
    return 1_000_000 + 100 * n * (1 + len(task.target_columns))


def _predictions(task: DSTask, targets: pd.DataFrame) -> tuple[np.ndarray, str]:
    """The submission's predictions as the metric takes them (labels, or numbers checked for the metric's range),
    and what is wrong with them ("" when nothing)."""
    metric = METRICS[task.metric]
    if metric.kind == "label":
        pred = np.array([[canonical(v) for v in targets[c]] for c in targets.columns], dtype=object).T
        empty = int(sum(str(v).lower() in _MISSING for v in pred.ravel()))
        return pred, f"{empty} predictions are empty or NaN" if empty else ""
    num = _numeric(targets)
    bad = int(num.isna().to_numpy().sum())
    if bad:
        return np.array([]), f"{bad} predictions are not numbers (empty, NaN or text)"
    pred = num.to_numpy(dtype=float)
    if not np.isfinite(pred).all():
        return pred, f"{int((~np.isfinite(pred)).sum())} predictions are infinite"
    if metric.kind == "probability" and ((pred < 0) | (pred > 1)).any():
        return pred, f"{int(((pred < 0) | (pred > 1)).sum())} probabilities are outside [0, 1]"
    if task.metric == "rmsle" and (pred <= -1).any():
        return pred, "RMSLE needs predictions greater than -1 (log(1 + p))"
    return pred, ""


def score_bytes(task: DSTask, data: bytes) -> Score:
    """Validate and score the contents of a ``submission.csv``."""
    metric = METRICS[task.metric]
    ans = answers(task)

    def invalid(stage: Stage, reason: str, rows: int | None = None) -> Score:
        return Score(False, reason, task.metric, baseline=ans.baseline, rows=rows, stage=stage)

    if len(data) > max_submission_bytes(task):
        return invalid(
            "unreadable", f"{SUBMISSION} is {len(data)} bytes, over the {max_submission_bytes(task)}-byte limit"
        )
    if not data.strip():
        return invalid("empty", f"{SUBMISSION} is empty")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return invalid("encoding", f"{SUBMISSION} is not UTF-8 text ({e})")
    try:
        sub = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except Exception as e:  # pandas' parser errors: ragged rows, bad quoting...
        return invalid("parse", f"{SUBMISSION} could not be parsed as CSV: {type(e).__name__}: {str(e)[:200]}")
    sub.columns = [str(c).strip() for c in sub.columns]
    expected = [task.id_column, *task.target_columns]
    if len(set(sub.columns)) != len(sub.columns):
        return invalid("duplicate_columns", f"duplicate column names {list(sub.columns)[:10]}", len(sub))
    if set(sub.columns) != set(expected):
        missing = [c for c in expected if c not in sub.columns]
        extra = [c for c in sub.columns if c not in expected]
        return invalid(
            "columns",
            f"wrong columns: expected {expected}, got {list(sub.columns)[:10]}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unexpected {extra[:10]})" if extra else ""),
            len(sub),
        )
    if len(sub) != len(ans.ids):
        return invalid("rows", f"{len(sub)} rows, expected {len(ans.ids)} (one per row of test.csv)", len(sub))
    ids = [canonical(v) for v in sub[task.id_column]]
    if len(set(ids)) != len(ids):
        dup = pd.Series(ids)[pd.Series(ids).duplicated()].unique()[:5].tolist()
        return invalid("ids", f"duplicate ids in {task.id_column!r}: {dup}", len(sub))
    unknown = [i for i in ids if i not in ans.index]
    if unknown:
        return invalid(
            "ids", f"{len(unknown)} ids of {task.id_column!r} are not test ids, e.g. {unknown[:5]}", len(sub)
        )
    order = np.array([ans.index[i] for i in ids])
    sub = sub.iloc[np.argsort(order)].reset_index(drop=True)  # rows in the answers' order
    pred, problem = _predictions(task, sub[list(task.target_columns)])
    if problem:
        return invalid("values", problem, len(sub))
    try:
        value = float(metric.fn(ans.truth, pred))
    except Exception as e:
        return invalid("metric", f"the metric could not be computed: {type(e).__name__}: {str(e)[:200]}", len(sub))
    if not math.isfinite(value):
        return invalid("metric", f"the metric is not finite ({value})", len(sub))
    return Score(True, "", task.metric, value, ans.baseline, quality(metric, value, ans.baseline), len(sub))


def score_workspace(task: DSTask, session: Any) -> Score:
    """Score the ``submission.csv`` of a sandbox session's workspace (read safely, never executed).

    Anything but a regular file with a single link is refused without being opened for long, with a reason that
    says what it is: a symbolic link, a named pipe (FIFO: reading it would block the host forever), a socket, a
    device, a directory, a hard link (on a backend that does not isolate, maybe a host file's second name)."""
    ans = answers(task)

    def invalid(stage: Stage, reason: str) -> Score:
        return Score(False, reason, task.metric, baseline=ans.baseline, stage=stage)

    limit = max_submission_bytes(task)
    try:
        data = session.read_file(SUBMISSION, max_bytes=limit)
    except FileNotFoundError:
        return invalid("missing", f"no {SUBMISSION} in the workspace")
    except ValueError as e:  # UnsafeFileError (names the file type), over the size limit, a read that took too long
        return invalid("unreadable", str(e))
    except OSError as e:
        return invalid("unreadable", f"{SUBMISSION} could not be read: {e}")
    return score_bytes(task, data)


__all__ = ["SUBMISSION", "Score", "Stage", "answers", "max_submission_bytes", "score_bytes", "score_workspace"]
