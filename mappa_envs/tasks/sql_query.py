"""SQLQuery-v0: a query writer explores a shop's SQLite database with SQL, an answerer states the answer.

The example task of the extension API: written only through it (roles, an SQL tool, generated data, grading, coach
guidance) and registered with one ``register(...)`` line in ``mappa_envs/__init__.py``. The database and the
questions are generated deterministically (``seed``); answers are computed on the host with SQLite. The database
file is written into the episode's workspace and queried *inside the sandbox* (read-only).

Agents: ``query_writer_0`` (up to 3 turns, tool ``sql``: ```sql blocks), ``answerer_0`` (1 turn, answers as
``\\boxed{}``). Reward: 1.0 to every agent when the answer equals the ground truth, else 0.0.

Splits: ``train`` (default; 22 questions, ids ``sql-<seed>/<i>``) and ``eval``, the held-out questions (22, ids
``sql-<seed>-eval/<i>``): a twin of each training question with parameters no training question uses (other
days, other product ids), on the same database. Evaluation uses ``eval`` (:meth:`SQLQueryEnv.heldout_kwargs`):
``mappa eval --suites sql`` (or ``sql:eval``, ``sql:train``; :mod:`mappa_envs.suites`).
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from ..core import EpisodeRecord, PipelineEnv, Role, Task
from ..core.tools import Tool, register_tool
from ..grading import extract_answer, math_equal
from ..heldout import pick_split

DB = "shop.db"
SPLITS = ("train", "eval")
CITIES = ("Lyon", "Porto", "Graz", "Turku", "Gent")
CATEGORIES = {"books": (8, 40), "games": (15, 70), "tools": (5, 120), "tea": (3, 25)}
SCHEMA = (
    "customers(id INTEGER PRIMARY KEY, name TEXT, city TEXT); "
    "products(id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL); "
    "orders(id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, quantity INTEGER, day INTEGER)"
)

_RUNNER = """import csv, sqlite3, sys
con = sqlite3.connect("file:{db}?mode=ro", uri=True)
cur = con.execute({query!r})
rows = cur.fetchmany(21)
w = csv.writer(sys.stdout)
w.writerow([d[0] for d in cur.description or []])
w.writerows(rows[:20])
if len(rows) > 20:
    print("... (only the first 20 rows are shown)")
"""


class SQLTool(Tool):
    """Runs each ```sql block against the workspace's database, read-only, inside the sandbox."""

    name = "sql"
    description = "write one SQL query in a ```sql block; it runs on shop.db and you see up to 20 rows as CSV"
    languages = ("sql",)  # each closed ```sql block is one call (Tool.calls)

    def run(self, session, call: str):
        return session.run(_RUNNER.format(db=DB, query=call))


register_tool(SQLTool())


@cache
def build_database(seed: int = 0) -> bytes:
    """The shop database (deterministic in ``seed``) as SQLite file bytes."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / DB
        con = sqlite3.connect(path)
        con.executescript(";".join(f"CREATE TABLE {t}" for t in SCHEMA.split("; ")))
        con.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)", [(i, f"customer{i}", rng.choice(CITIES)) for i in range(1, 41)]
        )
        products, pid = [], 1
        for cat, (lo, hi) in CATEGORIES.items():
            for k in range(6):
                products.append((pid, f"{cat}-{k + 1}", cat, round(rng.uniform(lo, hi), 2)))
                pid += 1
        con.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products)
        orders = [
            (i, rng.randint(1, 40), rng.randint(1, len(products)), rng.randint(1, 5), rng.randint(1, 28))
            for i in range(1, 301)
        ]
        con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", orders)
        con.commit()
        con.close()
        return path.read_bytes()


def _questions(seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed + 1)
    join_c = "FROM orders o JOIN customers c ON c.id = o.customer_id"
    join_p = "FROM orders o JOIN products p ON p.id = o.product_id"
    qs = [
        (
            f"How many orders were placed by customers who live in {city}?",
            f"SELECT COUNT(*) {join_c} WHERE c.city = '{city}'",
        )
        for city in CITIES
    ]
    for cat in CATEGORIES:
        qs.append(
            (
                f"What is the total revenue (price times quantity, summed over orders) of the {cat} category, "
                "rounded to 2 decimals?",
                f"SELECT ROUND(SUM(p.price * o.quantity), 2) {join_p} WHERE p.category = '{cat}'",
            )
        )
        qs.append(
            (
                f"How many units of {cat} products were sold on days 1 to 14?",
                f"SELECT SUM(o.quantity) {join_p} WHERE p.category = '{cat}' AND o.day <= 14",
            )
        )
    for k in rng.sample(range(1, 25), 8):
        qs.append(
            (
                f"How many distinct customers bought the product with id {k}?",
                f"SELECT COUNT(DISTINCT customer_id) FROM orders WHERE product_id = {k}",
            )
        )
    qs.append(
        (
            "On which day (1-28) were the most units sold? If several, give the smallest day.",
            "SELECT day FROM orders GROUP BY day ORDER BY SUM(quantity) DESC, day LIMIT 1",
        )
    )
    return qs


def _heldout_questions(seed: int) -> list[tuple[str, str]]:
    trained = random.Random(seed + 1).sample(range(1, 25), 8)  # the product ids of the training questions
    join_c = "FROM orders o JOIN customers c ON c.id = o.customer_id"
    join_p = "FROM orders o JOIN products p ON p.id = o.product_id"
    qs = [
        (
            f"How many orders were placed on days 15 to 28 by customers who live in {city}?",
            f"SELECT COUNT(*) {join_c} WHERE c.city = '{city}' AND o.day > 14",
        )
        for city in CITIES
    ]
    for cat in CATEGORIES:
        qs.append(
            (
                f"What is the revenue (price times quantity, summed over orders) of the {cat} category on days "
                "1 to 14, rounded to 2 decimals?",
                f"SELECT ROUND(SUM(p.price * o.quantity), 2) {join_p} WHERE p.category = '{cat}' AND o.day <= 14",
            )
        )
        qs.append(
            (
                f"How many units of {cat} products were sold on days 15 to 28?",
                f"SELECT SUM(o.quantity) {join_p} WHERE p.category = '{cat}' AND o.day > 14",
            )
        )
    for k in random.Random(seed + 2).sample(sorted(set(range(1, 25)) - set(trained)), 8):
        qs.append(
            (
                f"How many distinct customers bought the product with id {k}?",
                f"SELECT COUNT(DISTINCT customer_id) FROM orders WHERE product_id = {k}",
            )
        )
    qs.append(
        (
            "On which day (1-28) were the most orders placed? If several, give the smallest day.",
            "SELECT day FROM orders GROUP BY day ORDER BY COUNT(*) DESC, day LIMIT 1",
        )
    )
    return qs


def sql_tasks(seed: int = 0, split: str = "train") -> list[Task]:
    """The questions of ``split`` with their answers, computed on the host from the same database."""
    if split not in SPLITS:
        raise ValueError(f"SQLQuery split must be one of {SPLITS}, not {split!r}")
    qs = _questions(seed) if split == "train" else _heldout_questions(seed)
    prefix = f"sql-{seed}" if split == "train" else f"sql-{seed}-eval"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / DB).write_bytes(build_database(seed))
        con = sqlite3.connect(Path(tmp) / DB)
        tasks = [
            Task(f"{prefix}/{i}", q, con.execute(sql).fetchone()[0], {"task_type": "sql", "reference_sql": sql})
            for i, (q, sql) in enumerate(qs)
        ]
        con.close()
    return tasks


TEAM = (
    "You are part of a two-agent team answering questions about a shop's SQLite database (file shop.db), "
    f"with the tables {SCHEMA}. The query writer runs SQL; the answerer gives the final answer."
)


class SQLQueryEnv(PipelineEnv):
    metadata = {**PipelineEnv.metadata, "name": "sqlquery_v0"}
    env_id = "mappa/SQLQuery-v0"
    task_type = "sql"
    eval_names = ("sql",)  # mappa eval --suites sql, sql:<split> (mappa_envs.suites)

    def __init__(self, seed: int = 0, query_turns: int = 3, split: str = "train", **kwargs: Any):
        roles = (
            Role(
                "query_writer",
                f"{TEAM} You are the query writer: {SQLTool.description}. Query until you have the answer, then "
                "state it in one sentence without a query.",
                "Find the answer with SQL.",
                max_turns=query_turns,
                tools=("sql",),
                continue_instruction="That is your query's result. Query again, or state the answer without SQL.",
                coach_guidance="A good query writer runs correct, focused SQL on the right tables and reports the "
                "number the question asks for; failing or irrelevant queries are poor.",
            ),
            Role(
                "answerer",
                f"{TEAM} You are the answerer: check the query writer's result and give the final answer as "
                "\\boxed{answer}.",
                "Give the final answer as \\boxed{answer}.",
                coach_guidance="A good answerer gives the number the queries established, in \\boxed{}.",
            ),
        )
        self.db, self.split = build_database(seed), split
        super().__init__(roles, sql_tasks(seed, split), **kwargs)

    @classmethod
    def heldout_kwargs(cls, train_kwargs: dict[str, Any], split: str | None = None) -> dict[str, Any] | None:
        train = train_kwargs.get("split", "train")
        chosen = pick_split(cls.env_id, split, train=train, splits=SPLITS, default="eval" if train == "train" else None)
        return None if chosen is None else {**train_kwargs, "split": chosen}

    def on_episode_start(self, task: Task) -> None:
        self.session.write_file(DB, self.db)
        self.record.metadata["workspace_files"] = {DB: len(self.db)}

    def grade(self, task: Task, record: EpisodeRecord) -> tuple[float, dict[str, Any]]:
        outputs = [a.output for a in record.actions if a.agent == "answerer_0"]
        predicted = extract_answer(outputs[-1]) if outputs else None
        correct = predicted is not None and math_equal(predicted, task.answer)
        outcome = {"predicted": predicted, "answer": task.answer, "correct": correct, "success": correct}
        return float(correct), outcome
