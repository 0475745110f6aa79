"""What a run keeps on disk besides its checkpoints: the trajectory store (every finished episode, durable as it
ends, read back on resume) and the rule of what a resumed run may change in its configuration."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.fields import resume_may_change
from mappa_envs.core import EpisodeRecord


class TrajectoryStore:
    """Finished episodes per iteration, one JSON line each, durable as soon as the episode ends."""

    def __init__(self, root: str | Path):
        self.root = Path(root) / "rollouts"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, iteration: int) -> Path:
        return self.root / f"iter-{iteration:05d}.jsonl"

    def append(self, iteration: int, index: int, record: EpisodeRecord) -> None:
        line = json.dumps({"index": index, "episode": record.to_dict()}, ensure_ascii=False, default=str)
        with open(self.path(iteration), "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load(self, iteration: int) -> dict[int, EpisodeRecord]:
        """Stored episodes by index. A torn last line (the process was killed while writing it) is dropped with a
        message; a damaged line elsewhere is an error (the store is not silently shortened)."""
        path = self.path(iteration)
        if not path.exists():
            return {}
        lines = path.read_text(encoding="utf-8").split("\n")
        out: dict[int, EpisodeRecord] = {}
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines) - 1:  # no newline after it: the write was cut short
                    print(f"[store] {path.name}: dropped a torn last line ({len(line)} chars)", file=sys.stderr)
                    self._truncate(path, lines[:n])
                    break
                raise ValueError(f"{path}:{n + 1}: damaged trajectory line") from None
            out[int(row["index"])] = EpisodeRecord.from_dict(row["episode"])
        return out

    @staticmethod
    def _truncate(path: Path, keep: list[str]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep if line.strip()), encoding="utf-8")
        os.replace(tmp, path)


REMOVED = "REMOVED"
"""The file ``mappa ablate`` leaves in a finished run's ``checkpoints/`` when it removes them: such a run cannot be
resumed (it would train again from the base weights on episodes its trained policies sampled)."""

RESUME_MAY_CHANGE = resume_may_change(TrainConfig)
"""Configuration fields a resumed run may change (those declared ``option(..., resume_may_change=True)`` in
:class:`~baselines.config.TrainConfig`); any other change is refused (the checkpoint, the stored episodes and the
held-out evaluation belong to the configuration that made them)."""


BEFORE_FIELD: dict[str, Any] = {"autocast": "off"}
"""What a run saved before a field existed did, where that differs from the field's default: runs before
``autocast`` computed in their weights' dtype."""


class FinishedRun(ValueError):
    """``cfg.out_dir`` holds this very configuration's finished run (its checkpoints dropped, its held-out
    evaluation written): nothing is left to do. ``mappa train`` says where the results are and exits 0."""


def check_resumable(cfg: TrainConfig) -> dict[str, Any] | None:
    """The configuration an earlier run in ``cfg.out_dir`` saved, when this run would re-use anything of it (a
    checkpoint, stored episodes, a held-out evaluation), else None. Raises ``ValueError`` when that run was
    configured otherwise (a field outside :data:`RESUME_MAY_CHANGE`; fields an older version did not save count
    as their defaults, or as :data:`BEFORE_FIELD` says): resuming it would silently mix two experiments.
    ``mappa train`` checks this before it builds anything."""
    out = Path(cfg.out_dir)
    if cfg.resume and (out / "checkpoints" / REMOVED).exists():
        saved_path = out / "config.json"
        saved_cfg = json.loads(saved_path.read_text()) if saved_path.exists() else {}
        now = json.loads(json.dumps(asdict(cfg)))
        if (out / "eval.json").exists() and all(saved_cfg.get(k) == v for k, v in now.items() if k in saved_cfg):
            raise FinishedRun(
                f"{out} is this configuration's finished run: its trained models are in {out / 'models'}, its "
                f"held-out evaluation in {out / 'eval.json'} (a report: mappa report run {out}); to train it again, "
                "add --no-resume or give another --out"
            )
        raise ValueError(
            f"{out}: its checkpoints were removed when the run finished ({out / 'checkpoints' / REMOVED}), so it "
            "cannot be resumed or extended: train into another --out (its models/ are the trained weights), or "
            "start afresh with --no-resume"
        )
    reused = (
        (out / "checkpoints" / "latest").exists()
        or (out / "eval.json").exists()
        or any(f.stat().st_size for f in (out / "rollouts").glob("*.jsonl"))
    )
    if not cfg.resume or not reused or not (out / "config.json").exists():
        return None
    now = json.loads(json.dumps(asdict(cfg)))
    defaults = {**json.loads(json.dumps(asdict(TrainConfig()))), **BEFORE_FIELD}
    saved = {**defaults, **{k: v for k, v in json.loads((out / "config.json").read_text()).items() if k in now}}
    changed = sorted(k for k in now if k not in RESUME_MAY_CHANGE and saved.get(k) != now.get(k))
    if changed:
        diff = "; ".join(f"{k}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in changed)
        raise ValueError(
            f"{out} holds a run configured otherwise ({diff}): resume it with its own configuration, or start "
            "afresh with --no-resume or another --out"
        )
    return saved


EXPORTED = ("config.json", "adapter_config.json")
"""A role's folder under ``models/`` holds one of these when it is exported: a full model, or a LoRA adapter."""


def drop_finished_checkpoints(run: str | Path, roles: list[str], log=print) -> int:
    """Remove a finished run's checkpoints (weights with their optimiser and scheduler state: they serve only to
    resume or extend the run) once every role of ``roles`` is exported to ``models/<role>/``; leave
    ``checkpoints/REMOVED`` saying so, which :func:`check_resumable` reads (a resumed run would start again from the
    base weights on episodes the trained policies sampled). Says what was freed, or why nothing was; returns the
    bytes freed. ``mappa train`` calls it when a run has finished, unless ``--keep-finished-checkpoints``."""
    folder = Path(run) / "checkpoints"
    if not (folder / "latest").is_file():
        return 0
    missing = [r for r in roles if not any((Path(run) / "models" / r / f).is_file() for f in EXPORTED)]
    if not roles or missing:
        log(f"kept {folder}: models/ lacks {missing or 'every role'} (not all exported)")
        return 0
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / REMOVED).write_text(
        f"The run removed its checkpoints ({size / 2**30:.2f} GiB) when it finished, after exporting "
        f"models/{{{','.join(roles)}}}: it cannot be resumed or extended (--keep-finished-checkpoints keeps them).\n"
    )
    log(
        f"the finished run removed its checkpoints ({size / 2**30:.2f} GiB of weights and optimiser state; "
        f"--keep-finished-checkpoints keeps them): models/ holds the trained weights"
    )
    return size


__all__ = [
    "EXPORTED",
    "REMOVED",
    "RESUME_MAY_CHANGE",
    "FinishedRun",
    "TrajectoryStore",
    "check_resumable",
    "drop_finished_checkpoints",
]
