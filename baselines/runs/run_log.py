"""A run's metrics: one JSON line per iteration in ``metrics.jsonl`` (rewritten atomically when a checkpoint's time
is added, trimmed on resume), TensorBoard scalars per role and, when asked for, wandb."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from baselines.algorithm.samples import Sample
from baselines.config import TrainConfig
from mappa_envs.core import EpisodeRecord
from mappa_envs.metrics import RoleStats

# TensorBoard (torch) and wandb are imported when a run logs to them: both are optional.


@dataclass
class RoleMetrics:
    """One role's figures of an iteration: how it behaved, what the coach did, what was masked, its update."""

    behaviour: dict[str, float]
    """:func:`role_metrics`: scores, rewards, tool use, reply length."""
    coach: dict[str, float]
    """:func:`baselines.algorithm.samples.coach_counts`: calls, retries, fallbacks, latency."""
    masked: dict[str, int]
    """Samples left out of the loss, by reason (:func:`baselines.algorithm.samples.select_trainable`)."""
    update: dict[str, float]
    """:meth:`baselines.algorithm.learner.UpdateStats.as_dict`, or a frozen role's marks."""
    sync_s: float | None = None
    """Seconds of its weights' sync into its engine (None: not synced on its own)."""

    def as_dict(self) -> dict[str, float]:
        sync = {"sync_s": self.sync_s} if self.sync_s is not None else {}
        return {**self.behaviour, **self.coach, **self.masked, **self.update, **sync}


@dataclass
class IterationMetrics:
    """One line of ``metrics.jsonl`` (:meth:`as_dict`: its keys, as every stored run has them)."""

    iteration: int
    episodes: int
    reused_episodes: int
    """Episodes read back from the store (a resumed iteration), not rolled out again."""
    outcomes: dict[str, float]
    """:func:`episode_outcomes`: ``accuracy`` and, for a scored task, ``mean_quality``."""
    rollout_s: float
    train_s: float
    sync_s: float
    iteration_s: float
    """All of it (the checkpoint's time is added once it is written)."""
    gen_tok_s: float
    rollout_breakdown: dict[str, float]
    """Of ``rollout_s``: waiting on generation, stepping the envs, the mean batch."""
    roles: dict[str, RoleMetrics]
    rollouts_from: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "iteration": self.iteration,
            "episodes": self.episodes,
            "reused_episodes": self.reused_episodes,
            **self.outcomes,
            "rollout_s": self.rollout_s,
            "train_s": self.train_s,
            "sync_s": self.sync_s,
            "iteration_s": self.iteration_s,
            "gen_tok_s": self.gen_tok_s,
            **({"rollouts_from": self.rollouts_from} if self.rollouts_from else {}),
            **self.rollout_breakdown,
        }
        out.update({role: m.as_dict() for role, m in self.roles.items()})
        return out


class MetricsLog:
    """The metrics of the run in ``out`` (``cfg.tensorboard``, ``cfg.wandb`` say where else they go)."""

    def __init__(self, out: Path, cfg: TrainConfig):
        self.path = out / "metrics.jsonl"
        self.out, self.cfg = out, cfg
        self._writers: list[Any] = []

    def open(self) -> None:
        if self.cfg.tensorboard and not self._writers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # the package is optional; say so once instead of failing the run
                print(f"[log] TensorBoard disabled: {e} (pip install tensorboard)", file=sys.stderr)
            else:
                self._writers.append(SummaryWriter(str(self.out / "tensorboard")))
        if self.cfg.wandb:
            import wandb

            wandb.init(project="mappa-envs", config=asdict(self.cfg), dir=str(self.out), resume="allow")

    def append(self, metrics: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        flat = {}
        for key, value in metrics.items():
            if isinstance(value, dict):
                flat.update({f"{key}/{k}": v for k, v in value.items() if isinstance(v, int | float)})
            elif isinstance(value, int | float) and key != "iteration":
                flat[f"run/{key}"] = value
        for w in self._writers:
            for key, value in flat.items():
                w.add_scalar(key, value, metrics["iteration"])
            w.flush()
        if self.cfg.wandb:
            import wandb

            wandb.log(flat, step=metrics["iteration"])

    def amend_last(self, metrics: dict[str, Any]) -> None:
        """Replace the last line (this iteration's) with ``metrics``, atomically."""
        lines = self.path.read_text().splitlines()
        if not lines or json.loads(lines[-1])["iteration"] != metrics["iteration"]:
            return
        lines[-1] = json.dumps(metrics)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(ln + "\n" for ln in lines))
        os.replace(tmp, self.path)

    def trim(self, last_done: int) -> None:
        """Keep the lines of iterations up to ``last_done`` (a resumed run re-runs the ones after it)."""
        if not self.path.exists():
            return
        keep = [
            ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln)["iteration"] <= last_done
        ]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def close(self) -> None:
        for w in self._writers:
            w.close()
        self._writers.clear()


def role_metrics(stats: RoleStats, samples: list[Sample]) -> dict[str, float]:
    """Behaviour of one role over an iteration's episodes (the paper's statistics): its :func:`mappa_envs.metrics.
    role_stats` entry, as evaluations count them, and its samples' scores."""
    scores = [float(s.coach.score) for s in samples if s.coach] or [s.reward * 10 for s in samples]
    return {
        "mean_coach_score": float(np.mean(scores)) if scores else 0.0,
        # 0 with several samples: every advantage of the role is 0 (REINFORCE++'s normalisation), it does not learn
        "coach_score_std": float(np.std(scores)) if scores else 0.0,
        "mean_reward": float(np.mean([s.reward for s in samples])) if samples else 0.0,
        "tool_call_rate": stats.tool_call_rate,
        "tool_success_rate": stats.tool_success_rate,
        "response_chars": float(np.mean([len(s.response) for s in samples])) if samples else 0.0,
    }


def episode_outcomes(records: list[EpisodeRecord]) -> dict[str, float]:
    """The iteration's share of successful episodes (``accuracy``) and, for a scored task, its mean quality."""
    out = {"accuracy": float(np.mean([r.success for r in records])) if records else 0.0}
    quality = [r.quality for r in records if r.quality is not None]
    if quality:
        out["mean_quality"] = float(np.mean(quality))
    return out


def update_summary(role: str, m: dict[str, Any]) -> str:
    """``role 41s (ref 9s, fwd+bwd 29s, opt 3s, 180 tok/s)``, or why it took no step."""
    if m.get("skipped"):
        why = "frozen" if m.get("frozen") else "no samples" if not m.get("samples") else "all advantages 0"
        return f"{role} skipped ({why})"
    parts = [f"ref {m['logprob_s']:.0f}s" if m.get("reference_pass") or m.get("policy_pass") else "no pass"]
    if "forward_backward_s" in m:
        parts += [f"fwd+bwd {m['forward_backward_s']:.0f}s", f"opt {m['optimizer_s']:.0f}s"]
    total = m.get("logprob_s", 0.0) + m.get("train_step_s", 0.0)
    return f"{role} {total:.0f}s ({', '.join(parts)})"
