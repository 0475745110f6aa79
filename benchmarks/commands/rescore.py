"""``mappa rescore``: re-score stored episodes with another coach, without new rollouts
(:mod:`mappa_envs.coach.rescore`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mappa_envs.coach import coach_from_spec, rescore
from mappa_envs.coach.rescore import coach_specs_help

from .common import OldSpelling


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("rescore", help="re-score stored episodes (a run's rollouts, trajectories) with another coach")
    p.add_argument("source", help="a `mappa train` run folder (its rollouts/), a folder of *.jsonl, or one file")
    p.add_argument(
        "--coach",
        required=True,
        help="the coach: " + coach_specs_help(),
    )
    p.add_argument("--out", required=True, help="output folder (re-running with the same one resumes)")
    p.add_argument("--name", default="rescored", help="the key of the new evaluation in each action's info")
    p.add_argument("--concurrency", type=int, default=8, help="coach calls at once")
    p.add_argument(
        "--max-new-tokens",
        dest="max_tokens",
        metavar="N",
        type=int,
        default=None,
        help="an LLM coach's reply budget in tokens (default 512 a call; 1024 for llm-hindsight: one reply an episode)",
    )
    p.add_argument(  # the old spelling: every other command says --max-new-tokens
        "--max-tokens", dest="max_tokens", type=int, action=OldSpelling, new="--max-new-tokens", help=argparse.SUPPRESS
    )
    p.set_defaults(func=cmd_rescore)
    return p


def run_env_kwargs(source: str) -> dict[str, dict[str, Any]]:
    """A training run's env arguments (its ``config.json``), by env id: the roles its episodes were made with."""
    path = Path(source) / "config.json"
    if not path.is_file():
        return {}
    cfg = json.loads(path.read_text())
    return {cfg.get("env_id", "mappa/MathChat-v0"): dict(cfg.get("env_kwargs") or {})}


def cmd_rescore(args: argparse.Namespace) -> int:
    rescore(
        args.source,
        coach_from_spec(args.coach, max_tokens=args.max_tokens),
        args.out,
        name=args.name,
        env_kwargs=run_env_kwargs(args.source),
        concurrency=args.concurrency,
    )
    return 0
