"""Issue 34, item 1: the paper presets' actors scheduled on simulated GPU clusters (Ray's own cluster utility: CPU-only
raylets that declare GPUs), through the trainer's real code path (:func:`baselines.training.actors.start_actors`: its
layout, checks, packing, node pinning and rank start-up), with the engine and rank classes replaced by placeholders
that report what Ray gave them: node, GPU share, GPU ids and ``CUDA_VISIBLE_DEVICES``. A layout that cannot be
packed is refused before any actor starts, naming the actor and the resource."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from baselines.planning.gpu_plan import gpu_share, layout, task_roles
from baselines.planning.presets import preset
from baselines.ray_learner.cluster import PlacementError, _live_nodes
from baselines.training import actors as actors_module
from baselines.weights.role_weights import effective_role_weights, role_specs

pytestmark = pytest.mark.slow

if importlib.util.find_spec("ray") is None:
    pytest.skip("needs ray (make setup)", allow_module_level=True)


ROOT = Path(__file__).resolve().parents[1]
PAPER = ["paper-mathchat-1.5b", "paper-mathchat-4b", "paper-dsbench-4b"]
LAYOUTS = {
    # name: each node's (GPUs, custom resources)
    "2x4": [(4, {"gen": 1}), (4, {"learn": 1})],
    "1x8": [(8, {})],
    "1x1": [(1, {})],  # benchmarks/gpu_check.py's: three roles' engines and ranks on one GPU
}


class _Placed:
    """A placeholder actor: records what Ray gave it (the real classes load models)."""

    def __init__(self, *args, **kwargs):
        import os

        import ray

        ctx = ray.get_runtime_context()
        self.seen = {
            "node": ctx.get_node_id(),
            "resources": ctx.get_assigned_resources(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device": kwargs.get("device"),
            "dtype": kwargs.get("dtype"),
        }

    def ready(self) -> str:
        return self.seen["node"]

    def where(self) -> dict:
        return self.seen

    def reset(self, *args, **kwargs) -> float:  # every run resets its engines (baselines.training.pool)
        return 0.0


@pytest.fixture(scope="module", params=list(LAYOUTS))
def cluster(request):
    """A simulated cluster of :data:`LAYOUTS`, the driver connected to it."""
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    store = 80 * 1024**2
    (gpus, res), *others = LAYOUTS[request.param]
    head = {"num_cpus": 16, "num_gpus": gpus, "resources": res, "object_store_memory": store}
    # its own temp dir (not the /tmp/ray of other Ray users on this machine), no dashboard
    temp = tempfile.mkdtemp(prefix="rgl-", dir="/tmp")
    head.update(temp_dir=temp, include_dashboard=False)
    c = Cluster(initialize_head=True, head_node_args=head)
    for gpus, res in others:
        c.add_node(num_cpus=16, num_gpus=gpus, resources=res, object_store_memory=store)
    c.wait_for_nodes()
    ray.init(address=c.address, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}, log_to_driver=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the placeholder class travels by value
    try:
        yield request.param, ray
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


class _Recording:
    """``ray`` as :func:`start_actors` sees it, recording every actor class it declares."""

    def __init__(self, ray):
        self._ray, self.declared = ray, []

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def remote(self, cls):
        self.declared.append(cls)
        return self._ray.remote(cls)


def _start(ray, cfg, monkeypatch, tmp_path, rec: _Recording | None = None):
    """:func:`start_actors` of ``cfg`` with placeholder engines and ranks (``rec``: records the actor classes it
    declares); returns what it started, the roles and the weights."""
    for name in ("VLLMEngine", "RoleWorker", "LoraWorker"):
        monkeypatch.setattr(actors_module, name, _Placed)
    roles, _ = task_roles(cfg)
    weights = role_specs(effective_role_weights(cfg, roles), roles, cfg.trainer)
    paths = dict.fromkeys(roles, "unused")
    started = actors_module.start_actors(rec or ray, cfg, roles, weights, paths, "bfloat16", "cuda", tmp_path)
    return started, roles, weights


def _stop(ray, started) -> None:
    handles = {id(e): e for e in started.engines.values()}
    for ws in started.workers.values():
        handles.update({id(w): w for w in ws})
    for h in handles.values():
        ray.kill(h)
    total = ray.cluster_resources().get("GPU", 0)
    deadline = time.monotonic() + 60
    while ray.available_resources().get("GPU", 0) < total - 1e-6 and time.monotonic() < deadline:
        time.sleep(0.5)


def _cases():
    out = [(name, {}) for name in PAPER]
    out.append(("paper-mathchat-4b", {"world_size": 2}))  # 9 actors on 8 GPUs: half a GPU each
    return out


def _check_layout(ray, layout_name, cfg, started, roles, weights) -> None:
    lay = layout(cfg, roles, weights, "cuda", ray.cluster_resources()["GPU"])
    # what the actors must satisfy wherever they land, checked without the packer (baselines/planning/gpu_plan.pack):
    # the GPU share each, one node per role's ranks, no GPU and no node holding more than it has, and the run's
    # placement.json naming the node Ray put each actor on
    node_gpus = {n["NodeID"]: round(n["Resources"].get("GPU", 0)) for n in _live_nodes(ray)}
    share = lay.opts["num_gpus"]
    per_gpu: dict[tuple[str, str], int] = {}
    per_node: dict[str, float] = {}
    nodes_of: dict[str, set[str]] = {}
    for kind, group, n in lay.wanted:
        if kind == "engine":
            handles = [started.engines[group]]
        else:
            handles = started.workers[group]
        assert len(handles) == n
        seen = ray.get([h.where.remote() for h in handles])
        nodes_of[f"{kind}:{group}"] = {s["node"] for s in seen}
        for s in seen:
            per_node[s["node"]] = per_node.get(s["node"], 0.0) + share
            assert s["resources"]["GPU"] == pytest.approx(share) and s["resources"]["CPU"] == 1
            assert len(s["gpu_ids"]) == 1 and s["cuda_visible_devices"] == s["gpu_ids"][0]
            assert 0 <= int(s["gpu_ids"][0]) < node_gpus[s["node"]]
            per_gpu[(s["node"], s["gpu_ids"][0])] = per_gpu.get((s["node"], s["gpu_ids"][0]), 0) + 1
            if kind == "engine":
                assert s["device"] == "cuda" and s["dtype"] == "bfloat16"
        assert len({s["node"] for s in seen}) == 1  # a role's ranks on one node: rendezvous on rank 0's loopback
    assert max(per_gpu.values()) <= round(1 / share)  # never more actors on a GPU than the share allows
    assert all(per_node[n] <= node_gpus[n] + 1e-9 for n in per_node), (per_node, node_gpus)
    written = json.loads((Path(cfg.out_dir) / "placement.json").read_text())
    for name, nodes in nodes_of.items():
        recorded = {v for k, v in written["actors"].items() if k == name or k.startswith(name + ":")}
        assert recorded == nodes, (name, recorded, nodes)


@pytest.mark.parametrize(("name", "overrides"), _cases(), ids=lambda x: x if isinstance(x, str) else str(x or ""))
def test_paper_presets_are_scheduled_on_a_simulated_cluster(cluster, name, overrides, monkeypatch, tmp_path):
    layout_name, ray = cluster
    cfg = preset(name, device="cuda", out_dir=str(tmp_path), **overrides)
    started, roles, weights = _start(ray, cfg, monkeypatch, tmp_path)
    try:
        _check_layout(ray, layout_name, cfg, started, roles, weights)
        assert (tmp_path / "placement.json").exists()
    finally:
        _stop(ray, started)


def test_placed_engines_and_ranks_land_on_the_nodes_offering_their_resources(cluster, monkeypatch, tmp_path):
    layout_name, ray = cluster
    if layout_name != "2x4":
        pytest.skip("needs the two-node layout")
    cfg = preset(
        "paper-mathchat-4b", device="cuda", out_dir=str(tmp_path), placement={"engines": "gen", "trainers": "learn"}
    )
    cfg = dataclasses.replace(cfg, world_size=2)
    started, roles, weights = _start(ray, cfg, monkeypatch, tmp_path)
    try:
        _check_layout(ray, layout_name, cfg, started, roles, weights)
        node_of = {r: n["NodeID"] for n in _live_nodes(ray) for r in ("gen", "learn") if r in n["Resources"]}
        assert {ray.get(e.ready.remote()) for e in started.engines.values()} == {node_of["gen"]}
        ranks = [w for ws in started.workers.values() for w in ws]
        assert {ray.get(w.ready.remote()) for w in ranks} == {node_of["learn"]}
    finally:
        _stop(ray, started)


def test_a_layout_that_cannot_be_packed_is_refused_before_any_actor_starts(cluster, monkeypatch, tmp_path):
    layout_name, ray = cluster
    if layout_name != "2x4":
        pytest.skip("needs the two-node layout")
    # 3 engines + 3 x 4 ranks = 15 actors at half a GPU: 7.5 of the cluster's 8 GPUs, but the ranks are placed on
    # the one node offering `learn`, whose 4 GPUs hold 8 of their 12
    cfg = preset(
        "paper-mathchat-4b", device="cuda", out_dir=str(tmp_path), world_size=4, placement={"trainers": "learn"}
    )
    rec = _Recording(ray)
    with pytest.raises(PlacementError) as err:
        _start(ray, cfg, monkeypatch, tmp_path, rec)
    text = str(err.value)
    assert "trainer:verifier (4 ranks, on one node) asks for CPU 1, GPU 0.5, learn 0.001 each" in text
    assert "GPU 0.5 x 4 (on one GPU each): its GPUs have 0, 0, 0, 0 left" in text
    assert "learn 0.004: not offered" in text
    assert rec.declared == []  # refused before any actor class was declared, let alone started
    assert ray.available_resources().get("GPU", 0) == ray.cluster_resources()["GPU"]
    assert not (tmp_path / "placement.json").exists()
    # a resource no node offers: named with the actors that ask for it
    cfg = dataclasses.replace(cfg, world_size=1, placement={"trainers": "gpu_node"})
    with pytest.raises(PlacementError, match=r"gpu_node: the actors need 0.003, no node offers it \(asked for by "):
        _start(ray, cfg, monkeypatch, tmp_path, rec)
    assert rec.declared == []


def test_the_share_puts_exactly_k_actors_on_one_gpu(cluster):
    """:func:`gpu_share` for six actors on one GPU: all six are placed, and a seventh asking the same share waits
    (the share is what caps how many actors share a GPU). Ray 2.60 also places six of an unrounded ``1/6``: the
    rounding down is for Ray versions that round to the nearest unit (0.1667 x 6 > 1)."""
    layout_name, ray = cluster
    if layout_name != "1x1":
        pytest.skip("the one-GPU layout")
    for share, n, fit in ((gpu_share(6, 1), 7, 6), (1 / 6, 6, 6)):
        placed = [ray.remote(_Placed).options(num_cpus=1, num_gpus=share).remote() for _ in range(n)]
        try:
            ready, pending = ray.wait([a.ready.remote() for a in placed], num_returns=fit, timeout=180)
            assert len(ready) == fit, share
            if pending:  # the seventh: still not placed once the six are up
                assert not ray.wait(pending, timeout=10)[0]
        finally:
            for a in placed:
                ray.kill(a)
        deadline = time.monotonic() + 60
        while ray.available_resources().get("GPU", 0) < 1 - 1e-6 and time.monotonic() < deadline:
            time.sleep(0.5)
