"""DSBench tasks and the loader of the original DSBench data layout.

A :class:`DSTask` is one modeling task: its description (what the agents read), its metric, the id and target
columns, and the host paths of its files. The agents' workspace receives ``train.csv``, ``test.csv`` and
``sample_submission.csv`` only; ``test_answer.csv`` (the test labels) stays on the host and is read by the scorer.

The original DSBench release keeps its files as::

    <data_dir>/data_resplit/<task>/train.csv, test.csv, sample_submission.csv
    <data_dir>/answers/<task>/test_answer.csv

(``data_dir`` may also be a folder above, such as the release's root: ``data_modeling/data`` and ``data`` are
looked for). The 72 task descriptions (64 train, 8 eval, as shipped by the reference implementation) come with
the package; each task's metric, id column and target columns are taken from its cleaned description, and the
task type is derived from the metric (the ``data_type`` labels of the reference files are sometimes wrong).
"""

from __future__ import annotations

import csv
import json
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ...core import Task
from .metrics import METRICS, metric_from_text

SPLITS = ("train", "eval", "all")
_METRIC_ALIASES = {
    "quadratic_weighted_kappa": "qwk",
    "normalized_gini": "gini",
    "map_at_3": "map@3",
    "auc": "roc_auc",
    "logloss": "log_loss",
}


@dataclass(frozen=True)
class DSTask:
    """One data-modeling task (host side: it knows where the answers are)."""

    id: str
    prompt: str
    metric: str
    id_column: str
    target_columns: tuple[str, ...]
    train_file: Path
    test_file: Path
    answer_file: Path
    sample_file: Path | None = None
    split: str = "train"
    suite: str = "dsbench"
    source: str = ""
    licence: str = ""
    url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    given: dict[str, Path] = field(default_factory=dict)
    """Workspace files in place of, or besides, the task's own (name -> host path): a ladder level's prepared data
    (:mod:`.ladder`). Scoring reads the task's own files only."""

    @property
    def task_type(self) -> str:
        """``classification`` or ``regression``, from the metric."""
        return "classification" if METRICS[self.metric].classification else "regression"

    def workspace_files(self) -> dict[str, Path]:
        """The files an episode starts with (name in the workspace -> host path). Never the answers."""
        files = {"train.csv": self.train_file, "test.csv": self.test_file}
        if self.sample_file is not None:
            files["sample_submission.csv"] = self.sample_file
        return {**files, **self.given}

    def to_task(self) -> Task:
        """The env-level :class:`Task` (what is recorded in trajectories: no paths, no answers)."""
        return Task(
            id=self.id,
            prompt=self.prompt,
            answer=None,
            metadata={
                "suite": self.suite,
                "split": self.split,
                "task_type": self.task_type,
                "metric": self.metric,
                "id_column": self.id_column,
                "target_columns": list(self.target_columns),
                "source": self.source,
                "licence": self.licence,
                "url": self.url,
                **({"level": self.extra["level"]} if "level" in self.extra else {}),
            },
        )


@dataclass
class TaskSet:
    """Tasks loaded from a source, with the ones that could not be used and why."""

    tasks: list[DSTask]
    skipped: dict[str, str] = field(default_factory=dict)


def _read_rows(name: str) -> list[dict[str, Any]]:
    text = resources.files(__package__).joinpath("data", name).read_text(encoding="utf-8")
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def dsbench_descriptions(split: str = "all") -> list[dict[str, Any]]:
    """The 72 shipped DSBench task descriptions (``split``: train 64, eval 8, all), each with its cleaned
    description (``cleaned``: metric, id_column, target_column, cleaned_prompt) merged in."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    cleaned = json.loads(
        resources.files(__package__).joinpath("data", "dsbench_modeling_cleaned_prompts.json").read_text("utf-8")
    )
    rows = []
    for s in ("train", "eval"):
        if split in (s, "all"):
            for row in _read_rows(f"dsbench_modeling_{s}.json"):
                tid = row["metadata"]["task_id"]
                rows.append({**row, "split": s, "cleaned": cleaned.get(tid, {})})
    return rows


def _canonical_metric(name: str | None) -> str | None:
    if name is None:
        return None
    name = str(name).strip().lower()
    return _METRIC_ALIASES.get(name, name)


def find_layout_root(data_dir: str | Path) -> Path:
    """The folder holding ``data_resplit/`` and ``answers/`` at or below ``data_dir``."""
    base = Path(data_dir).expanduser()
    for cand in (base, base / "data", base / "data_modeling" / "data", base / "data" / "data_modeling" / "data"):
        if (cand / "data_resplit").is_dir() and (cand / "answers").is_dir():
            return cand
    raise FileNotFoundError(
        f"no DSBench data layout under {base}: expected data_resplit/<task>/{{train,test}}.csv and "
        "answers/<task>/test_answer.csv (or data_modeling/data/... of the DSBench release)"
    )


def _answer_file(folder: Path) -> Path | None:
    if (folder / "test_answer.csv").is_file():
        return folder / "test_answer.csv"
    csvs = sorted(folder.glob("*.csv")) if folder.is_dir() else []
    return csvs[0] if len(csvs) == 1 else None


def _header(path: Path) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        line = f.readline()
    return [c.strip() for c in next(csv.reader([line]))] if line else []


def _task_of(root: Path, row: dict[str, Any], suite: str, prompt_style: str) -> tuple[DSTask | None, tuple[str, str]]:
    """One description's task, or None and (its id, why it is skipped)."""
    meta = row.get("metadata", {})
    tid = meta.get("task_id") or row.get("task_id")
    if not tid:
        raise ValueError(f"a task description has no task_id: {str(row)[:200]}")
    cleaned = row.get("cleaned", {})
    folder = root / "data_resplit" / tid
    train, test = folder / "train.csv", folder / "test.csv"
    answer = _answer_file(root / "answers" / tid)
    if not train.is_file() or not test.is_file():
        return None, (tid, f"missing {folder}/train.csv or test.csv")
    if answer is None:
        return None, (tid, f"missing {root / 'answers' / tid}/test_answer.csv")
    metric = _canonical_metric(meta.get("metric") or cleaned.get("metric")) or metric_from_text(row["prompt"])
    if metric not in METRICS:
        return None, (tid, f"metric {metric!r} is not scored here (scored: {sorted(METRICS)})")
    cols = _header(answer)
    if len(cols) < 2:
        return None, (tid, f"{answer} has fewer than two columns (an id and a target)")
    id_col, targets = cols[0], tuple(cols[1:])
    if id_col not in _header(test):
        return None, (tid, f"id column {id_col!r} of {answer.name} is not a column of test.csv")
    missing = [t for t in targets if t not in _header(train)]
    if missing and METRICS[metric].kind != "probability":
        return None, (tid, f"target columns {missing} are not columns of train.csv")
    prompt = cleaned.get("cleaned_prompt") if prompt_style == "cleaned" else None
    sample = folder / "sample_submission.csv"
    task = DSTask(
        id=tid,
        prompt=(prompt or row["prompt"]).strip(),
        metric=metric,
        id_column=id_col,
        target_columns=targets,
        train_file=train,
        test_file=test,
        answer_file=answer,
        sample_file=sample if sample.is_file() else None,
        split=row.get("split", meta.get("split", "train")),
        suite=suite,
        source=meta.get("source", ""),
        licence=meta.get("licence", ""),
        url=meta.get("url", ""),
    )
    return task, (tid, "")


def load_layout(
    data_dir: str | Path,
    descriptions: list[dict[str, Any]],
    *,
    suite: str = "dsbench",
    prompt_style: str = "cleaned",
) -> TaskSet:
    """Tasks of ``descriptions`` whose files exist under ``data_dir`` (see the module docstring).

    A task is skipped, with its reason in ``TaskSet.skipped``, when its files are missing, its metric is not one
    that is scored here, or its answer file's columns do not match. ``prompt_style``: ``cleaned`` (the short
    description) or ``original`` (the full Kaggle text).
    """
    if prompt_style not in ("cleaned", "original"):
        raise ValueError("prompt_style must be 'cleaned' or 'original'")
    root = find_layout_root(data_dir)
    out = TaskSet([])
    for row in descriptions:
        task, reason = _task_of(root, row, suite, prompt_style)
        if task is None:
            out.skipped[reason[0]] = reason[1]
        else:
            out.tasks.append(task)
    return out


def load_dsbench(data_dir: str | Path, split: str = "all", prompt_style: str = "cleaned") -> TaskSet:
    """The original DSBench tasks of ``split`` found under ``data_dir``; warns about the ones skipped."""
    ts = load_layout(data_dir, dsbench_descriptions(split), prompt_style=prompt_style)
    if not ts.tasks:
        raise FileNotFoundError(
            f"no usable DSBench task of split {split!r} under {data_dir}; skipped: "
            + "; ".join(f"{k}: {v}" for k, v in list(ts.skipped.items())[:5])
        )
    if ts.skipped:
        warnings.warn(
            f"{len(ts.skipped)} DSBench task(s) skipped (see TaskSet.skipped): "
            + "; ".join(f"{k}: {v}" for k, v in list(ts.skipped.items())[:3]),
            stacklevel=2,
        )
    return ts


__all__ = ["SPLITS", "DSTask", "TaskSet", "dsbench_descriptions", "find_layout_root", "load_dsbench", "load_layout"]
