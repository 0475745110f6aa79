"""The benchmark protocol: what makes two groups' numbers comparable (``docs/benchmarking.md``).

A protocol version fixes, per track, the training pool, the held-out suites, the samples per problem, the sampling
settings, the seeds, and the budget a method may spend; changing any of it makes a new version. ``mappa eval
--protocol V --track T --run RUN`` evaluates under it and writes a result file with provenance
(:func:`result_record`, validated by :func:`validate_result` on load); ``mappa report compare`` ranks result files of
one version and track (:func:`leaderboard`), with paired tests where they share problems.

>>> sorted(PROTOCOLS["mappa-bench-v1"].tracks)
['dsbench-lite', 'dsbench-original', 'mathchat-cpu', 'mathchat-paper']
>>> PROTOCOLS["mappa-bench-v2"].tracks["mathchat-cpu"].suites
('mathchat:arith2-test-1step', 'mathchat:arith2-test-2step')
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mappa_envs.metrics import paired_test, wilson_interval
from mappa_envs.sealed import code_version

# torch are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run) loads
# none of them.


@dataclass(frozen=True)
class Budget:
    """What a method may spend on training (``None``: not limited by the protocol)."""

    episodes: int | None = None
    """Training rollout episodes (every sample of every prompt counts)."""
    generated_tokens: int | None = None
    coach_calls: int | None = None
    """For methods that use a coach: evaluations asked (cache hits and rule coaches included)."""


@dataclass(frozen=True)
class Track:
    """One benchmark track: the task, what trains, what is held out and how it is evaluated."""

    env_id: str
    train: dict[str, Any]
    """The training pool (env arguments)."""
    suites: tuple[str, ...]
    """The held-out suites (``mappa eval`` names), evaluated in full (no ``--limit``)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments every suite's env gets (e.g. MathChat's small-model prompts)."""
    k: int = 1
    temperature: float = 0.0
    max_new_tokens: int = 128
    max_prompt_tokens: int = 1024
    seeds: tuple[int, ...] = (0, 1, 2)
    """The training seeds a result reports (one result file per seed; the leaderboard pools them)."""
    budget: Budget = Budget()
    note: str = ""


@dataclass(frozen=True)
class Protocol:
    version: str
    tracks: dict[str, Track]


PROTOCOLS: dict[str, Protocol] = {
    "mappa-bench-v1": Protocol(
        "mappa-bench-v1",
        {
            "mathchat-cpu": Track(
                "mappa/MathChat-v0",
                {"split": "arith1-train", "prompt_style": "small"},
                ("mathchat:arith1-eval",),
                env_kwargs={"prompt_style": "small"},
                budget=Budget(episodes=128, coach_calls=1024),
                note="the demo's pool and held-out set: 128 one-operation problems, greedy, SmolLM2-135M per role",
            ),
            "mathchat-paper": Track(
                "mappa/MathChat-v0",
                {"split": "aime-train"},
                ("aime", "amc"),
                k=4,
                temperature=0.6,
                max_new_tokens=4096,
                max_prompt_tokens=8192,
                note="AIME-32 and AMC-32, 4 samples per problem: the paper's evaluation (GPU scale)",
            ),
            "dsbench-lite": Track(
                "mappa/DSBench-v0",
                {"suite": "lite", "split": "train"},
                ("dsbench:eval",),
                k=2,
                temperature=0.6,
                max_new_tokens=512,
                max_prompt_tokens=3072,
                budget=Budget(episodes=256),
            ),
            "dsbench-original": Track(
                "mappa/DSBench-v0",
                {"suite": "dsbench", "split": "train"},
                ("dsbench",),
                k=1,
                temperature=0.6,
                max_new_tokens=4096,
                max_prompt_tokens=16384,
                note="the original DSBench modeling tasks (--dsbench-data-dir); GPU scale",
            ),
        },
    ),
    "mappa-bench-v2": Protocol(
        "mappa-bench-v2",
        {
            "mathchat-cpu": Track(
                "mappa/MathChat-v0",
                {"split": "arith2-train", "prompt_style": "small-balanced"},
                ("mathchat:arith2-test-1step", "mathchat:arith2-test-2step"),
                env_kwargs={"prompt_style": "small-balanced"},
                # 8 iterations x 8 prompts x 2 samples; at most 4 actions an episode (one per role, the code
                # executor two) of at most 128 new tokens
                budget=Budget(episodes=128, coach_calls=512, generated_tokens=128 * 4 * 128),
                note="balanced one- and two-step problems, the test splits sealed and in wording the training never "
                "shows (mappa_envs.tasks.mathchat.arith2); greedy, SmolLM2-135M per role; three seeds",
            ),
        },
    ),
}


def track(version: str, name: str) -> Track:
    """The track ``name`` of protocol ``version``; ValueError naming the known ones."""
    if version not in PROTOCOLS:
        raise ValueError(f"unknown protocol {version!r}; known: {sorted(PROTOCOLS)}")
    tracks = PROTOCOLS[version].tracks
    if name not in tracks:
        raise ValueError(f"protocol {version} has no track {name!r}; tracks: {sorted(tracks)}")
    return tracks[name]


# ---------------------------------------------------------------------------------------------- result files
RESULT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "protocol": str,
    "track": str,
    "method": dict,
    "scores": dict,
    "behaviour": dict,
    "budget_spent": dict,
    "code_version": str,
    "hardware": dict,
    "seeds": list,
    "created": str,
}
"""Every field of a result file and its JSON type (``docs/benchmarking.md`` describes each)."""
SCORE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "score": (int, float),
    "ci95": list,
    "kind": str,
    "episodes": int,
    "task_ids": list,
    "outcomes": list,
}
SCHEMA = "mappa-result/1"


def validate_result(data: Mapping[str, Any]) -> list[str]:
    """Why ``data`` is not a valid result file (empty: it is)."""
    problems = [f"missing {k!r}" for k in RESULT_FIELDS if k not in data]
    problems += [
        f"{k!r} must be {t}, not {type(data[k]).__name__}"
        for k, t in RESULT_FIELDS.items()
        if k in data and not isinstance(data[k], t)
    ]
    if data.get("schema", SCHEMA) != SCHEMA:
        problems.append(f"schema {data.get('schema')!r} is not {SCHEMA!r}")
    for suite, s in (data.get("scores") or {}).items():
        problems += [f"scores[{suite!r}]: missing {k!r}" for k in SCORE_FIELDS if k not in s]
        if len(s.get("task_ids", [])) != len(s.get("outcomes", [])):
            problems.append(f"scores[{suite!r}]: task_ids and outcomes differ in length")
    return problems


def load_result(path: str | Path) -> dict[str, Any]:
    """A result file, validated (ValueError listing every problem)."""
    data = json.loads(Path(path).read_text())
    problems = validate_result(data)
    if problems:
        raise ValueError(f"{path} is not a valid {SCHEMA} result file: " + "; ".join(problems))
    return data


def hardware() -> dict[str, Any]:
    out: dict[str, Any] = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return out


def budget_spent(run_dir: str | Path | None) -> dict[str, Any]:
    """What a ``mappa train`` run spent, from its ``metrics.jsonl``: episodes, generated tokens (where logged),
    coach evaluations; an empty dict without a run."""
    path = Path(run_dir) / "metrics.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return {}
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    roles = {k for r in rows for k, v in r.items() if isinstance(v, dict)}
    return {
        "iterations": len(rows),
        "episodes": sum(int(r.get("episodes", 0)) for r in rows),
        "generated_tokens": int(sum(r.get("gen_tok_s", 0.0) * r.get("rollout_s", 0.0) for r in rows)),
        "coach_calls": sum(int(r[role].get("coach_evaluations", 0)) for r in rows for role in roles if role in r),
    }


def result_record(
    version: str, track_name: str, result: Mapping[str, Any], method: Mapping[str, Any], *, run_dir: str | None, seeds
) -> dict[str, Any]:
    """A result file's content from a :func:`baselines.evaluation.evaluate.evaluate` result under the track."""
    scores = {}
    for suite, s in result["suites"].items():
        n, k = s["episodes"], sum(s["outcomes"])
        scores[suite] = {
            "score": k / n if n else 0.0,
            "ci95": list(wilson_interval(k, n)),
            "kind": s["kind"],
            "episodes": n,
            "task_ids": s["task_ids"],
            "outcomes": [bool(x) for x in s["outcomes"]],
            **({"mean_quality": s["mean_quality"]} if "mean_quality" in s else {}),
        }
    return {
        "schema": SCHEMA,
        "protocol": version,
        "track": track_name,
        "method": dict(method),
        "scores": scores,
        "behaviour": {suite: s["behaviour"] for suite, s in result["suites"].items()},
        "budget_spent": budget_spent(run_dir),
        "budget_allowed": asdict(track(version, track_name).budget),
        "code_version": code_version(),
        "hardware": hardware(),
        "seeds": list(seeds),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------------------------- the leaderboard
def leaderboard(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rank result files of one protocol version and track, per suite by score; each adjacent pair of rows that
    was evaluated on the same episodes gets the exact paired test. Refuses to mix versions or tracks."""
    versions = {(r["protocol"], r["track"]) for r in results}
    if len(versions) != 1:
        raise ValueError(
            f"results of different protocol versions or tracks cannot be ranked together: {sorted(versions)}"
        )
    suites: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        for suite, s in r["scores"].items():
            suites.setdefault(suite, []).append(
                {
                    "method": r["method"].get("name", "?"),
                    "information": r["method"].get("information", "undeclared"),
                    **s,
                    "spent": r["budget_spent"],
                }
            )
    for rows in suites.values():
        rows.sort(key=lambda x: -x["score"])
        for upper, lower in itertools.pairwise(rows):
            if upper["task_ids"] == lower["task_ids"]:
                lower["vs_above"] = paired_test(upper["task_ids"], lower["outcomes"], upper["outcomes"])
    ((version, name),) = versions
    return {"protocol": version, "track": name, "suites": suites}


def format_leaderboard(board: Mapping[str, Any]) -> str:
    """Markdown: per suite, the rows by score with intervals, the budget spent, and the paired test against the row
    above (where both used the same episodes)."""
    lines = [f"# {board['protocol']} / {board['track']}"]
    for suite, rows in board["suites"].items():
        lines += ["", f"## {suite}", ""]
        lines += ["| rank | method | reward sees | score [95% CI] | episodes | training episodes | vs the row above |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for i, r in enumerate(rows, 1):
            test = r.get("vs_above")
            versus = (
                f"above right alone {test['gained']}, this {test['lost']}, p = {test['p_value']:.3g}" if test else "-"
            )
            lo, hi = r["ci95"]
            spent = r["spent"].get("episodes", "-")
            score = f"{r['score']:.1%} [{lo:.0%}, {hi:.0%}]"
            info = r.get("information", "undeclared")
            lines.append(f"| {i} | {r['method']} | {info} | {score} | {r['episodes']} | {spent} | {versus} |")
    return "\n".join(lines)


__all__ = [
    "PROTOCOLS",
    "SCHEMA",
    "Budget",
    "Protocol",
    "Track",
    "budget_spent",
    "format_leaderboard",
    "leaderboard",
    "load_result",
    "result_record",
    "track",
    "validate_result",
]
