"""Training from another run's stored episodes, re-scored by this run's coach (``mappa train --rollouts-from RUN``).

Two coaches compared by two training runs differ in their rollouts as well as in their rewards. With
``--rollouts-from`` each iteration takes RUN's stored episodes of the same iteration instead of rolling out, asks
this run's coach to score every action again (:func:`mappa_envs.coach.rescore`: cached and resumable under
``rescored/iter-N/``), gives each action the new score as its reward (score / 10, as the reward wrapper does) and
keeps the original evaluation beside it (``info["coach_original"]``, read by ``act.evaluation("coach_original")``).
The episodes are stored in this run's own ``rollouts/`` too, so its reports read them as any run's.

Off-policy: RUN's first iteration was sampled by the base weights this run also starts from; later iterations by
RUN's own updated weights. The distributed trainer takes the stored log-probs of the engine that sampled each
response as the ratio's old log-probs (clipped as in the loss); see :attr:`TrainConfig.rollouts_from`.
"""

from __future__ import annotations

import json
from pathlib import Path

from baselines.config import TrainConfig, run_coach
from baselines.runs.store import TrajectoryStore
from mappa_envs.coach import rescore
from mappa_envs.core import EpisodeRecord, read_jsonl


def source_config(cfg: TrainConfig) -> dict:
    """The source run's ``config.json``; FileNotFoundError/ValueError when it is not a run this one can train from."""
    src = Path(str(cfg.rollouts_from))
    path = src / "config.json"
    if not path.exists() or not (src / "rollouts").is_dir():
        raise FileNotFoundError(f"--rollouts-from {src}: not a `mappa train` run folder (config.json and rollouts/)")
    source = json.loads(path.read_text())
    for key in ("env_id", "model"):  # the episodes' task, and the token ids and log-probs of the model that sampled
        if source.get(key) != getattr(cfg, key):
            raise ValueError(
                f"--rollouts-from {src}: its {key} is {source.get(key)!r}, this run's {getattr(cfg, key)!r}"
            )
    metrics = src / "metrics.jsonl"
    done = (
        {json.loads(x)["iteration"] for x in metrics.read_text().splitlines() if x.strip()}
        if metrics.exists()
        else set()
    )
    missing = [i + 1 for i in range(cfg.iterations) if i not in done or not TrajectoryStore(src).path(i).exists()]
    if missing:
        raise ValueError(
            f"--rollouts-from {src}: iteration(s) {missing} of {cfg.iterations} did not finish there (no stored "
            "episodes, or no metrics line: an iteration cut short holds part of its batch); train fewer --iterations"
        )
    return source


def stored_rollout(
    cfg: TrainConfig, iteration: int, store: TrajectoryStore, out: Path, coach_url: str | None = None
) -> list[EpisodeRecord]:
    """The source run's episodes of ``iteration`` in their stored order, re-scored by ``cfg.coach`` (``none``: as
    stored, their rewards the source run's), each also appended to this run's ``store``."""
    source = source_config(cfg)
    src = TrajectoryStore(Path(str(cfg.rollouts_from)))
    stored = src.load(iteration)
    if not stored:
        raise ValueError(f"--rollouts-from {cfg.rollouts_from}: iteration {iteration + 1} holds no episodes")
    if cfg.coach != "none":
        rescored = out / "rescored" / f"iter-{iteration:05d}"
        env_kwargs = {cfg.env_id: dict(source.get("env_kwargs") or {})}
        coach = run_coach(cfg, coach_url)
        rescore(src.path(iteration), coach, rescored, name="rescored", env_kwargs=env_kwargs, log=lambda _: None)
        by_id = {r.episode_id: r for r in read_jsonl(rescored / "trajectories.jsonl")}
        for rec in stored.values():
            for act, new in zip(rec.actions, by_id[rec.episode_id].actions, strict=True):
                act.info["coach_original"] = act.coach
                evaluation = new.evaluation("rescored")
                if evaluation is None:
                    raise ValueError(f"{rescored}: an action of episode {rec.episode_id} has no rescored evaluation")
                act.coach, act.reward = evaluation, evaluation.reward  # the reward as the reward wrapper gives it
    mine = store.load(iteration)
    for index in sorted(stored):
        if index not in mine:  # a resumed run stored part of this iteration already
            store.append(iteration, index, stored[index])
    return [stored[i] for i in sorted(stored)]
