"""A ``mappa train`` run as its report reads it: metrics per iteration, stored episodes, held-out evaluations and
configuration (:class:`Run`)."""

from __future__ import annotations

import json
from pathlib import Path

from mappa_envs.core import EpisodeRecord, read_jsonl

ROLE_METRICS = (
    ("mean_coach_score", "mean reward x 10 (the coach's score; outcome-only: the outcome)"),
    ("tool_call_rate", "tool-call rate"),
    ("tool_success_rate", "tool success rate"),
    ("response_chars", "response length (chars)"),
    ("kl", "KL to the reference"),
)


class Run:
    """One training run's logs."""

    def __init__(self, path: str | Path, label: str | None = None):
        self.path = Path(path)
        if not (self.path / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{self.path} has no metrics.jsonl: not a `mappa train` output folder")
        self.label = label or self.path.name
        self.metrics = [json.loads(x) for x in (self.path / "metrics.jsonl").read_text().splitlines() if x.strip()]
        self.rollouts: dict[int, list[EpisodeRecord]] = {}
        for f in sorted((self.path / "rollouts").glob("iter-*.jsonl")):
            self.rollouts[int(f.stem.split("-")[1])] = list(read_jsonl(f))
        self.eval = json.loads((self.path / "eval.json").read_text()) if (self.path / "eval.json").exists() else {}
        cfg = self.path / "config.json"
        self.config = json.loads(cfg.read_text()) if cfg.exists() else {}

    @property
    def roles(self) -> list[str]:
        roles: list[str] = []
        for m in self.metrics:
            roles += [k for k, v in m.items() if isinstance(v, dict) and k not in roles]
        return roles

    def records(self) -> list[EpisodeRecord]:
        return [r for it in sorted(self.rollouts) for r in self.rollouts[it]]
