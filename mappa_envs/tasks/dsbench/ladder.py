"""The DSBench-lite difficulty ladder: the same 18 tasks and the same scoring, with more of the pipeline given at the
lower levels, so that a small team can start above zero.

=====  ==============================  ====================================================  =========================
level  splits                          the workspace starts with                             the team writes
=====  ==============================  ====================================================  =========================
0      ``level0-train``, ``-eval``     level 1's files, and ``X_train.pkl``, ``y_train.pkl``  ``model.pkl`` and
                                       and ``X_test.pkl`` made from them                     ``submission.csv`` (the
                                                                                             data engineer checks the
                                                                                             given files)
1      ``level1-train``, ``-eval``     ``train.csv`` and ``test.csv`` cleaned: every         every hand-over file
                                       feature a number (dates split into parts,
                                       categories coded alike in both files), missing
                                       values filled with the training median
2      ``level2-train``, ``-eval``     the raw data: today's task (``train``, ``eval``)      every hand-over file
=====  ==============================  ====================================================  =========================

Each level has DSBench-lite's 14 training and 4 held-out tasks (``levelK-all``: the 18). A submission is scored
exactly as at the top level: the answers and the trivial baseline come from the original files, and the ids and
the target are never changed. The cleaned files are derived on the host from the verified build (under
``<lite build>/ladder-v1/``, made on first use and again when what they derive from changes). The cleaning is
transductive in the features only: category codes and date parts are chosen from the train and test features
together (never from a target or an answer), missing values are filled with the training median. The pickles of
level 0 are written inside the sandbox at the start of each episode (:data:`GIVEN_CODE`), by the sandbox's own
pandas, so that they load there whatever the host's version.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from . import prompts
from .lite import build_lite, load_lite
from .tasks import DSTask

TOP_LEVEL = 2
LEVELS = tuple(range(TOP_LEVEL + 1))
PARTS = ("train", "eval", "all")
SPLITS = (*PARTS, *(f"level{k}-{part}" for k in LEVELS for part in PARTS))
"""Every split name DSBench-lite takes: ``train``, ``eval``, ``all`` (the top level) and ``levelK-<part>``."""
GIVEN = ("X_train.pkl", "y_train.pkl", "X_test.pkl")
"""The files level 0 gives (the data engineer's part of the hand-over contract)."""
LADDER_VERSION = "ladder-v1"

GIVEN_CODE = """import pandas as pd
train = pd.read_csv("train.csv")
test = pd.read_csv("test.csv")
features = [c for c in test.columns if c != {id_column!r}]
train[features].to_pickle("X_train.pkl")
train[{target!r}].to_pickle("y_train.pkl")
test[features].to_pickle("X_test.pkl")
"""
"""Level 0's setup, run in the episode's sandbox before the first agent acts (formatted with the task's columns)."""

_CLEAN_NOTE = (
    "## Prepared data (DSBench-lite ladder, level {level})\n"
    "train.csv and test.csv are already clean: every feature column is a number (text categories are coded 0, 1, "
    "2, ... with the same codes in both files; a date column is replaced by its parts, such as `date_year` and "
    "`date_month`), and missing feature values are filled with the training median. The `id` and the target "
    "`{target}` are unchanged."
)
_GIVEN_NOTE = (
    "\nX_train.pkl (the features: every column of test.csv but `id`), y_train.pkl (the target `{target}`) and "
    "X_test.pkl (the test features, one row per row of test.csv, in its order) are given, written with pandas' "
    "to_pickle: the data engineer's part of the hand-over contract is done."
)


def parse_split(split: str) -> tuple[int, str]:
    """``"level0-eval"`` -> (0, "eval"); ``"eval"`` -> (:data:`TOP_LEVEL`, "eval"). Raises for another name."""
    if split in PARTS:
        return TOP_LEVEL, split
    level, _, part = split.partition("-")
    if split not in SPLITS:
        raise ValueError(f"DSBench-lite split must be one of {list(SPLITS)}, not {split!r}")
    return int(level.removeprefix("level")), part


def heldout_split(split: str) -> str | None:
    """The held-out split of a training split: ``train`` -> ``eval``, ``level1-train`` -> ``level1-eval``."""
    if split == "train":
        return "eval"
    if split.startswith("level") and split.endswith("-train"):
        return split.removesuffix("-train") + "-eval"
    return None


def artifacts(level: int) -> dict[str, tuple[str, ...]]:
    """The hand-over contract at ``level``: at level 0 the data engineer owes nothing (its files are given)."""
    contract = dict(prompts.ARTIFACTS)
    if level == 0:
        contract["data_engineer"] = ()
    return contract


def clean(train: pd.DataFrame, test: pd.DataFrame, id_column: str, targets: Sequence[str]):
    """Level 1's ``(train, test)``: the id, every feature as a number, missing values filled with the training
    median (0 for a column with none), the target columns of ``train`` unchanged (as read)."""
    features = [c for c in test.columns if c != id_column and c not in targets]
    both = pd.concat([train[features], test[features]], keys=["train", "test"])
    for c in list(both.columns):
        col = both[c]
        if pd.api.types.is_bool_dtype(col):
            both[c] = col.astype(float)
        elif not pd.api.types.is_numeric_dtype(col):
            parsed = pd.to_datetime(col, errors="coerce", format="ISO8601")
            if parsed.notna().mean() > 0.95:  # a date column: its parts are the features
                for part in ("year", "month", "day", "hour", "dayofweek"):
                    values = getattr(parsed.dt, part)
                    if values.nunique() > 1:
                        both[f"{c}_{part}"] = values.astype(float)
                both = both.drop(columns=[c])
            else:  # categorical: shared codes, sorted by value
                codes = col.astype("category").cat.codes.astype(float)
                both[c] = codes.where(codes >= 0)
    both = both.astype(float)
    median = both.loc["train"].median().fillna(0.0)
    both = both.fillna(median)
    x_train, x_test = both.loc["train"].reset_index(drop=True), both.loc["test"].reset_index(drop=True)
    out_train = pd.concat([train[[id_column]].reset_index(drop=True), x_train, train[list(targets)]], axis=1)
    out_test = pd.concat([test[[id_column]].reset_index(drop=True), x_test], axis=1)
    return out_train, out_test


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The sha256 of a file's bytes, read once per (path, size, modification time): every env made on a ladder
    level checks the stamps of its tasks' sources, and one run makes many envs."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _source_digest(task: DSTask) -> str:
    """What level 1's files of ``task`` are derived from: the ladder's version, pandas' and the source files' bytes."""
    h = hashlib.sha256(f"{LADDER_VERSION}\0pandas {pd.__version__}\0".encode())
    for path in (task.train_file, task.test_file):
        st = os.stat(path)
        h.update(_file_digest(str(path), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()


def _cleaned_files(task: DSTask, root: Path) -> tuple[Path, Path]:
    """Level 1's train.csv and test.csv of ``task`` under ``root``, derived on first use (atomically) and again
    whenever what they derive from changed (:func:`_source_digest`, kept beside them in ``source.sha256``)."""
    folder = root / task.id
    train_path, test_path = folder / "train.csv", folder / "test.csv"
    digest = _source_digest(task)
    stamp = folder / "source.sha256"
    if train_path.is_file() and test_path.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return train_path, test_path
    text = {task.id_column: str, **{t: str for t in task.target_columns}}
    train = pd.read_csv(task.train_file, dtype=text)
    test = pd.read_csv(task.test_file, dtype={task.id_column: str})
    out_train, out_test = clean(train, test, task.id_column, task.target_columns)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{task.id}-", dir=root))
    aside = None
    try:
        out_train.to_csv(tmp / "train.csv", index=False, lineterminator="\n")
        out_test.to_csv(tmp / "test.csv", index=False, lineterminator="\n")
        (tmp / "source.sha256").write_text(digest + "\n")
        if folder.exists():  # stale (other sources, another pandas) or unstamped: swapped out once the new is made
            aside = Path(tempfile.mkdtemp(prefix=f".{task.id}-stale-", dir=root))
            try:
                os.replace(folder, aside / "old")
            except OSError:  # another process swapped it meanwhile
                pass
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: its files stay if they are current
            if not (stamp.is_file() and stamp.read_text().strip() == digest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    return train_path, test_path


def level_task(task: DSTask, level: int, root: Path) -> DSTask:
    """``task`` at ``level``: its workspace files and description; the scoring files (answers, the original
    training file for the baseline) stay the task's own."""
    if level == TOP_LEVEL:
        return replace(task, extra={**task.extra, "level": level})
    train_path, test_path = _cleaned_files(task, root)
    target = ", ".join(task.target_columns)
    note = _CLEAN_NOTE.format(level=level, target=target) + (_GIVEN_NOTE.format(target=target) if level == 0 else "")
    return replace(
        task,
        prompt=f"{task.prompt.rstrip()}\n\n{note}",
        given={"train.csv": train_path, "test.csv": test_path},
        extra={**task.extra, "level": level},
    )


def load_level(split: str, root: str | Path | None = None, *, verify: bool = True) -> list[DSTask]:
    """The DSBench-lite tasks of ``split`` (any of :data:`SPLITS`), at its level."""
    level, part = parse_split(split)
    tasks = load_lite(part, root=root, verify=verify).tasks
    if split in PARTS:  # the top level as it always was
        return tasks
    ladder = build_lite(root, verify=verify) / LADDER_VERSION / "clean"
    return [level_task(t, level, ladder) for t in tasks]


def given_code(task: DSTask) -> str:
    """Level 0's setup code for ``task`` (:data:`GIVEN_CODE`)."""
    targets = task.target_columns
    return GIVEN_CODE.format(id_column=task.id_column, target=targets[0] if len(targets) == 1 else list(targets))


__all__ = [
    "GIVEN",
    "GIVEN_CODE",
    "LEVELS",
    "SPLITS",
    "TOP_LEVEL",
    "artifacts",
    "clean",
    "given_code",
    "heldout_split",
    "level_task",
    "load_level",
    "parse_split",
]
