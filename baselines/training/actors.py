"""The distributed trainer's actors, started from the role-to-weights map (:mod:`baselines.weights.role_weights`):

- a ``full`` role: its own vLLM engine and ``world_size`` DeepSpeed ranks
  (:class:`~baselines.ray_learner.distributed.RoleWorker`);
- a ``frozen`` role: its own engine, no rank;
- a ``shared:ROLE`` role: its owner's engine and ranks;
- the ``lora`` roles: **one** engine with an adapter per role (vLLM's per-request LoRA) and **one** set of ranks
  holding one base and every adapter (:class:`~baselines.ray_learner.lora_worker.LoraWorker`), both named after the
  first LoRA role (``engine:<it>``, ``trainer:<it>:<rank>`` in ``placement.json`` and in ``--place``).

A role's engine and ranks are then looked up by the role itself: a LoRA role's ranks through
:class:`~baselines.ray_learner.lora_worker.RoleHandle`, which names the role in every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.planning.gpu_plan import actor_groups, layout, plan_nodes
from baselines.ray_learner.cluster import _live_nodes, actor_resources, check_cluster, ranks_node, write_placement
from baselines.ray_learner.distributed import RoleWorker
from baselines.ray_learner.engines import VLLMEngine
from baselines.ray_learner.lora_worker import LoraWorker, RoleHandle
from baselines.ray_learner.rendezvous import start_ranks
from baselines.weights.role_weights import WeightSpec, owners

# Ray are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run) loads none
# of them.


@dataclass
class Actors:
    engines: dict[str, Any]
    """role -> its engine (roles that share weights share it)"""
    workers: dict[str, list[Any]]
    """role -> its ranks (or :class:`RoleHandle`\\ s); frozen roles absent"""
    groups: dict[str, str]
    """role -> the name its engine and ranks were started under"""
    lora_ranks: dict[str, int]
    """LoRA role -> its adapter's rank"""
    rendezvous_retries: int = 0


def start_actors(
    ray: Any,
    cfg: TrainConfig,
    roles: list[str],
    weights: dict[str, WeightSpec],
    paths: dict[str, str],
    engine_dtype: str,
    device: str,
    out: Path,
) -> Actors:
    """Every engine and rank the map asks for, each on its role's model (``paths``: role -> model folder), ready
    when this returns. On GPU every actor asks for the same share of a GPU and is pinned to the node
    :func:`~baselines.planning.gpu_plan.plan_nodes` packed it on (a layout that cannot be packed is refused before any
    actor starts); engines start one at a time there: vLLM profiles free memory at start-up."""
    group, lora = actor_groups(roles, weights)
    owner = owners(weights)
    lay = layout(cfg, roles, weights, device, ray.cluster_resources().get("GPU", 0))
    engine_groups, trained, opts, per_actor = lay.engine_groups, lay.trained, lay.opts, lay.per_actor
    check_cluster(ray, cfg.placement, lay.wanted, per_actor)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pinned = plan_nodes(_live_nodes(ray), cfg.placement, lay.wanted, per_actor) if device == "cuda" else {}

    def on(kind: str, g: str) -> dict[str, Any]:
        node = pinned.get((kind, g))
        if node is None and kind == "trainer":  # on CPU: a role's ranks on one node, found by its resources
            node = ranks_node(ray, cfg.placement, g, cfg.world_size, per_actor)
        o = dict(opts, resources=actor_resources(cfg.placement, kind, g))
        if node:
            o["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return o

    Engine = ray.remote(VLLMEngine)
    by_group: dict[str, Any] = {}
    for g in engine_groups:
        by_group[g] = Engine.options(**on("engine", g)).remote(
            paths[g],
            dtype=engine_dtype,
            device=device,
            seed=cfg.seed + roles.index(g),
            max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
            kv_cache_gb=cfg.engine_kv_cache_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            name=f"engine-{g}",
            lora_ranks=lora if g in lora else None,
        )
        if device == "cuda":
            ray.get(by_group[g].ready.remote())

    def spawn(g: str, port: int) -> list[Any]:
        o = on("trainer", g)
        W = cfg.world_size
        if g in lora:
            return [ray.remote(LoraWorker).options(**o).remote(lora, r, W, port, paths[g], cfg) for r in range(W)]
        return [ray.remote(RoleWorker).options(**o).remote(g, r, W, port, paths[g], cfg) for r in range(W)]

    ranks, retries = start_ranks(ray, trained, spawn)
    ray.get([e.ready.remote() for e in by_group.values()])
    write_placement(ray, out / "placement.json", by_group, ranks)
    workers = {}
    for r in roles:
        if owner[r] in lora:
            workers[r] = [RoleHandle(a, owner[r]) for a in ranks[group[r]]]
        elif group[r] in ranks:
            workers[r] = ranks[group[r]]
    return Actors({r: by_group[group[r]] for r in roles}, workers, group, lora, retries)


__all__ = ["Actors", "actor_groups", "start_actors"]
