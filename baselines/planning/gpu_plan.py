"""Where the distributed trainer's actors go on a cluster's GPUs, decided before any of them starts.

Each role's engine and each of its ``world_size`` ranks is an actor (:mod:`baselines.training.actors`). On GPU every
actor asks Ray for the same share of a GPU (:func:`gpu_share`): with ``n`` actors on ``g`` GPUs, ``k = ceil(n / g)``
actors share a GPU, each asking ``1/k`` rounded *down* to Ray's resource granularity (0.0001), so that ``k`` of them
fit on one GPU whichever way Ray rounds the amount (Ray 2.60 fits six of an unrounded ``1/6``: measured by
``tests/test_gpu_layouts.py``; rounded to the nearest unit, 0.1667 x 6 would be 1.0002). A share below 1 is held on one
GPU (Ray never splits a fraction across GPUs), so the cluster's total is not the test of whether a layout fits:
:func:`plan_nodes` packs the actors onto the nodes' GPUs one by one (a role's ranks together on one node: their
rendezvous is on rank 0's loopback; the biggest groups first), and the trainer pins every actor to the node it was
given there. A layout that cannot be packed is refused before any actor starts (:class:`PlacementError`), naming
the actor and the resource it lacks on each node.

:func:`gpu_plan` is that plan for a configuration on declared hardware (:class:`Hardware`, the paper presets':
:data:`baselines.planning.presets.HARDWARE`), with the memory each GPU would hold (:mod:`baselines.planning.memory`'s
terms, per actor): what ``mappa train --dry-run`` prints for a preset on a machine without a GPU.

>>> gpu_share(6, 1), gpu_share(9, 8), gpu_share(6, 8)
(0.1666, 0.5, 1.0)
>>> nodes = simulated_nodes(Hardware(nodes=2, gpus_per_node=1, gpu_gib=80))
>>> plan_nodes(nodes, {}, [("engine", "a", 1), ("trainer", "a", 2)], {"CPU": 1, "GPU": 0.5})
{('engine', 'a'): 'node-2', ('trainer', 'a'): 'node-1'}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from baselines.config import TrainConfig
from baselines.planning.checks import _probe_env
from baselines.planning.memory import RANK_RUNTIME_GIB, GiB, _dtype_bytes, _rank_states, activation_bytes
from baselines.ray_learner.cluster import PlacementError, actor_resources
from baselines.weights.lora import DEFAULT_RANK
from baselines.weights.role_weights import WeightSpec, effective_role_weights, owners, role_specs
from baselines.weights.shapes import locate_model, model_shape

GRANULARITY = 1e-4
"""Ray's smallest resource unit (``ray_constants.MIN_RESOURCE_GRANULARITY``): every amount is rounded to it."""
_EPS = 1e-9

Wanted = Sequence[tuple[str, str, int]]
"""The actors to start: (kind ``engine`` or ``trainer``, group, how many), a group's ranks on one node."""


def gpu_share(actors: int, gpus: float) -> float:
    """The share of a GPU each of ``actors`` asks for on ``gpus`` GPUs: 1 when there are enough GPUs, else
    ``1/k`` (``k = ceil(actors / gpus)`` to a GPU) rounded down to :data:`GRANULARITY`."""
    k = math.ceil(actors / gpus) if gpus >= 1 else actors
    units = round(1 / GRANULARITY)
    return 1.0 if k <= 1 else (units // k) / units


def actor_groups(roles: list[str], weights: dict[str, WeightSpec]) -> tuple[dict[str, str], dict[str, int]]:
    """Each role's group (the name of the engine and ranks it uses) and the LoRA roles' ranks.

    >>> from baselines.weights.role_weights import parse_spec
    >>> specs = {r: parse_spec(s) for r, s in [("a", "lora"), ("b", "shared:a"), ("c", "lora:16"), ("d", "frozen")]}
    >>> actor_groups(list(specs), specs)
    ({'a': 'a', 'b': 'a', 'c': 'a', 'd': 'd'}, {'a': 8, 'c': 16})
    """
    owner = owners(weights)
    lora = {r: s.rank or DEFAULT_RANK for r, s in weights.items() if s.kind == "lora"}
    first = next(iter(lora), "")  # no LoRA role: the default is never used
    return {r: first if owner[r] in lora else owner[r] for r in roles}, lora


@dataclass
class Layout:
    """The actors of a run and what each asks Ray for."""

    engine_groups: list[str]
    trained: list[str]
    opts: dict[str, Any]
    """``num_cpus`` and, on GPU, ``num_gpus`` of every actor."""
    wanted: list[tuple[str, str, int]]

    @property
    def per_actor(self) -> dict[str, float]:
        return {"CPU": self.opts["num_cpus"], "GPU": self.opts.get("num_gpus", 0)}


def layout(cfg: TrainConfig, roles: list[str], weights: dict[str, WeightSpec], device: str, gpus: float) -> Layout:
    """Every engine and set of ranks the role-to-weights map asks for, and each actor's request (``gpus``: the
    cluster's; on CPU the actors ask for no CPU: everything shares the cores)."""
    group, _ = actor_groups(roles, weights)
    owner = owners(weights)
    engine_groups = list(dict.fromkeys(group[r] for r in roles))
    trained = list(dict.fromkeys(group[r] for r in roles if weights[owner[r]].kind in ("full", "lora")))
    n = len(engine_groups) + cfg.world_size * len(trained)
    if device == "cuda":
        if gpus < 1:
            raise PlacementError("device='cuda' but the Ray cluster has no GPU")
        opts: dict[str, Any] = {"num_cpus": 1, "num_gpus": gpu_share(n, gpus)}
    else:
        opts = {"num_cpus": 0}
    wanted = [*(("engine", g, 1) for g in engine_groups), *(("trainer", g, cfg.world_size) for g in trained)]
    return Layout(engine_groups, trained, opts, wanted)


# ----------------------------------------------------------------------------------------------- packing
@dataclass
class _Node:
    id: str
    free: dict[str, float]
    """Every resource but GPU, what is left."""
    gpus: list[float]
    """What is left of each GPU."""
    label: str = ""

    def gpu_room(self, share: float) -> int:
        """How many more actors asking ``share`` of a GPU fit."""
        if share <= 0:
            return 10**9
        return sum(math.floor((left + _EPS) / share) for left in self.gpus)

    def shortfall(self, needs: Mapping[str, float], n: int) -> list[str]:
        out = []
        for name, amount in needs.items():
            if name == "GPU":
                if self.gpu_room(amount) < n:
                    left = ", ".join(f"{abs(round(x, 4)):g}" for x in self.gpus) or "none"
                    out.append(f"GPU {amount:g} x {n} (on one GPU each): its GPUs have {left} left")
            elif self.free.get(name, 0.0) + _EPS < amount * n:
                have = self.free.get(name)
                out.append(f"{name} {amount * n:g}: " + ("not offered" if have is None else f"{round(have, 4):g} left"))
        return out

    def take(self, needs: Mapping[str, float], n: int) -> list[int]:
        """Reserve ``n`` actors; returns the GPU index each got (-1: no GPU)."""
        for name, amount in needs.items():
            if name != "GPU":
                self.free[name] = self.free.get(name, 0.0) - amount * n
        share, got = needs.get("GPU", 0.0), []
        for _ in range(n):
            i = next((i for i, left in enumerate(self.gpus) if left + _EPS >= share), -1) if share > 0 else -1
            if i >= 0:
                self.gpus[i] -= share
            got.append(i)
        return got


def _nodes(nodes: Sequence[Mapping[str, Any]]) -> list[_Node]:
    out = []
    for node in nodes:
        res = {k: float(v) for k, v in node.get("Resources", {}).items() if not k.startswith("node:")}
        gpus = [1.0] * round(res.pop("GPU", 0.0))
        custom = sorted(k for k in res if k not in ("CPU", "memory", "object_store_memory", "accelerator_type"))
        out.append(_Node(node["NodeID"], res, gpus, label=",".join(custom)))
    return out


def pack(
    nodes: Sequence[Mapping[str, Any]], placement: Mapping[str, str], wanted: Wanted, per_actor: Mapping[str, float]
) -> dict[tuple[str, str], tuple[str, list[int]]]:
    """Each (kind, group)'s node and the GPU index of each of its actors, packed first-fit in node order, the
    groups with the most actors first. Raises :class:`PlacementError` naming every actor that finds no room and,
    per node, the resource it lacks there."""
    state = _nodes(nodes)
    order = sorted(wanted, key=lambda w: -w[2])  # stable: engines before ranks of the same size
    placed, problems = {}, []
    for kind, group, n in order:
        needs = {k: v for k, v in {**per_actor, **actor_resources(placement, kind, group)}.items() if v > 0}
        node = next((s for s in state if not s.shortfall(needs, n)), None)
        if node is not None:
            placed[(kind, group)] = (node.id, node.take(needs, n))
            continue
        what = f"{kind}:{group}" + (f" ({n} ranks, on one node)" if kind == "trainer" else "")
        asks = ", ".join(f"{k} {v:g}" for k, v in needs.items())
        lacks = "; ".join(f"{s.label or s.id[:8]}: " + ", ".join(s.shortfall(needs, n)) for s in state)
        problems.append(f"{what} asks for {asks} each; no node has room ({lacks or 'no live node'})")
    if problems:
        raise PlacementError(
            "the Ray cluster cannot place this run's actors:\n" + "\n".join(f"- {p}" for p in problems)
        )
    return {w[:2]: placed[w[:2]] for w in wanted}


def plan_nodes(
    nodes: Sequence[Mapping[str, Any]], placement: Mapping[str, str], wanted: Wanted, per_actor: Mapping[str, float]
) -> dict[tuple[str, str], str]:
    """Each (kind, group)'s node (:func:`pack`): where the trainer pins its actors on GPU."""
    return {key: node for key, (node, _) in pack(nodes, placement, wanted, per_actor).items()}


# ----------------------------------------------------------------------------------------------- hardware
@dataclass(frozen=True)
class Hardware:
    """GPU hardware a configuration is planned for (no GPU needed to plan)."""

    nodes: int
    gpus_per_node: int
    gpu_gib: float
    cpus_per_node: int = 32
    source: str = ""
    """Where the figures come from (an assumption, when the reference does not say)."""

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPUs of {self.gpu_gib:g} GiB"


def simulated_nodes(hw: Hardware, resources: Sequence[Mapping[str, float]] = ()) -> list[dict[str, Any]]:
    """Nodes in ``ray.nodes()``'s form for ``hw`` (``resources``: each node's custom resources, in order)."""
    out = []
    for i in range(hw.nodes):
        res = {"CPU": float(hw.cpus_per_node), "GPU": float(hw.gpus_per_node)}
        res.update(resources[i] if i < len(resources) else {})
        out.append({"NodeID": f"node-{i + 1}", "Alive": True, "Resources": res})
    return out


@dataclass
class GpuPlan:
    """The actors of a run on declared hardware, each with its node, GPU and estimated memory."""

    hardware: Hardware
    share: float
    actors: list[dict[str, Any]] = field(default_factory=list)
    """``name``, ``node``, ``gpu``, ``gib`` and ``what`` (the terms of ``gib``) per actor."""
    per_gpu: dict[tuple[str, int], float] = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.error is None and all(g <= self.hardware.gpu_gib for g in self.per_gpu.values())


def _actor_gib(cfg: TrainConfig, shape: Any, hw: Hardware, lora: bool) -> tuple[float, float, float]:
    """GiB of one engine, of one rank's states and of one rank's activations on GPU (:mod:`baselines.planning.memory`'s
    terms: an engine takes ``gpu_memory_utilization`` of its GPU; a rank its share of the role's ZeRO states plus
    one micro-batch's activations)."""
    b = _dtype_bytes(cfg.resolved_dtype())
    W = max(1, cfg.world_size)
    act = activation_bytes(shape, cfg, b, checkpointing=cfg.gradient_checkpointing)
    if lora:
        states = shape.params * b + RANK_RUNTIME_GIB * GiB
    else:
        states = sum(_rank_states(cfg, shape.params, b).values()) / W
    return cfg.gpu_memory_utilization * hw.gpu_gib, states / GiB, act / GiB


def gpu_plan(
    cfg: TrainConfig, roles: list[str], hw: Hardware, shape: Any, resources: Sequence[Mapping[str, float]] = ()
) -> GpuPlan:
    """``cfg`` on ``hw`` as the trainer would lay it out on GPU (``cfg.device`` is taken as 'cuda'): each actor's
    share, node and GPU (:func:`pack`, the trainer's packing), its estimated memory, and per node the heaviest
    actors that may share a GPU (which actors share one within a node is Ray's choice) against a GPU's memory."""
    cfg = replace(cfg, device="cuda")
    weights = role_specs(effective_role_weights(cfg, roles), roles, cfg.trainer)
    _, lora = actor_groups(roles, weights)
    lay = layout(cfg, roles, weights, "cuda", hw.nodes * hw.gpus_per_node)
    plan = GpuPlan(hw, lay.opts["num_gpus"])
    try:
        placed = pack(simulated_nodes(hw, resources), cfg.placement, lay.wanted, lay.per_actor)
    except PlacementError as err:
        plan.error = str(err)
        return plan
    lora_group = next(iter(lora), None)
    for kind, group, _ in lay.wanted:
        engine_gib, states, act = _actor_gib(cfg, shape, hw, lora=group == lora_group)
        node, gpus = placed[(kind, group)]
        for i, gpu in enumerate(gpus):
            if kind == "engine":
                a = {"name": f"engine:{group}", "gib": engine_gib, "what": "gpu_memory_utilization"}
            else:
                a = {"name": f"trainer:{group}:{i}", "gib": states + act}
                a["what"] = f"ZeRO states {states:.1f} + activations {act:.1f}"
            plan.actors.append({**a, "node": node, "gpu": gpu})
    k = max(1, round(1 / plan.share))
    for node in dict.fromkeys(a["node"] for a in plan.actors):
        heaviest = sorted((a["gib"] for a in plan.actors if a["node"] == node), reverse=True)[:k]
        plan.per_gpu[(node, k)] = sum(heaviest)
    plan.notes.append(
        f"{cfg.resolved_dtype()}, ZeRO stage {cfg.zero_stage}, world size {cfg.world_size}, "
        f"gpu_memory_utilization {cfg.gpu_memory_utilization}; GPU figures not calibrated by a measurement"
    )
    return plan


def format_plan(plan: GpuPlan) -> str:
    """The plan's lines: the hardware, each actor's node, GPU, share and memory, and per node the worst GPU."""
    hw = plan.hardware
    lines = [f"hardware: {hw.describe()}" + (f" ({hw.source})" if hw.source else "")]
    if plan.error:
        return "\n".join([*lines, plan.error])
    k = max(1, round(1 / plan.share))
    lines.append(f"every actor asks for {plan.share:g} GPU and 1 CPU: up to {k} actor(s) per GPU")
    for a in plan.actors:
        lines.append(f"  {a['name']:<28} {a['node']:<8} GPU {a['gpu']}  ~{a['gib']:6.1f} GiB ({a['what']})")
    for (node, k), gib in plan.per_gpu.items():
        verdict = "fits" if gib <= hw.gpu_gib else "DOES NOT FIT"
        lines.append(f"  {node}: the heaviest {k} actor(s) on one GPU ~{gib:.1f} GiB of {hw.gpu_gib:g}: {verdict}")
    lines += [f"  ({note})" for note in plan.notes]
    return "\n".join(lines)


def smallest_fitting_world_size(cfg: TrainConfig, roles: list[str], hw: Hardware, shape: Any) -> int | None:
    """The smallest ``world_size`` whose plan on ``hw`` fits (None: none up to the hardware's GPUs)."""
    for w in range(1, hw.nodes * hw.gpus_per_node + 1):
        if gpu_plan(replace(cfg, world_size=w), roles, hw, shape).fits:
            return w
    return None


def task_roles(cfg: TrainConfig) -> tuple[list[str], str]:
    """The training task's roles, and how they were found: its environment as configured, else as built with
    its default arguments (the original DSBench needs its data on disk; its roles do not)."""
    for kwargs, how in ((cfg.env_kwargs, ""), ({}, f"the roles of {cfg.env_id} with its default arguments")):
        try:
            return _probe_env(cfg.env_id, kwargs)[0], how
        except Exception:  # the next way, or 3 roles assumed
            continue
    return ["role_1", "role_2", "role_3"], "3 roles assumed: the environment could not be built"


def plan_report(cfg: TrainConfig, hw: Hardware) -> str:
    """:func:`format_plan` of ``cfg`` on ``hw`` for the task's roles and the model's shape, and, when it does not
    fit, the smallest ``--world-size`` that would."""
    try:
        folder = locate_model(cfg.model)[0]
    except FileNotFoundError:
        folder = None
    shape = model_shape(cfg.model, folder)
    if shape is None:
        return f"not planned: the shape of {cfg.model!r} is unknown (no config.json)"
    roles, how = task_roles(cfg)
    try:
        plan = gpu_plan(cfg, roles, hw, shape)
    except ValueError as err:  # role weights the checks above refuse
        return f"not planned: {err}"
    if how:
        plan.notes.append(how)
    lines = [format_plan(plan)]
    if not plan.fits:
        w = smallest_fitting_world_size(cfg, roles, hw, shape)
        lines.append(
            f"does not fit as configured; fits with --world-size {w}"
            if w
            else "does not fit with any --world-size on this hardware: more or larger GPUs, or a smaller model"
        )
    return "\n".join(lines)
