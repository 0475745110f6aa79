"""MathChat task sets.

Bundled from the reference implementation's data (MIT; see ``data/LICENSE``):

==================  =====  ==========================================================================
split               tasks  contents
==================  =====  ==========================================================================
``aime-1983-2024``  933    the full AIME pool of the reference
``aime-train``      917    that pool minus the problems that also appear in ``aime-eval-32``
``aime-train-512``  512    512 of ``aime-train``, drawn with ``numpy.random.default_rng(42)`` (in pool order):
                           the size of the reference's training pool (512 of its 933 problems, seed 42)
``aime-eval-32``    32     evaluation set (AIME 2022-2024 problems)
``amc-train``       85     the reference's AMC pool minus ``amc-eval-32``
``amc-eval-32``     32     evaluation set (AMC)
``arith-train``     512    easy arithmetic word problems, generated with seed 0 (a training pool for small
                           models, not a benchmark)
``arith-eval``      64     the same generator, seed 1, disjoint from ``arith-train``
==================  =====  ==========================================================================

The reference's AIME pool contains 16 of the 32 AIME evaluation problems and its AMC pool all 32 AMC evaluation
problems; the ``*-train`` splits remove them so that training on them does not leak into evaluation.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ...core import Task

_FILES = {
    "aime-1983-2024": "AIME_1983_2024.json",
    "aime-eval-32": "aime_eval_32.json",
    "amc-eval-32": "amc_eval_32.json",
    "amc-pool": "amc.json",
}
SPLITS = (
    "aime-train",
    "aime-train-512",
    "aime-eval-32",
    "aime-1983-2024",
    "amc-train",
    "amc-eval-32",
    "arith-train",
    "arith-eval",
)


def _norm(prompt: str) -> str:
    """Letters and digits only, lower case: the same problem typeset differently (spaces, ``$``, ``\\``,
    punctuation) compares equal, so held-out problems are removed from the training pools."""
    return re.sub(r"[^a-z0-9]", "", prompt.lower())


def load_task_file(path: str | Path, prefix: str | None = None) -> list[Task]:
    """Load tasks from a JSON list (or JSON lines) of objects with ``prompt`` and ``answer`` (and ``id``).

    A broken file raises ``ValueError`` naming the file and the offending row.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: neither a JSON list nor JSON lines ({e})") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a list of task objects, got {type(rows).__name__}")
    return tasks_from_rows(rows, source=str(path), prefix=prefix or path.stem)


def tasks_from_rows(rows: list[Any], source: str, prefix: str) -> list[Task]:
    tasks = []
    for i, row in enumerate(rows):
        if isinstance(row, Task):
            tasks.append(row)
            continue
        if not isinstance(row, dict):
            raise ValueError(f"{source}: row {i} is a {type(row).__name__}, not an object")
        missing = [k for k in ("prompt", "answer") if k not in row or row[k] in (None, "")]
        if missing:
            raise ValueError(f"{source}: row {i} lacks {missing}")
        meta = {k: v for k, v in row.items() if k not in ("prompt", "answer", "id", "solution")}
        tasks.append(
            Task(
                id=f"{prefix}/{row.get('id', i)}",
                prompt=str(row["prompt"]),
                answer=row["answer"],
                metadata=meta,
            )
        )
    if not tasks:
        raise ValueError(f"{source}: no tasks")
    return _unique_ids(tasks)


def _unique_ids(tasks: list[Task]) -> list[Task]:
    """Task ids must be unique (``reset(options={"task_id": ...})``, per-problem statistics); the reference data
    reuses some (two problems of ``aime_eval_32`` have id 24, two id 28): later ones get ``#2``, ``#3``..."""
    seen: dict[str, int] = {}
    out = []
    for t in tasks:
        seen[t.id] = seen.get(t.id, 0) + 1
        out.append(t if seen[t.id] == 1 else Task(f"{t.id}#{seen[t.id]}", t.prompt, t.answer, t.metadata))
    return out


def _bundled(name: str) -> list[Task]:
    ref = resources.files(__package__).joinpath("data", _FILES[name])
    with resources.as_file(ref) as path:
        return load_task_file(path, prefix=name)


@cache
def load_split(split: str) -> tuple[Task, ...]:
    """The bundled tasks of ``split`` (see the module docstring)."""
    if split in ("aime-1983-2024", "aime-eval-32", "amc-eval-32"):
        return tuple(_bundled(split))
    if split == "aime-train":
        held_out = {_norm(t.prompt) for t in _bundled("aime-eval-32")}
        return tuple(
            Task(f"aime-train/{t.id.split('/', 1)[1]}", t.prompt, t.answer, t.metadata)
            for t in _bundled("aime-1983-2024")
            if _norm(t.prompt) not in held_out
        )
    if split == "aime-train-512":
        pool = load_split("aime-train")
        picked = np.sort(np.random.default_rng(42).choice(len(pool), size=512, replace=False))
        return tuple(
            Task(f"aime-train-512/{t.id.split('/', 1)[1]}", t.prompt, t.answer, t.metadata)
            for t in (pool[i] for i in picked)
        )
    if split == "amc-train":
        held_out = {_norm(t.prompt) for t in _bundled("amc-eval-32")}
        return tuple(
            Task(f"amc-train/{t.id.split('/', 1)[1]}", t.prompt, t.answer, t.metadata)
            for t in _bundled("amc-pool")
            if _norm(t.prompt) not in held_out
        )
    if split == "arith-train":
        return tuple(arithmetic_problems(512, seed=0, prefix="arith-train"))
    if split == "arith-eval":
        train = {t.prompt for t in load_split("arith-train")}
        return tuple(t for t in arithmetic_problems(80, seed=1, prefix="arith-eval") if t.prompt not in train)[:64]
    raise ValueError(f"unknown MathChat split {split!r}; choose one of {SPLITS}")


_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells")


def arithmetic_problems(n: int, seed: int, prefix: str = "arith") -> list[Task]:
    """``n`` easy word problems (two or three operations on small integers), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        name = _NAMES[rng.integers(len(_NAMES))]
        item = _ITEMS[rng.integers(len(_ITEMS))]
        kind = int(rng.integers(4))
        a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
        if kind == 0:
            c = 1 + c % (a * b - 1)  # never gives away more than there is
            prompt = (
                f"{name} has {a} boxes with {b} {item} in each box, and gives away {c} {item}. "
                f"How many {item} does {name} have left?"
            )
            answer = a * b - c
        elif kind == 1:
            prompt = (
                f"{name} buys {a} packs of {item} at {b} dollars each and pays with a {a * b + c} dollar note. "
                f"How much change does {name} get, in dollars?"
            )
            answer = c
        elif kind == 2:
            prompt = (
                f"{name} shares {a * b} {item} equally among {a} friends, then each friend gets {c} more. "
                f"How many {item} does each friend have now?"
            )
            answer = b + c
        else:
            prompt = (
                f"{name} had {a} {item}, found {b} more, and then doubled the collection. "
                f"How many {item} does {name} have?"
            )
            answer = 2 * (a + b)
        tasks.append(Task(id=f"{prefix}/{i}", prompt=prompt, answer=str(answer), metadata={"kind": kind}))
    return tasks
