"""Issue 34: the GPU layout of the distributed trainer without a GPU (baselines/planning/gpu_plan.py): shares of a GPU
that Ray can pack, the packing and its refusals, the plan of the paper presets on their declared hardware as
`mappa train --dry-run` prints it, and the GPU branches that run without CUDA (device strings, dtypes, NCCL or
gloo, the actors' environment), with the device forced. Fast: no Ray, no model loaded."""

from __future__ import annotations

import json

import pytest

from baselines.config import TrainConfig
from baselines.planning import memory
from baselines.planning.gpu_plan import (
    GRANULARITY,
    Hardware,
    gpu_plan,
    gpu_share,
    layout,
    pack,
    simulated_nodes,
    task_roles,
)
from baselines.planning.presets import HARDWARE, PRESETS, preset
from baselines.ray_learner.cluster import PlacementError, actor_env
from baselines.ray_learner.distributed import rank_device
from baselines.weights.dtypes import resolve_engine_dtype
from baselines.weights.role_weights import effective_role_weights, role_specs
from baselines.weights.shapes import model_shape
from benchmarks import cli
from benchmarks.commands import train as train_command

PAPER = [name for name in PRESETS if name.startswith("paper-")]
TWO_BY_FOUR = Hardware(nodes=2, gpus_per_node=4, gpu_gib=80)
ONE_BY_EIGHT = Hardware(nodes=1, gpus_per_node=8, gpu_gib=80)


def _layout(cfg: TrainConfig, gpus: float):
    roles, _ = task_roles(cfg)
    weights = role_specs(effective_role_weights(cfg, roles), roles, cfg.trainer)
    return layout(cfg, roles, weights, "cuda", gpus)


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("actors", range(1, 40))
def test_every_share_packs_on_the_gpus_ray_rounds_it_to(actors, gpus):
    share = gpu_share(actors, gpus)
    per_gpu = -(-actors // gpus)
    assert (share == 1.0) == (actors <= gpus)
    # Ray keeps amounts in units of 0.0001: the share as Ray holds it, times the actors on a GPU, is at most 1
    units = round(share / GRANULARITY)
    assert units * per_gpu <= round(1 / GRANULARITY)
    assert per_gpu * share <= 1 + 1e-12


def test_one_sixth_is_rounded_down_not_to_the_nearest():
    assert gpu_share(6, 1) == pytest.approx(0.1666) and round(1 / 6, 4) * 6 > 1  # 0.1667 x 6 would not fit


@pytest.mark.parametrize("hw", [TWO_BY_FOUR, ONE_BY_EIGHT], ids=["2x4", "1x8"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("name", PAPER)
def test_paper_presets_pack_on_two_by_four_and_one_by_eight(name, world_size, hw):
    cfg = preset(name, device="cuda", world_size=world_size)
    lay = _layout(cfg, hw.nodes * hw.gpus_per_node)
    placed = pack(simulated_nodes(hw), {}, lay.wanted, lay.per_actor)
    assert set(placed) == {(k, g) for k, g, _ in lay.wanted}
    share = lay.opts["num_gpus"]
    used: dict[tuple[str, int], float] = {}
    for kind, group, n in lay.wanted:
        node, gpus = placed[(kind, group)]
        assert len(gpus) == n and all(0 <= g < hw.gpus_per_node for g in gpus)
        for g in gpus:
            used[(node, g)] = used.get((node, g), 0.0) + share
    assert max(used.values()) <= 1 + 1e-9


def test_a_role_whose_ranks_fit_no_single_node_is_refused_naming_the_actor_and_the_resource():
    cfg = preset("paper-mathchat-4b", device="cuda", world_size=6)
    lay = _layout(cfg, 8)  # 3 + 18 actors on 8 GPUs: a third of a GPU each; 6 ranks need 2 GPUs of a node
    hw = Hardware(nodes=8, gpus_per_node=1, gpu_gib=80)
    with pytest.raises(PlacementError) as err:
        pack(simulated_nodes(hw), {}, lay.wanted, lay.per_actor)
    text = str(err.value)
    assert "trainer:problem_solver (6 ranks, on one node) asks for CPU 1, GPU 0.3333 each" in text
    assert "GPU 0.3333 x 6 (on one GPU each): its GPUs have 1 left" in text


def test_a_placement_resource_no_node_offers_is_named():
    cfg = preset("paper-mathchat-4b", device="cuda", placement={"engine:verifier": "big"})
    lay = _layout(cfg, 8)
    with pytest.raises(PlacementError, match=r"engine:verifier asks for CPU 1, GPU 1, big 0.001 each.*big 0.001: "):
        pack(simulated_nodes(ONE_BY_EIGHT), cfg.placement, lay.wanted, lay.per_actor)


def test_cuda_without_gpus_is_refused():
    with pytest.raises(PlacementError, match="no GPU"):
        _layout(preset("smoke", device="cuda"), 0)


def test_on_cpu_the_actors_ask_for_no_cpu_and_no_gpu():
    cfg = preset("smoke", device="cpu")
    roles, _ = task_roles(cfg)
    lay = layout(cfg, roles, role_specs(effective_role_weights(cfg, roles), roles, "ray"), "cpu", 0)
    assert lay.opts == {"num_cpus": 0} and lay.per_actor == {"CPU": 0, "GPU": 0}


# ------------------------------------------------------------------------------------ the GPU branches, forced
def test_the_gpu_branches_with_the_device_forced(monkeypatch):
    monkeypatch.delenv("MAPPA_ACTOR_LOG_DIR", raising=False)
    gpu, cpu = TrainConfig(device="cuda"), TrainConfig(device="cpu", engine_kv_cache_gb=3.4)
    assert gpu.resolved_dtype() == "bfloat16" and cpu.resolved_dtype() == "float32"
    assert gpu.resolved_engine_dtype() == "bfloat16"
    assert resolve_engine_dtype("auto", "cuda", "float32") == "bfloat16"
    assert resolve_engine_dtype("float16", "cuda", "bfloat16") == "float16"
    assert rank_device("cuda") == ("nccl", "cuda:0") and rank_device("cpu") == ("gloo", "cpu")
    env = actor_env(gpu)
    assert env["DS_ACCELERATOR"] == "cuda" and "VLLM_CPU_KVCACHE_SPACE" not in env and "OMP_NUM_THREADS" not in env
    env = actor_env(cpu)
    assert env["DS_ACCELERATOR"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"


# ------------------------------------------------------------------------------------ the plan and --dry-run
def test_the_paper_presets_plan_on_their_declared_hardware():
    for name in PAPER:
        cfg = PRESETS[name]
        roles, _ = task_roles(cfg)
        plan = gpu_plan(cfg, roles, HARDWARE[name], model_shape(cfg.model))
        assert plan.error is None and len(plan.actors) == 6 and plan.share == 1.0
        engines = [a for a in plan.actors if a["name"].startswith("engine:")]
        assert [a["gib"] for a in engines] == [cfg.gpu_memory_utilization * HARDWARE[name].gpu_gib] * 3
        assert len({(a["node"], a["gpu"]) for a in plan.actors}) == 6  # one GPU each


@pytest.fixture
def dry_run(monkeypatch, tmp_path, capsys):
    """``mappa train --dry-run`` here, with a fixed memory budget, an empty model cache, and the GPUs that
    nvidia-smi would report (none unless given)."""
    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "24")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(train_command, "_trainer", lambda cfg: pytest.fail("--dry-run must not build a trainer"))

    def run(*argv: str, gpus: list[float] | None = None) -> tuple[int, str]:
        monkeypatch.setattr(memory, "_gpu_memory", lambda: list(gpus or []))
        rc = cli.main(["train", *argv, "--dry-run"])
        out = capsys.readouterr().out
        json.loads(out.splitlines()[0])
        return rc, out

    return run


def test_dry_run_of_a_paper_preset_without_a_gpu_prints_its_gpu_plan(dry_run):
    rc, out = dry_run("--preset", "paper-mathchat-4b")
    assert rc == 1 and "Traceback" not in out  # the model is not on disk here
    assert "this machine has no GPU" in out
    assert "GPU plan on the preset's declared hardware:" in out
    assert "hardware: 1 node(s) x 8 GPUs of 80 GiB (assumed:" in out
    assert "every actor asks for 1 GPU and 1 CPU: up to 1 actor(s) per GPU" in out
    for role in ("problem_solver", "code_executor", "verifier"):
        assert f"engine:{role}" in out and f"trainer:{role}:0" in out


def test_dry_run_on_a_gpu_machine_plans_on_its_gpus(dry_run):
    _, out = dry_run("--preset", "paper-mathchat-1.5b", "--world-size", "2", gpus=[80.0] * 4)
    assert "GPU plan on this machine's GPUs:" in out and "1 node(s) x 4 GPUs of 80 GiB (this machine" in out
    assert "this machine has no GPU" not in out
    assert "every actor asks for 0.3333 GPU and 1 CPU: up to 3 actor(s) per GPU" in out  # 9 actors on 4 GPUs


def test_dry_run_of_a_cpu_preset_on_a_cpu_machine_prints_no_gpu_plan(dry_run):
    _, out = dry_run("--preset", "smoke")
    assert "GPU plan" not in out


def test_dry_run_with_role_weights_the_checks_refuse_says_the_plan_is_not_made(dry_run):
    rc, out = dry_run("--preset", "paper-mathchat-4b", "--role-weights", "critic=frozen")
    assert rc == 1 and "Traceback" not in out
    assert "GPU plan on the preset's declared hardware:\nnot planned: role_weights: " in out


def test_the_gpu_checks_result_file_says_what_ran_and_how_it_failed(tmp_path):
    """``benchmarks/gpu_check.py``'s result file (what to send back after the first GPU run): provenance, the
    configuration, each iteration's figures and, when it fails, the error with its traceback; plain JSON."""
    import json

    from baselines.config import TrainConfig
    from benchmarks.gpu_check import SCHEMA, check_record

    cfg = TrainConfig(out_dir=str(tmp_path / "run"), device="cuda")
    rows = [{"iteration": 1, "gen_tok_s": 900.0}]
    ok = check_record(["--iterations", "1"], cfg, rows, startup_s=12.34, total_s=60.0, gpu="H200, 1 MiB, 2 MiB")
    assert ok["schema"] == SCHEMA and ok["status"] == "ok" and "error" not in ok
    assert ok["command"] == "python benchmarks/gpu_check.py --iterations 1" and ok["code_version"]
    assert ok["config"]["device"] == "cuda" and ok["iterations"] == rows and ok["startup_s"] == 12.3
    assert ok["logs"] == str(tmp_path / "run" / "logs") and "platform" in ok["hardware"]
    try:
        raise RuntimeError("NCCL error: unhandled system error")
    except RuntimeError as e:
        failed = check_record([], cfg, [], startup_s=None, total_s=5.0, gpu="", error=e)
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: NCCL error: unhandled system error"
    assert "test_the_gpu_checks_result_file" in failed["traceback"]  # the frames, not only the message
    assert json.loads(json.dumps(failed)) == failed
