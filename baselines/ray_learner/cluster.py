"""The Ray cluster of the distributed trainer: starting or joining it (:func:`ray_init`; joining a cluster started with
``ray start``, token authentication included: :mod:`baselines.ray_learner.ray_connect`) and where its actors run
(``TrainConfig.placement``, ``mappa train --place``).

Each role has one vLLM engine and ``world_size`` DeepSpeed ranks. On one machine they all land on the only node; on
a cluster (``RAY_ADDRESS``) a placement names, per actor, a **custom resource** that only some nodes offer (``ray
start --resources='{"gen_node": 1}'``), and the actor asks for a sliver of it (:data:`SLIVER`), so it is scheduled
on such a node while any number of actors share it. Keys, the most specific winning:

- ``engine:ROLE`` / ``trainer:ROLE``: that role's engine / all its ranks;
- ``ROLE``: both of that role's kinds of actor;
- ``engines`` / ``trainers``: every role's engines / ranks.

A role's ranks always share one resource (one node: their DeepSpeed rendezvous is on the loopback of rank 0's
node). Before any actor starts, :func:`cluster_problems` compares what the actors ask for with what the cluster
has, and the trainer stops with every shortfall named (:class:`PlacementError`) instead of waiting forever for an
actor Ray cannot place.

>>> placed = {"engines": "gen", "trainer:verifier": "big"}
>>> actor_resources(placed, "engine", "verifier"), actor_resources(placed, "trainer", "verifier")
({'gen': 0.001}, {'big': 0.001})
>>> actor_resources(placed, "trainer", "problem_solver")
{}
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from baselines.config import TrainConfig
from baselines.ray_learner.ray_connect import join, recorded_cluster

# Ray are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run) loads none
# of them.

_ACTOR_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CONFIGURE_LOGGING": "0",
    "DS_ACCELERATOR": "",
}


def actor_env(cfg: TrainConfig) -> dict[str, str]:
    """The actors' environment: thread counts, vLLM's CPU KV cache (on CPU only), DeepSpeed's accelerator
    (``cuda`` or ``cpu``), and where ``mappa train`` sends the actors' output (``MAPPA_ACTOR_LOG_DIR``)."""
    device = cfg.resolved_device()
    env = dict(_ACTOR_ENV, DS_ACCELERATOR="cuda" if device == "cuda" else "cpu")
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cfg.engine_kv_cache_gb)))
        # Ray pins OMP_NUM_THREADS=1 in actors that reserve no CPU, which halves every phase on a 2-core
        # machine; the phases (generation, log-probs, updates) mostly run one process at a time: all cores
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    # `mappa train` (not --verbose) sends the actors' output to files in the run folder instead of the console
    log_dir = os.environ.get("MAPPA_ACTOR_LOG_DIR")
    if log_dir:
        env["MAPPA_ACTOR_LOG_DIR"] = log_dir
    return env


def ray_init(cfg: TrainConfig) -> None:
    """Join the Ray cluster named by ``RAY_ADDRESS`` (``--ray-address``; with Ray's token authentication, or a
    :class:`~baselines.ray_learner.ray_connect.RayConnectError` that says what to set:
    :mod:`baselines.ray_learner.ray_connect`), or start a local cluster of our own with a capped object store and the
    machine's CPUs. Either way the actors get :func:`actor_env`.

    Without an address the local cluster is started explicitly (``address="local"``): a bare ``ray.init()`` would
    join whatever cluster ``ray start`` last recorded on this machine (and refuse our CPU count there); such a
    cluster is named in one line, with how to join it."""
    import ray

    env = actor_env(cfg)
    log_dir = env.get("MAPPA_ACTOR_LOG_DIR")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    init: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": not log_dir}
    joined = join()
    if joined is not None:
        print(joined.line, file=sys.stderr, flush=True)
        init["address"] = joined.address
    else:  # a local cluster of our own, capped
        found = recorded_cluster()
        if found:
            print(
                f"[ray] a cluster started with `ray start` runs on this machine ({found}); mappa starts a local "
                "cluster of its own: --ray-address auto (or RAY_ADDRESS=auto) joins that one instead",
                file=sys.stderr,
                flush=True,
            )
        # the store carries each role's full weights to its engine at every sync: room for one 135M-parameter
        # fp32 model (0.54 GB) plus slack; larger models spill to disk (slower syncs) unless given more
        store = int(os.environ.get("MAPPA_RAY_OBJECT_STORE_BYTES", 1536 * 1024**2))
        init.update(address="local", include_dashboard=False, object_store_memory=store, num_cpus=os.cpu_count())
    ray.init(**init)


SLIVER = 0.001
"""The amount of its placement resource an actor asks for: a node offering 1 of it takes up to 1000 actors."""

KINDS = ("engine", "trainer")


class PlacementError(RuntimeError):
    """The cluster cannot place the configured actors (missing custom resources, too few CPUs or GPUs)."""


def placement_key_problems(placement: Mapping[str, str], roles: Sequence[str]) -> list[str]:
    """Keys that name no actor of this task, and empty resource names."""
    problems = []
    for key, resource in placement.items():
        kind, _, role = key.partition(":")
        ok = key in ("engines", "trainers", "coach") or key in roles or (kind in KINDS and role in roles)
        if not ok:
            problems.append(
                f"placement key {key!r}: expected engines, trainers, coach, ROLE, engine:ROLE or trainer:ROLE "
                f"(roles: {list(roles)})"
            )
        if not str(resource).strip():
            problems.append(f"placement {key!r}: an empty resource name")
    return problems


def placement_for(placement: Mapping[str, str], kind: str, role: str) -> str | None:
    """The custom resource an actor (``kind`` ``engine`` or ``trainer``) of ``role`` is placed by, if any."""
    for key in (f"{kind}:{role}", role, f"{kind}s"):
        if key in placement:
            return placement[key]
    return None


def actor_resources(placement: Mapping[str, str], kind: str, role: str) -> dict[str, float]:
    """The ``resources=`` an actor asks Ray for (empty: anywhere)."""
    resource = placement_for(placement, kind, role)
    return {resource: SLIVER} if resource else {}


def demand(
    placement: Mapping[str, str], actors: Sequence[tuple[str, str, int]], per_actor: Mapping[str, float]
) -> dict[str, float]:
    """What the actors ask for together: ``actors`` as (kind, role, how many), each asking ``per_actor`` (``CPU``,
    ``GPU``) plus its placement."""
    total: dict[str, float] = {}
    for kind, role, n in actors:
        for name, amount in {**per_actor, **actor_resources(placement, kind, role)}.items():
            total[name] = total.get(name, 0.0) + amount * n
    return {k: v for k, v in total.items() if v > 0}


def cluster_problems(
    needed: Mapping[str, float], available: Mapping[str, Any], who: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """Each resource the actors need beyond what the cluster has (``ray.cluster_resources()``), with the actors
    that ask for it (``who``: resource -> actor names).

    >>> for line in cluster_problems({"GPU": 2.0, "gen": 0.001}, {"GPU": 1.0}, {"gen": ["engine:a"]}):
    ...     print(line)
    GPU: the actors need 2, the cluster has 1
    gen: the actors need 0.001, no node offers it (asked for by engine:a)
    """
    problems = []
    for name, amount in sorted(needed.items()):
        have = float(available.get(name, 0.0))
        if have + 1e-9 < amount:
            what = "no node offers it" if have == 0 else f"the cluster has {have:g}"
            by = f" (asked for by {', '.join(who[name])})" if who and who.get(name) else ""
            problems.append(f"{name}: the actors need {amount:g}, {what}{by}")
    return problems


def _live_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def fitting_node(nodes: Sequence[Mapping[str, Any]], needs: Mapping[str, float]) -> str | None:
    """The id of the first node whose resources hold ``needs`` (every amount at once), or None."""
    for node in nodes:
        have = node.get("Resources", {})
        if all(float(have.get(k, 0.0)) + 1e-9 >= v for k, v in needs.items() if v > 0):
            return node["NodeID"]
    return None


def check_cluster(ray: Any, placement: Mapping[str, str], actors: Sequence[tuple[str, str, int]], per_actor) -> None:
    """Raise :class:`PlacementError` naming every shortfall before any actor is started: the cluster's totals, and
    for each placed kind of actor a node that offers its resource together with what one such actor (a role's
    ranks: all of them, on one node) asks for."""
    nodes = _live_nodes(ray)
    who: dict[str, list[str]] = {}
    for kind, role, _ in actors:
        for name in actor_resources(placement, kind, role):
            who.setdefault(name, []).append(f"{kind}:{role}")
    problems = cluster_problems(demand(placement, actors, per_actor), ray.cluster_resources(), who)
    for kind, role, n in actors:
        needs = {k: v * n for k, v in {**per_actor, **actor_resources(placement, kind, role)}.items()}
        if fitting_node(nodes, needs) is None and not problems:
            problems.append(f"{kind} of {role}: no single node offers {needs}")
    if problems:
        offers = [{k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")} for n in nodes]
        raise PlacementError(
            "the Ray cluster cannot place this run's actors:\n"
            + "\n".join(f"- {p}" for p in problems)
            + f"\nits live nodes offer: {offers}\n(start nodes with `ray start --resources='{{\"NAME\": 1}}'`, or "
            "change --place)"
        )


def ranks_node(ray: Any, placement: Mapping[str, str], role: str, world_size: int, per_actor) -> str | None:
    """The node all of a role's ranks are pinned to (their rendezvous is on the loopback of rank 0's node), on a
    cluster of several nodes with several ranks per role; None (anywhere) otherwise."""
    nodes = _live_nodes(ray)
    if world_size < 2 or len(nodes) < 2:
        return None
    needs = {k: v * world_size for k, v in {**per_actor, **actor_resources(placement, "trainer", role)}.items()}
    return fitting_node(nodes, needs)


def actor_nodes(ray: Any, actors: Mapping[str, Any]) -> dict[str, str]:
    """Each named actor's node id (its ``ready()`` answer), for ``placement.json``."""
    names = list(actors)
    return dict(zip(names, ray.get([actors[n].ready.remote() for n in names]), strict=True))


def write_placement(ray: Any, path, engines: Mapping[str, Any], workers: Mapping[str, Sequence[Any]]) -> dict:
    """``placement.json``: each actor's node and each live node's resources (what a run on a cluster used)."""
    actors = {f"engine:{r}": e for r, e in engines.items()}
    actors.update({f"trainer:{r}:{i}": w for r, ws in workers.items() for i, w in enumerate(ws)})
    nodes = {
        n["NodeID"]: {k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")}
        for n in ray.nodes()
        if n.get("Alive")
    }
    try:
        record = {"actors": actor_nodes(ray, actors), "nodes": nodes}
    except Exception as err:  # informational: a failure to record it must not stop a run whose actors are up
        record = {"error": f"{type(err).__name__}: {err}", "nodes": nodes}
        warnings.warn(f"placement.json: the actors' nodes could not be read ({record['error']})", stacklevel=2)
    path.write_text(json.dumps(record, indent=1))
    return record


__all__ = [
    "SLIVER",
    "PlacementError",
    "actor_env",
    "actor_nodes",
    "actor_resources",
    "check_cluster",
    "cluster_problems",
    "demand",
    "fitting_node",
    "placement_for",
    "placement_key_problems",
    "ranks_node",
    "ray_init",
    "write_placement",
]
