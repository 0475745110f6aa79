"""The ``arith2-*`` splits: word problems whose learning must be general (the ``mathchat-cpu`` track of
``mappa-bench-v2``, :mod:`baselines.evaluation.protocol`).

==========================  =====  ===================================================================
split                       tasks  contents
==========================  =====  ===================================================================
``arith2-train``            480    240 one-step and 240 two-step problems, wording A (names, items and
                                   sentence templates of set A)
``arith2-dev-1step``        48     one-step, wording A: for every choice (iterations, learning rate, coach,
                                   prompts)
``arith2-dev-2step``        48     two-step, wording A
``arith2-test-1step``       96     one-step, wording B (names, items and templates the training never
                                   shows): **sealed** (:mod:`mappa_envs.sealed`)
``arith2-test-2step``       96     two-step, wording B: **sealed**
==========================  =====  ===================================================================

- **Balanced.** One-step problems cycle through ``+ - x /`` (task ``i`` has operation ``i % 4``); two-step problems
  through the 12 ordered pairs of two different operations (task ``i``: pair ``i % 12``), so every operation is a
  quarter of each split, and so is every prefix whose length is a multiple of 4 (one-step) or 12 (two-step).
- **Disjoint by computation.** No two tasks of all five splits share a computation: ``(operation, unordered
  operands)`` for one step (a division's operands are its divisor and quotient), ``(first operation, unordered
  operands, second operation, third operand)`` for two steps. The splits are drawn in the order test, dev,
  train, each skipping the computations drawn before.
- **Worked examples that favour no operation.** ``metadata["example"]`` picks the worked example shown with the
  task (``prompt_style="small-balanced"``, :mod:`mappa_envs.tasks.mathchat.prompts`): the ``j``-th task of an
  operation (or operation pair) gets example ``j % 4``, so each operation is shown each of the four examples
  equally often. Examples use numbers outside the operand range.

Operands (and the second step's number) lie in :data:`OPERAND_RANGE`; a subtraction takes away less than there
is, a division is exact, every answer is a positive integer. Each task's metadata: ``op`` (``"add"`` or
``"add,mul"``: its category in reports), ``steps``, ``operands``, ``example``, ``wording``.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np

from ...core import Task

OPERAND_RANGE = (2, 20)
OPS = ("add", "sub", "mul", "div")
PAIRS = tuple((a, b) for a, b in itertools.product(OPS, OPS) if a != b)
"""The 12 ordered pairs of a two-step problem: ``(a op1 b) op2 c``."""
SEALED = ("arith2-test-1step", "arith2-test-2step")

NAMES = {
    "A": ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena"),
    "B": ("Omar", "Priya", "Quinn", "Rosa", "Sven", "Tomas", "Uma", "Viktor", "Wen", "Yara", "Zane", "Noor"),
}
ITEMS = {
    "A": ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "toys"),
    "B": ("coins", "beads", "buttons", "tickets", "seeds", "cups", "keys", "ribbons", "candles", "badges"),
}
ONE_STEP = {
    "A": {
        "add": (
            "{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            "There are {a} {item} in a box and {b} {item} on the table. How many {item} are there in all?",
        ),
        "sub": (
            "{name} has {a} {item} and gives {b} of them away. How many {item} does {name} have left?",
            "A jar holds {a} {item}. {name} takes out {b}. How many {item} are still in the jar?",
        ),
        "mul": (
            "{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?",
            "Each of {a} shelves holds {b} {item}. How many {item} are on the shelves?",
        ),
        "div": (
            "{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
            "{a} {item} are packed into {b} equal boxes. How many {item} are in each box?",
        ),
    },
    "B": {
        "add": (
            "{name} collected {a} {item} on Monday and {b} on Tuesday. What is the total number of {item} {name} "
            "collected?",
            "A club owns {a} {item}, and a friend donates {b}. What number of {item} does the club own after the gift?",
        ),
        "sub": (
            "{name} started the week with {a} {item} but lost {b}. What number of {item} remain?",
            "Out of {a} {item} in a crate, {b} were sold. What is the count of {item} not sold?",
        ),
        "mul": (
            "{name} filled {a} crates, each holding {b} {item}. What is the total number of {item} in the crates?",
            "There are {a} rows with {b} {item} in every row. What is the count of {item} altogether?",
        ),
        "div": (
            "{name} divides {a} {item} into {b} groups of equal size. What is the size of one group?",
            "When {a} {item} are dealt evenly to {b} players, what number of {item} does one player receive?",
        ),
    },
}
FIRST_STEP = {
    "A": {
        "add": "{name} has {a} {item} and gets {b} more.",
        "sub": "{name} has {a} {item} and gives {b} of them away.",
        "mul": "{name} has {a} bags with {b} {item} in each bag.",
        "div": "{a} {item} are split equally into {b} piles, and {name} takes one pile.",
    },
    "B": {
        "add": "{name} collected {a} {item} on Monday and {b} on Tuesday.",
        "sub": "{name} started the week with {a} {item} but lost {b}.",
        "mul": "{name} filled {a} crates, each holding {b} {item}.",
        "div": "{name} received one of {b} equal parts of {a} {item}.",
    },
}
SECOND_STEP = {
    "A": {
        "add": "Then {name} gets {c} more. How many {item} does {name} have now?",
        "sub": "Then {name} gives {c} away. How many {item} does {name} have left?",
        "mul": "Then {name} ends up with {c} times as many. How many {item} does {name} have now?",
        "div": "Then {name} puts them equally into {c} boxes. How many {item} are in each box?",
    },
    "B": {
        "add": "Afterwards {name} was handed {c} extra. What is the total number of {item} {name} holds?",
        "sub": "Afterwards {name} used up {c} of them. What number of {item} does {name} still hold?",
        "mul": "Afterwards the collection grew to {c} times its size. What is the total number of {item} {name} holds?",
        "div": "Afterwards {name} arranged them into {c} equal rows. What number of {item} are in one row?",
    },
}


def _apply(op: str, x: int, y: int) -> int:
    return {"add": x + y, "sub": x - y, "mul": x * y, "div": x // y}[op]


def _first(op: str, rng: np.random.Generator) -> tuple[int, int, tuple[int, int]]:
    """``(a, b, key operands)`` of one operation: ``a - b`` takes away less than ``a``; ``a / b`` is exact (``a``
    is ``b`` times a quotient in range: the key holds divisor and quotient)."""
    lo, hi = OPERAND_RANGE
    x, y = (int(v) for v in rng.integers(lo, hi + 1, size=2))
    if op == "sub":
        while x == y:
            y = int(rng.integers(lo, hi + 1))
        x, y = max(x, y), min(x, y)
    if op == "div":
        return x * y, x, (min(x, y), max(x, y))
    return x, y, (min(x, y), max(x, y))


def _second(op: str, value: int, rng: np.random.Generator) -> int | None:
    """The second step's number for ``value op c``, or None when no ``c`` in range fits (a subtraction needs
    ``c < value``, a division a divisor of ``value`` below it)."""
    lo, hi = OPERAND_RANGE
    if op == "sub":
        fits = [c for c in range(lo, min(hi, value - 1) + 1)]
    elif op == "div":
        fits = [c for c in range(lo, hi + 1) if value % c == 0 and c < value]
    else:
        fits = list(range(lo, hi + 1))
    return int(rng.choice(fits)) if fits else None


def _draw(steps: int, i: int, rng: np.random.Generator, seen: set) -> tuple[tuple[str, ...], list[int], tuple, int]:
    """Task ``i``'s operations, operands, computation key and answer: drawn until its key is new to ``seen``."""
    ops = (OPS[i % 4],) if steps == 1 else PAIRS[i % len(PAIRS)]
    for _ in range(10_000):
        a, b, key_ab = _first(ops[0], rng)
        operands, value = [a, b], _apply(ops[0], a, b)
        if steps == 2:
            c = _second(ops[1], value, rng)
            if c is None:
                continue
            operands, value = [a, b, c], _apply(ops[1], value, c)
        key = (ops, key_ab, *operands[2:])
        if key not in seen:
            seen.add(key)
            return ops, operands, key, value
    raise RuntimeError(f"no new {'-'.join(ops)} computation left in {OPERAND_RANGE}")


def problems(split: str, n: int, steps: int, wording: str, seed: int, seen: set) -> list[Task]:
    """``n`` balanced problems of ``steps`` operations in ``wording`` (``"A"`` or ``"B"``), deterministic in
    ``seed``, none of whose computations is in ``seen`` (each one drawn is added to it)."""
    rng = np.random.default_rng(seed)
    cycle = 4 if steps == 1 else len(PAIRS)
    tasks = []
    for i in range(n):
        ops, operands, _, answer = _draw(steps, i, rng, seen)
        name = NAMES[wording][int(rng.integers(len(NAMES[wording])))]
        item = ITEMS[wording][int(rng.integers(len(ITEMS[wording])))]
        fields = dict(name=name, item=item, a=operands[0], b=operands[1])
        if steps == 1:
            templates = ONE_STEP[wording][ops[0]]
            prompt = templates[int(rng.integers(len(templates)))].format(**fields)
        else:
            first = FIRST_STEP[wording][ops[0]].format(**fields)
            prompt = f"{first} {SECOND_STEP[wording][ops[1]].format(**fields, c=operands[2])}"
        meta = {"op": ",".join(ops), "steps": steps, "operands": operands, "example": (i // cycle) % 4}
        tasks.append(Task(f"{split}/{i}", prompt, str(answer), {**meta, "wording": wording}))
    return tasks


_LAYOUT = (  # (split, parts of (n, steps)), in drawing order: test, dev, train
    ("arith2-test-1step", ((96, 1),), "B", 21),
    ("arith2-test-2step", ((96, 2),), "B", 22),
    ("arith2-dev-1step", ((48, 1),), "A", 23),
    ("arith2-dev-2step", ((48, 2),), "A", 24),
    ("arith2-train", ((240, 1), (240, 2)), "A", 25),
)
SPLITS = tuple(name for name, *_ in _LAYOUT)


@cache
def _all_splits() -> dict[str, tuple[Task, ...]]:
    seen: set = set()
    out = {}
    for name, parts, wording, seed in _LAYOUT:
        tasks: list[Task] = []
        for j, (n, steps) in enumerate(parts):
            drawn = problems(name, n, steps, wording, seed * 10 + j, seen)
            tasks += [Task(f"{name}/{len(tasks) + k}", t.prompt, t.answer, t.metadata) for k, t in enumerate(drawn)]
        out[name] = tuple(tasks)
    return out


def load(split: str) -> tuple[Task, ...]:
    """The tasks of an ``arith2-*`` split."""
    return _all_splits()[split]


__all__ = ["OPERAND_RANGE", "OPS", "PAIRS", "SEALED", "SPLITS", "load", "problems"]
