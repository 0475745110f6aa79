"""``mappa bench``'s ``start`` section: how long a run of the distributed trainer takes to start on fresh actors
(its Ray cluster already up) and on a warm :class:`~baselines.training.pool.ActorPool` (the same run's engines and
ranks, reset: :mod:`baselines.training.pool`), on the smoke preset (three roles, the tiny random model)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from baselines.planning.presets import preset
from baselines.training.pool import ActorPool

# Ray and the trainer are imported inside the function: the CLI's other commands load neither.


def bench_run_start() -> list[dict[str, Any]]:
    """A cold start (every actor started), then the same run's start on the pool those actors went back to."""
    import ray

    from baselines.training.ray_trainer import RayTrainer

    seconds = {}
    with tempfile.TemporaryDirectory() as tmp, ActorPool() as pool:
        for kind in ("cold", "warm"):
            cfg = preset("smoke", out_dir=str(Path(tmp) / kind), progress=False)
            if kind == "cold":  # the cluster's own start is not the actors'
                from baselines.ray_learner.cluster import ray_init

                ray_init(cfg)
            trainer = RayTrainer(cfg, pool=pool)
            seconds[kind] = trainer.start.seconds
            trainer.close()
    ray.shutdown()
    return [
        {
            "figure": "run start, smoke preset (3 engines, 3 rank sets), warm pool (s)",
            "value": seconds["warm"],
            "reference": "the same run's cold start, Ray already up (s)",
            "reference_value": seconds["cold"],
            "higher_is_better": False,
        }
    ]


__all__ = ["bench_run_start"]
