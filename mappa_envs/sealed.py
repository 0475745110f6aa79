"""Sealed test splits: evaluated only on purpose, and every look logged.

A task declares which of its splits are sealed (:attr:`mappa_envs.core.PipelineEnv.sealed_splits`; MathChat's
``arith2-test-1step`` and ``arith2-test-2step``). Building an env on a sealed split needs ``unseal=True``
(:class:`SealedSplit` otherwise), which ``mappa train --unseal-test`` and ``mappa eval --unseal-test`` pass; every
evaluation of a sealed split appends one line to the access log (:func:`log_access`, called by the code that
evaluates, never by hand): time, commit, command, env, split, episodes, correct, result file.

Choices (iterations, learning rate, coach, prompts) are made on the dev splits; a test split is looked at only by
pre-registered runs, and the log makes the number of looks public. Where the log is:

1. ``$MAPPA_TEST_ACCESS_LOG`` when set (the test suite points it at a temporary file);
2. ``docs/runs/test-access.jsonl`` of the checkout the package runs from (a git checkout with ``docs/runs``): a
   committed file;
3. else ``~/.cache/mappa/test-access.jsonl``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .registry import _load, spec

_REPO = Path(__file__).resolve().parents[1]


class SealedSplit(PermissionError):
    """An env was built on a sealed test split without ``unseal=True``."""


def refuse(env_id: str, split: str) -> SealedSplit:
    """The error an env raises when built on its sealed ``split`` without ``unseal=True``."""
    return SealedSplit(
        f"{env_id} split {split!r} is a sealed test split: choose settings on the dev splits, and evaluate the test "
        f"split only in a pre-registered run (mappa train/eval --unseal-test, or unseal=True); every evaluation is "
        f"logged to {access_log_path()}"
    )


def sealed_splits(env_id: str) -> tuple[str, ...]:
    """The sealed splits ``env_id``'s task declares (none for a factory function or a task without)."""
    cls = _load(spec(env_id).entry_point)
    return tuple(getattr(cls, "sealed_splits", ())) if isinstance(cls, type) else ()


def is_sealed(env_id: str, env_kwargs: dict[str, Any]) -> bool:
    """Whether ``make(env_id, **env_kwargs)`` builds a sealed split."""
    return env_kwargs.get("split") in sealed_splits(env_id)


def code_version() -> str:
    """The git commit of this checkout (``+dirty`` when it has changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=10)
        # the access log itself changes with every look: it does not make the code dirty
        status = ["git", "status", "--porcelain", "--", ".", ":!docs/runs/test-access.jsonl"]
        dirty = subprocess.run(status, cwd=_REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if sha.returncode:
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def access_log_path() -> Path:
    """Where looks at sealed splits are logged (see the module docstring)."""
    if os.environ.get("MAPPA_TEST_ACCESS_LOG"):
        return Path(os.environ["MAPPA_TEST_ACCESS_LOG"])
    if (_REPO / ".git").exists() and (_REPO / "docs" / "runs").is_dir():
        return _REPO / "docs" / "runs" / "test-access.jsonl"
    return Path.home() / ".cache" / "mappa" / "test-access.jsonl"


def log_access(
    env_id: str, split: str, *, episodes: int, correct: int, result_file: str | Path | None
) -> dict[str, Any]:
    """Append one look at a sealed split to the access log and return the line written."""
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": code_version(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
        "env_id": env_id,
        "split": split,
        "episodes": int(episodes),
        "correct": int(correct),
        "result_file": str(result_file) if result_file else None,
    }
    path = access_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    print(f"[sealed] evaluated sealed split {split} ({episodes} episodes): logged to {path}", flush=True)
    return line


def read_access_log(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The looks logged so far (empty without a log)."""
    path = Path(path) if path else access_log_path()
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


__all__ = [
    "SealedSplit",
    "access_log_path",
    "code_version",
    "is_sealed",
    "log_access",
    "read_access_log",
    "refuse",
    "sealed_splits",
]
