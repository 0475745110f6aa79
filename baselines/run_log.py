"""A run's metrics: one JSON line per iteration in ``metrics.jsonl`` (rewritten atomically when a checkpoint's time
is added, trimmed on resume), TensorBoard scalars per role and, when asked for, wandb."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import TrainConfig


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
