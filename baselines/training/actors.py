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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig
from baselines.planning.gpu_plan import actor_groups, layout, plan_nodes
from baselines.ray_learner.cluster import _live_nodes, actor_resources, check_cluster, ranks_node, write_placement
from baselines.ray_learner.distributed import RoleWorker
from baselines.ray_learner.engines import RESET_STEPS, VLLMEngine
from baselines.ray_learner.lora_worker import LoraWorker, RoleHandle
from baselines.ray_learner.rendezvous import start_ranks
from baselines.training.pool import ActorKey, ActorPool
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
    pooled: list[tuple[ActorKey, Any]] = field(default_factory=list)
    """Every engine and set of ranks with its key: what the run gives back to its :class:`ActorPool`."""
    reused: int = 0
    """How many of them came from the pool."""


def actor_key(cfg: TrainConfig, kind: str, group: str, model: str, engine_dtype: str, lora: dict[str, int]) -> ActorKey:
    """The :class:`~baselines.training.pool.ActorKey` of a group's engine (``kind`` ``engine``) or ranks (``ranks``),
    on ``model``; ``lora``: the LoRA roles' adapter ranks when the group is theirs, else empty."""
    device, adapters = cfg.resolved_device(), tuple(sorted(lora.items()))
    place = tuple(sorted(actor_resources(cfg.placement, "engine" if kind == "engine" else "trainer", group).items()))
    if kind == "engine":
        shape = (cfg.max_prompt_tokens + cfg.max_new_tokens, cfg.engine_kv_cache_gb, cfg.gpu_memory_utilization)
        return ActorKey("engine", model, engine_dtype, device, (*shape, adapters), place)
    kind = "lora-ranks" if lora else "ranks"
    return ActorKey(kind, model, cfg.resolved_dtype(), device, (cfg.world_size, cfg.zero_stage, adapters), place)


def _take(ray: Any, pool: ActorPool | None, keys: dict[tuple[str, str], ActorKey], steps, reset_args) -> dict:
    """The actors ``pool`` holds for ``keys`` (``(kind, group)`` -> key), each set of ranks among them reset
    (collective: all of a set's ranks at once; ``reset_args(group)``: the reset's arguments); every other idle actor
    of the pool stopped, which frees its memory for the actors this run starts."""
    if pool is None:
        return {}
    taken: dict[tuple[str, str], Any] = {}
    for k, key in keys.items():
        item = pool.take(key)
        if item is not None and pool.alive(ray, item):
            taken[k] = item
        elif item is not None:
            print(f"[pool] a pooled {k[0]} of {k[1]} had died ({pool.dropped[-1]}): starting a new one", flush=True)
    pool.stop_idle(ray)
    ranks = [(g, w) for (kind, g), ws in taken.items() if kind == "ranks" for w in ws]
    ray.get([w.reset.remote(*reset_args(g)) for g, w in ranks])
    return taken


def _start_engine(
    ray: Any, cfg: TrainConfig, options: dict, g: str, path: str, dtype: str, seed: int, lora: dict[str, int]
) -> Any:
    """Group ``g``'s engine, ready when this returns on a GPU (vLLM profiles the free memory as it starts: one at a
    time)."""
    device = cfg.resolved_device()
    engine = (
        ray.remote(VLLMEngine)
        .options(**options)
        .remote(
            path,
            dtype=dtype,
            device=device,
            seed=seed,
            max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
            kv_cache_gb=cfg.engine_kv_cache_gb,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            name=f"engine-{g}",
            lora_ranks=lora if g in lora else None,
        )
    )
    if device == "cuda":
        ray.get(engine.ready.remote())
    return engine


def start_actors(
    ray: Any,
    cfg: TrainConfig,
    roles: list[str],
    weights: dict[str, WeightSpec],
    paths: dict[str, str],
    engine_dtype: str,
    device: str,
    out: Path,
    pool: ActorPool | None = None,
) -> Actors:
    """Every engine and rank the map asks for, each on its role's model (``paths``: role -> model folder), ready
    when this returns. On GPU every actor asks for the same share of a GPU and is pinned to the node
    :func:`~baselines.planning.gpu_plan.plan_nodes` packed it on (a layout that cannot be packed is refused before any
    actor starts); engines start one at a time there: vLLM profiles free memory at start-up. With a ``pool``, the
    actors it holds for this run are taken and reset instead (:mod:`baselines.training.pool`)."""
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

    log_dir = os.environ.get("MAPPA_ACTOR_LOG_DIR")
    keys = {
        (kind, g): actor_key(cfg, kind, g, paths[g], engine_dtype, lora if g in lora else {})
        for kind, groups in (("engine", engine_groups), ("ranks", trained))
        for g in groups
    }
    steps = pool.reset_steps if pool is not None else RESET_STEPS
    seeds = {g: cfg.seed + roles.index(g) for g in engine_groups}  # each role's engine its own stream
    taken = _take(ray, pool, keys, steps, lambda g: (lora if g in lora else g, paths[g], cfg, steps, log_dir))
    by_group: dict[str, Any] = {g: a for (kind, g), a in taken.items() if kind == "engine"}
    reused_ranks = {g: a for (kind, g), a in taken.items() if kind == "ranks"}
    for g in engine_groups:
        if g not in by_group:
            by_group[g] = _start_engine(ray, cfg, on("engine", g), g, paths[g], engine_dtype, seeds[g], lora)

    def spawn(g: str, port: int) -> list[Any]:
        o = on("trainer", g)
        W = cfg.world_size
        if g in lora:
            return [ray.remote(LoraWorker).options(**o).remote(lora, r, W, port, paths[g], cfg) for r in range(W)]
        return [ray.remote(RoleWorker).options(**o).remote(g, r, W, port, paths[g], cfg) for r in range(W)]

    ranks, retries = start_ranks(ray, [g for g in trained if g not in reused_ranks], spawn)
    ranks.update(reused_ranks)
    # every engine, a fresh one too: vLLM's warm-up draws from the generator the run samples from
    ray.get([e.reset.remote(seeds[g], steps=steps, log_dir=log_dir, name=f"engine-{g}") for g, e in by_group.items()])
    write_placement(ray, out / "placement.json", by_group, ranks)
    workers = {}
    for r in roles:
        if owner[r] in lora:
            workers[r] = [RoleHandle(a, owner[r]) for a in ranks[group[r]]]
        elif group[r] in ranks:
            workers[r] = ranks[group[r]]
    pooled = [(keys["engine", g], e) for g, e in by_group.items()] + [(keys["ranks", g], ranks[g]) for g in trained]
    engines = {r: by_group[group[r]] for r in roles}
    return Actors(engines, workers, group, lora, retries, pooled=pooled, reused=len(taken))


__all__ = ["Actors", "actor_groups", "start_actors"]
