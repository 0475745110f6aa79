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
``arith1-train``    512    one-operation word problems (``+ - x /`` on two integers from 2 to 20), seed 10:
                           sized for small models (SmolLM2-135M), a training pool, not a benchmark
``arith1-eval``     128    the same generator, seed 11, each problem's (operation, operands) absent from
                           ``arith1-train``: held out by computation, not only by wording
``arith1-dev``      64     the same generator, seed 12, disjoint by computation from both: for choosing
                           settings (learning rate, steps...) without looking at ``arith1-eval``
``arith2-*``               balanced one- and two-step problems with a sealed test split in wording the
                           training never shows (``mappa-bench-v2``): :mod:`.arith2`
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
from . import arith2

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
    "arith1-train",
    "arith1-eval",
    "arith1-dev",
    *arith2.SPLITS,
)
SEALED = arith2.SEALED
"""Splits evaluated only with ``unseal=True``, each evaluation logged (:mod:`mappa_envs.sealed`)."""


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
    if split in arith2.SPLITS:
        return arith2.load(split)
    if split == "arith1-train":
        return tuple(one_operation_problems(512, seed=10, prefix="arith1-train"))
    if split in ("arith1-eval", "arith1-dev"):
        seen = {_computation(t) for t in load_split("arith1-train")}
        if split == "arith1-dev":
            seen |= {_computation(t) for t in load_split("arith1-eval")}
        seed, size = (11, 128) if split == "arith1-eval" else (12, 64)
        fresh = []
        for t in one_operation_problems(600, seed=seed, prefix=split):
            if _computation(t) not in seen:
                seen.add(_computation(t))
                fresh.append(t)
        return tuple(fresh[:size])
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


ONE_OPERATION_RANGE = (2, 20)
"""Operands of :func:`one_operation_problems` (inclusive). Worked examples shown to the models (the ``small``
prompt style, :mod:`mappa_envs.tasks.mathchat.prompts`) use numbers outside it, so a copied example is wrong."""

_ONE_OP_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "toys")


def _computation(task: Task) -> tuple:
    m = task.metadata
    return (m["op"], m["a"], m["b"])


def one_operation_problems(n: int, seed: int, prefix: str = "arith1") -> list[Task]:
    """``n`` word problems of one operation on two integers in :data:`ONE_OPERATION_RANGE`: ``a + b``, ``a - b``
    (``a > b``), ``a x b``, and ``(a x b) / a`` (exact division), in varied wordings; deterministic in ``seed``.
    Each task's metadata holds ``op``, ``a``, ``b`` (for held-out splits disjoint by computation)."""
    lo, hi = ONE_OPERATION_RANGE
    rng = np.random.default_rng(seed)
    tasks = []
    for i in range(n):
        name = _NAMES[rng.integers(len(_NAMES))]
        item = _ONE_OP_ITEMS[rng.integers(len(_ONE_OP_ITEMS))]
        op = ("add", "sub", "mul", "div")[int(rng.integers(4))]
        a, b = (int(x) for x in rng.integers(lo, hi + 1, size=2))
        wording = int(rng.integers(2))
        if op == "add":
            prompt = (
                f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                f"There are {a} {item} in a box and {b} {item} on the table. How many {item} are there in all?",
            )[wording]
            answer = a + b
        elif op == "sub":
            a, b = max(a, b) + (a == b), min(a, b)  # more than is taken away
            prompt = (
                f"{name} has {a} {item} and gives {b} of them away. How many {item} does {name} have left?",
                f"A jar holds {a} {item}. {name} takes out {b}. How many {item} are still in the jar?",
            )[wording]
            answer = a - b
        elif op == "mul":
            prompt = (
                f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?",
                f"Each of {a} shelves holds {b} {item}. How many {item} are on the shelves?",
            )[wording]
            answer = a * b
        else:
            prompt = (
                f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?",
                f"{a * b} {item} are packed into {a} equal boxes. How many {item} are in each box?",
            )[wording]
            answer = b
        meta = {"op": op, "a": a, "b": b}
        tasks.append(Task(id=f"{prefix}/{i}", prompt=prompt, answer=str(answer), metadata=meta))
    return tasks
