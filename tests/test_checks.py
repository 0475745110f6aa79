"""Pre-flight checks (baselines/planning/checks.py) and `mappa train --dry-run`: fast, no Ray, no model loaded."""

from __future__ import annotations

import dataclasses
import json

import pytest

from baselines.config import TrainConfig
from baselines.planning import checks
from baselines.planning.checks import check_config, format_checks, raise_for_failed
from baselines.planning.memory import estimate_memory
from baselines.planning.presets import PRESETS, preset
from baselines.weights.shapes import KNOWN_CONFIGS, count_parameters, model_shape
from benchmarks import cli
from benchmarks.commands import train as train_command


@pytest.fixture(autouse=True)
def _budget(monkeypatch, tmp_path):
    """A fixed memory budget (the machine's MemAvailable varies), and an empty Hugging Face cache: the paper
    models are never on disk in these tests."""
    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "24")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))

    def no_trainer(cfg):
        raise AssertionError("--dry-run must not build a trainer")

    monkeypatch.setattr(train_command, "_trainer", no_trainer)


def by_name(cs: list[checks.Check]) -> dict[str, checks.Check]:
    return {c.name: c for c in cs}


def dry_run(capsys, *argv: str) -> tuple[int, str, dict]:
    rc = cli.main(["train", *argv, "--dry-run"])
    out = capsys.readouterr().out
    return rc, out, json.loads(out.splitlines()[0])


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_dry_run_exits_0_or_1_with_reasons(capsys, name):
    rc, out, cfg = dry_run(capsys, "--preset", name)
    assert cfg["out_dir"] == PRESETS[name].out_dir
    assert "checks:" in out and "memory" in out and "Traceback" not in out
    if rc == 0:
        assert "FAIL" not in out and "can run here" in out
    else:
        assert rc == 1 and "FAIL" in out and "cannot run here" in out


@pytest.mark.parametrize("name", ["paper-mathchat-1.5b", "paper-mathchat-4b", "paper-dsbench-4b"])
def test_paper_presets_report_the_missing_model(capsys, name):
    rc, out, _ = dry_run(capsys, "--preset", name)
    assert rc == 1
    model = by_name(check_config(PRESETS[name]))["model"]
    assert not model.ok and PRESETS[name].model in model.detail and "not on disk" in model.detail
    assert f"- model: model {PRESETS[name].model!r} is not on disk" in out
    # no silent fall-back: the estimate is still of the named model (its built-in shape)
    mem = by_name(check_config(PRESETS[name]))["memory"]
    assert mem.data is not None and mem.data.notes[0].startswith(f"{model_shape(PRESETS[name].model).params // 10**6}M")


def test_original_dsbench_without_data_dir_is_a_failed_check_not_a_traceback(capsys):
    cs = by_name(check_config(PRESETS["paper-dsbench-4b"]))
    assert not cs["tasks"].ok and "data_dir" in cs["tasks"].detail and "--env-arg data_dir=" in cs["tasks"].detail
    assert not cs["eval"].ok


def test_paper_mathchat_pool_and_schedule():
    cs = by_name(check_config(PRESETS["paper-mathchat-4b"]))
    assert cs["tasks"].ok and cs["tasks"].detail.startswith("512 tasks")
    assert "128 iterations = 8.00 passes" in cs["tasks"].detail
    assert cs["eval"].ok and "32 of the 32 tasks of 'aime-eval-32'" in cs["eval"].detail


def test_grpo_needs_two_samples_per_prompt(capsys):
    cs = check_config(preset("smoke", estimator="grpo", samples_per_prompt=1))
    assert not by_name(cs)["estimator"].ok and "samples_per_prompt >= 2" in by_name(cs)["estimator"].detail
    with pytest.raises(ValueError, match="grpo needs samples_per_prompt >= 2"):
        raise_for_failed(cs)
    assert by_name(check_config(preset("smoke", estimator="grpo", samples_per_prompt=2)))["estimator"].ok
    rc, out, _ = dry_run(capsys, "--preset", "smoke", "--estimator", "grpo", "--samples-per-prompt", "1")
    assert rc == 1 and "- estimator: grpo needs" in out


def test_unknown_options_fail_together():
    cfg = preset("smoke", estimator="ppo", advantage_scope="batch", truncated="drop", trainer="jax")
    cs = by_name(check_config(cfg))
    assert not cs["estimator"].ok and "unknown advantage estimator 'ppo'" in cs["estimator"].detail
    for word in ("advantage_scope", "truncated", "trainer must be"):
        assert word in cs["options"].detail
    with pytest.raises(ValueError) as err:
        raise_for_failed(list(cs.values()))
    assert "- estimator:" in str(err.value) and "- options:" in str(err.value)


def test_too_many_prompts_per_iteration():
    cs = by_name(check_config(preset("smoke", prompts_per_iteration=10_000)))
    assert not cs["tasks"].ok and "prompts_per_iteration=10000 > 512 tasks" in cs["tasks"].detail
    # the caller's own probe is used when given
    assert not by_name(check_config(preset("smoke"), roles=["a"], n_tasks=1))["tasks"].ok


def test_smollm2_parameter_count_matches_torch():
    assert count_parameters(KNOWN_CONFIGS["smollm2-135m"]) == 134_515_008  # sum(p.numel()) of the loaded model
    assert count_parameters(KNOWN_CONFIGS["tiny-random"]) == 3_227_968


def test_smoke_with_smollm2_does_not_fit_24_gib_and_the_suggestion_does(capsys, monkeypatch):
    """The smoke preset's ZeRO-3, micro-batch 4 x (768 + 32) tokens, no checkpointing on SmolLM2-135M: ~29.1 GiB,
    over 24 GiB; ZeRO stage 0 plus gradient checkpointing brings it to ~19.8 GiB (measured: that run peaked at 20.6
    GiB of the machine's memory in use, ~0.8 GiB of it other processes). The budget is this machine's: 24 GB less
    what Ray's memory monitor keeps free (stage 0 alone, ~23.1 GiB, would not fit)."""
    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "21.5")
    # padded micro-batches of 4, float32 engines (as measured)
    cfg = preset("smoke", model="smollm2-135m", device="cpu", pack_tokens=0, engine_dtype="float32")
    mem = by_name(check_config(cfg))["memory"]
    est = mem.data
    assert not mem.ok and est.budget == 21.5 and est.total == pytest.approx(29.1, abs=0.1)
    # bfloat16 engines hold their weights in half the bytes: 3 x 135M x 2 bytes less
    bf16 = estimate_memory(dataclasses.replace(cfg, engine_dtype="bfloat16"), model_shape(cfg.model), 3)
    assert est.total - bf16.total == pytest.approx(3 * model_shape(cfg.model).params * 2 / 2**30, rel=1e-6)
    assert est.suggestion == {"zero_stage": 0, "gradient_checkpointing": True}
    fixed = estimate_memory(dataclasses.replace(cfg, **est.suggestion), model_shape(cfg.model), 3)
    assert fixed.total <= 24 and fixed.total == pytest.approx(est.suggested_total)
    assert "--zero-stage 0 --gradient-checkpointing" in mem.detail
    smoke = ("--preset", "smoke", "--model", "smollm2-135m", "--pack-tokens", "0", "--engine-dtype", "float32")
    rc, out, _ = dry_run(capsys, *smoke)
    assert rc == 1 and "--zero-stage 0 --gradient-checkpointing" in out
    # the flags it suggests pass the check
    rc, out, parsed = dry_run(capsys, *smoke, "--zero-stage", "0", "--gradient-checkpointing")
    assert parsed["zero_stage"] == 0 and parsed["gradient_checkpointing"] is True
    assert "FAIL  memory" not in out


def test_memory_check_can_be_skipped(capsys):
    cfg = preset("smoke", model="smollm2-135m", device="cpu", memory_check=False)
    mem = by_name(check_config(cfg))["memory"]
    assert mem.ok and mem.detail.startswith("skipped") and not mem.data.fits
    _, out, parsed = dry_run(capsys, "--preset", "smoke", "--model", "smollm2-135m", "--no-memory-check")
    assert parsed["memory_check"] is False and "FAIL  memory" not in out


def test_the_memory_check_is_skipped_only_for_a_cluster_elsewhere(monkeypatch):
    """A cluster named by ``RAY_ADDRESS`` holds memory this machine cannot see: not checked, and said so; ``local``
    (mappa's own cluster on this machine, as ``--ray-address local``) is checked like no address at all."""
    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "4")
    cfg = preset("demo", device="cpu", engine_dtype="float32")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    mem = by_name(check_config(cfg))["memory"]
    assert mem.ok and mem.detail.startswith("not checked: RAY_ADDRESS points at a cluster")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    mem = by_name(check_config(cfg))["memory"]
    assert not mem.ok and "a smaller model" in mem.detail


def test_demo_fits_24_gib_and_a_tiny_budget_has_no_fix(monkeypatch):
    cfg = preset("demo", device="cpu", engine_dtype="float32")  # 'auto' depends on the CPU's bf16 support
    est = by_name(check_config(cfg))["memory"].data
    # the weight sync runs one role at a time on CPU: one role's transient copies (1.2 GiB) count, not three; a
    # prefix pack of 768 tokens has at most 384 response tokens' logits (0.12 GiB more than one padded row's)
    assert est.fits and est.total == pytest.approx(20.42, abs=0.05)
    bf16 = by_name(check_config(dataclasses.replace(cfg, engine_dtype="bfloat16")))["memory"].data
    assert bf16.fits and bf16.total == pytest.approx(20.42 - 0.76, abs=0.05)  # 3 engines' weights in half the bytes
    monkeypatch.setenv("MAPPA_MEMORY_BUDGET_GB", "4")
    mem = by_name(check_config(cfg))["memory"]
    assert not mem.ok and mem.data.suggestion is None and "a smaller model" in mem.detail


def test_estimate_scales_with_settings():
    shape = model_shape("smollm2-135m")
    base = preset("smoke", model="smollm2-135m", device="cpu", pack_tokens=0)

    def total(**kw):
        return estimate_memory(dataclasses.replace(base, **kw), shape, 3, budget=(24, "fixed")).total

    assert total(zero_stage=0) < total()
    assert total(gradient_checkpointing=True) < total()
    assert total(micro_batch=1) < total()
    assert total(pack_tokens=512) < total() < total(pack_tokens=4096)  # 512 < 4 x 800 padded tokens < 4096
    assert total(parallel_updates=True) > total()
    assert total(engine_kv_cache_gb=4) == pytest.approx(total() + 9, abs=0.01)  # 3 engines x 3 GiB more
    local = estimate_memory(dataclasses.replace(base, trainer="local"), shape, 3, budget=(24, "fixed"))
    shared = estimate_memory(dataclasses.replace(base, trainer="local", share_model=True), shape, 3)
    assert shared.total < local.total < total()
    named = dataclasses.replace(base, trainer="local", role_weights={"b": "shared:a", "c": "shared:a"})
    assert estimate_memory(named, shape, 3).total == pytest.approx(shared.total)  # the same weights, spelled out
    frozen = estimate_memory(dataclasses.replace(base, trainer="local", role_weights={"c": "frozen"}), shape, 3)
    assert shared.total < frozen.total < local.total


def test_train_flags_reach_the_config(capsys):
    _, _, cfg = dry_run(
        capsys,
        "--preset",
        "smoke",
        "--lr",
        "3e-6",
        "--weight-decay",
        "0.1",
        "--warmup-ratio",
        "0",
        "--advantage-scope",
        "team",
        "--no-mask-coach-fallbacks",
        "--truncated",
        "keep",
        "--max-new-tokens",
        "16",
        "--micro-batch",
        "2",
        "--temperature",
        "0.5",
        "--engine-kv-cache-gb",
        "2",
    )
    assert (cfg["lr"], cfg["weight_decay"], cfg["warmup_ratio"]) == (3e-6, 0.1, 0.0)
    assert (cfg["advantage_scope"], cfg["mask_coach_fallbacks"], cfg["truncated"]) == ("team", False, "keep")
    assert (cfg["max_new_tokens"], cfg["micro_batch"], cfg["temperature"]) == (16, 2, 0.5)
    assert cfg["engine_kv_cache_gb"] == 2.0
    # unset flags keep the preset's values
    _, _, cfg = dry_run(capsys, "--preset", "demo")
    assert cfg == json.loads(json.dumps(dataclasses.asdict(PRESETS["demo"])))


def test_missing_model_folder_and_format():
    cs = check_config(preset("smoke", model="/nonexistent/model"))
    assert not by_name(cs)["model"].ok and "/nonexistent/model" in by_name(cs)["model"].detail
    text = format_checks(cs)
    assert text.splitlines()[0].startswith("FAIL  model")
    assert all(line[:6] in ("ok    ", "FAIL  ", "      ") for line in text.splitlines())


def test_aime_train_512_split():
    from mappa_envs.tasks.mathchat.data import load_split

    tasks = load_split("aime-train-512")
    pool = {t.prompt for t in load_split("aime-train")}
    assert len(tasks) == 512 == len({t.id for t in tasks}) and all(t.prompt in pool for t in tasks)
    assert tasks[0].id == "aime-train-512/1983-4" and tasks[-1].id == "aime-train-512/2024-II-15"


def test_ablate_refuses_before_any_run_when_an_arm_cannot_run(tmp_path, capsys):
    # demo-arith draws one sample per prompt: its GRPO arm cannot run, so no arm starts (it used to fail after the
    # two other full runs)
    from benchmarks.cli import main

    assert main(["ablate", "--preset", "demo-arith", "--out", str(tmp_path / "abl")]) == 1
    err = capsys.readouterr().err
    assert "refused before any run" in err and "- grpo seed 0: estimator" in err and "--samples-per-prompt 2" in err
    assert not (tmp_path / "abl").exists()


@pytest.mark.parametrize("trainer, waits", [("ray", 3), ("local", 0)])
def test_ablate_waits_for_memory_only_after_a_ray_run(tmp_path, monkeypatch, trainer, waits):
    """Between runs, ``mappa ablate`` waits for the previous run's Ray workers to release their memory; a local
    trainer's run leaves none, so nothing is waited for."""
    import subprocess
    from pathlib import Path

    import baselines.planning.checks
    import benchmarks.cli as cli
    from benchmarks.commands import ablate

    def fake_call(cmd):
        run = Path(cmd[cmd.index("--out") + 1])
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.json").write_text(json.dumps({"iterations": 1, "eval_episodes": 0}))
        (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0}) + "\n")
        return 0

    calls = []
    monkeypatch.setattr(subprocess, "call", fake_call)
    monkeypatch.setattr(ablate, "_wait_for_memory_release", lambda: calls.append(1))
    monkeypatch.setattr(ablate, "cmd_report_run", lambda args: 0)
    monkeypatch.setattr(ablate, "_report_ablation", lambda out: 0)
    monkeypatch.setattr(baselines.planning.checks, "check_config", lambda cfg: [])
    argv = [
        "ablate",
        "--preset",
        "smoke",
        "--seeds",
        "0,1",
        "--arms",
        "coach,outcome",
        "--trainer",
        trainer,
        "--fresh-actors",
    ]
    assert cli.main([*argv, "--out", str(tmp_path / "abl")]) == 0
    assert len(calls) == waits


def test_ablate_runs_share_the_first_runs_before_training_evaluation(tmp_path, monkeypatch):
    """The arms and seeds start from the same weights and evaluate the same way: every later run gets the first
    run's before-training evaluation (same episodes, no second evaluation), a run with its own keeps it; each run's
    command is the preset with its estimator, coach and seed; what each reward sees is in ablation.json; a re-run
    skips the finished runs."""
    import subprocess
    from pathlib import Path

    import baselines.planning.checks
    import benchmarks.cli as cli
    from benchmarks.commands import ablate

    out = tmp_path / "abl"
    seen = {}
    before = {"split": "arith2-dev-1step", "accuracy": 0.25, "correct": 1, "episodes": 4, "outcomes": [1, 0, 0, 0]}

    def fake_call(cmd):
        run = Path(cmd[cmd.index("--out") + 1])
        key = f"{run.parent.name}/{run.name}"
        seen[key] = (cmd, json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else None)
        run.mkdir(parents=True, exist_ok=True)
        evals = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {"before": before}
        (run / "eval.json").write_text(json.dumps({**evals, "after": {**before, "correct": 2}}))
        (run / "config.json").write_text(json.dumps({"iterations": 1, "eval_episodes": 4}))
        (run / "metrics.jsonl").write_text(json.dumps({"iteration": 0}) + "\n")
        (run / "checkpoints" / "iter-00000" / "verifier").mkdir(parents=True)
        (run / "checkpoints" / "iter-00000" / "verifier" / "state.pt").write_bytes(b"x" * 1000)
        (run / "checkpoints" / "latest").write_text("iter-00000")
        if key != "grpo/seed-0":  # this one died while exporting its models
            (run / "models" / "verifier").mkdir(parents=True)
            (run / "models" / "verifier" / "config.json").write_text("{}")
        return 0

    (out / "grpo" / "seed-1").mkdir(parents=True)
    (out / "grpo" / "seed-1" / "eval.json").write_text(json.dumps({"before": {"its": "own"}}))
    monkeypatch.setattr(subprocess, "call", fake_call)
    monkeypatch.setattr(ablate, "_wait_for_memory_release", lambda: None)
    monkeypatch.setattr(ablate, "cmd_report_run", lambda args: 0)
    monkeypatch.setattr(ablate, "_report_ablation", lambda out: 0)
    monkeypatch.setattr(baselines.planning.checks, "check_config", lambda cfg: [])  # not this machine's memory now
    argv = [
        "ablate",
        "--preset",
        "demo",
        "--seeds",
        "0,1",
        "--arms",
        "coach,outcome,grpo",
        "--out",
        str(out),
        "--fresh-actors",
    ]
    assert cli.main(argv) == 0
    assert len(seen) == 6 and seen["coach/seed-0"][1] is None
    assert seen["outcome/seed-0"][1] == {"before": before, "shared_from": str(out / "coach" / "seed-0")}
    assert seen["coach/seed-1"][1] == {"before": before, "shared_from": str(out / "coach" / "seed-0")}
    assert seen["grpo/seed-1"][1] == {"before": {"its": "own"}}
    cmd = seen["outcome/seed-1"][0]
    assert cmd[cmd.index("--estimator") + 1] == "outcome" and cmd[cmd.index("--coach") + 1] == "none"
    assert cmd[cmd.index("--seed") + 1] == "1"
    manifest = json.loads((out / "ablation.json").read_text())
    assert manifest["seeds"] == [0, 1]
    info = {a["name"]: a["information"] for a in manifest["arms"]}
    assert info == {"coach": "final-answer-key", "outcome": "outcome", "grpo": "final-answer-key"}
    for key in seen:  # a finished run's checkpoints are removed once its models are exported; the models stay
        removed = sorted(p.name for p in (out / key / "checkpoints").iterdir())
        assert removed == (["iter-00000", "latest"] if key == "grpo/seed-0" else ["REMOVED"]), (key, removed)
    from baselines.runs.store import check_resumable

    cfg = TrainConfig(out_dir=str(out / "coach" / "seed-0"))
    with pytest.raises(ValueError, match="checkpoints were removed when the run finished"):
        check_resumable(cfg)  # mappa train would start again from the base weights on the trained policies' episodes
    assert check_resumable(dataclasses.replace(cfg, resume=False)) is None
    seen.clear()
    assert cli.main(argv) == 0 and seen == {}  # every run finished: nothing runs again


def test_held_out_tasks_that_are_in_the_training_pool_are_refused():
    # aime-train holds every problem of aime-train-512: evaluating on it is not held out
    cfg = TrainConfig(env_kwargs={"split": "aime-train-512"}, eval_split="aime-train", eval_episodes=4)
    ev = by_name(check_config(cfg))["eval"]
    assert not ev.ok and "512 held-out task(s) of 'aime-train' are also in the training pool" in ev.detail
    # the task's own held-out split (eval_split None) is AIME-32, disjoint from it
    ok = by_name(check_config(TrainConfig(env_kwargs={"split": "aime-train-512"}, eval_split=None, eval_episodes=4)))
    assert ok["eval"].ok and "'aime-eval-32'" in ok["eval"].detail


def test_role_weight_specs_are_checked():
    """Every spec is parsed and checked against the task's roles and the trainer before anything starts."""
    from baselines.weights.role_weights import parse_spec, role_specs, spec_problems, weight_groups

    roles = ["a", "b", "c"]
    assert weight_groups(role_specs({"b": "shared:a", "c": "frozen"}, roles, "local")) == {"a": ["a", "b"]}
    lora = role_specs({"a": "lora:4", "b": "shared:a", "c": "frozen"}, roles, "local")
    assert weight_groups(lora) == {"a": ["a", "b"]} and lora["a"].rank == 4
    for weights, trainer, why in (
        ({"d": "full"}, "local", "names 'd', not a role"),
        ({"a": "half"}, "local", "expected full, full@MODEL"),
        ({"a": "shared:a"}, "local", "another role"),
        ({"a": "frozen", "b": "shared:a"}, "local", "a is frozen"),
        ({"a": "shared:b", "b": "shared:c"}, "ray", "b is shared"),
    ):
        problems = spec_problems(weights, roles, trainer)
        assert any(why in p for p in problems), (weights, problems)
    assert parse_spec("lora").rank is None and parse_spec("full@m").model == "m"
    with pytest.raises(ValueError, match="frozen@m"):
        parse_spec("frozen@m")


def test_role_weights_on_the_command_line(capsys):
    """``--role-weights ROLE=SPEC`` (repeatable) reaches the configuration and its check; a bad one is refused."""
    argv = ["train", "--preset", "smoke", "--trainer", "local", "--role-weights", "verifier=frozen"]
    args = cli.build_parser().parse_args([*argv, "--role-weights", "code_executor=shared:problem_solver"])
    cfg = train_command.train_config(args)
    assert cfg.role_weights == {"verifier": "frozen", "code_executor": "shared:problem_solver"}
    checks = {c.name: c for c in check_config(cfg)}
    assert checks["role weights"].ok and "verifier frozen" in checks["role weights"].detail
    on_ray = dataclasses.replace(cfg, trainer="ray")  # frozen and shared run on both trainers
    assert {c.name: c for c in check_config(on_ray)}["role weights"].ok
    lora = dataclasses.replace(on_ray, role_weights={"problem_solver": "lora", "verifier": "full@tiny-random"})
    assert {c.name: c for c in check_config(lora)}["role weights"].ok  # LoRA and own models: both trainers
    nowhere = dataclasses.replace(on_ray, role_weights={"verifier": "full@/nonexistent/model"})
    assert "verifier=full@/nonexistent/model" in {c.name: c for c in check_config(nowhere)}["role weights"].detail
    with pytest.raises(SystemExit, match="ROLE=SPEC"):
        train_command.train_config(cli.build_parser().parse_args(["train", "--role-weights", "verifier"]))


def test_placement_keys_are_checked_before_ray_starts(tmp_path):
    cfg = preset("smoke", out_dir=str(tmp_path), placement={"engine:critic": "gen", "trainers": ""})
    (check,) = [c for c in check_config(cfg) if c.name == "placement"]
    assert not check.ok and "'engine:critic'" in check.detail and "empty resource name" in check.detail
    local = preset("smoke", out_dir=str(tmp_path), trainer="local", placement={"engines": "gen"})
    assert not next(c for c in check_config(local) if c.name == "placement").ok


def test_autocast_auto_is_bfloat16_only_on_float32_weights_with_native_bfloat16(monkeypatch):
    import baselines.weights.dtypes
    from baselines.config import TrainConfig

    monkeypatch.setattr(baselines.weights.dtypes, "native_bf16", lambda device: True)
    assert TrainConfig(device="cpu").resolved_autocast() == "bfloat16"
    assert TrainConfig(device="cpu", autocast="off").resolved_autocast() is None
    assert TrainConfig(device="cpu", dtype="bfloat16").resolved_autocast() is None  # already bfloat16 weights
    assert TrainConfig(device="cuda").resolved_autocast() is None  # 'auto' weights are bfloat16 on a GPU
    monkeypatch.setattr(baselines.weights.dtypes, "native_bf16", lambda device: False)
    assert TrainConfig(device="cpu").resolved_autocast() is None  # emulated bfloat16 would be slower
    assert TrainConfig(device="cpu", autocast="bfloat16").resolved_autocast() == "bfloat16"


def test_a_run_saved_before_autocast_existed_resumes_only_in_float32(tmp_path):
    """A config.json without ``autocast`` is a run whose matmuls were float32: resuming it under the new default
    ('auto', bfloat16 on a CPU with AMX) would change its numerics mid-run, so it is refused unless 'off'."""
    from dataclasses import asdict

    from baselines.config import TrainConfig
    from baselines.runs.store import check_resumable

    cfg = TrainConfig(out_dir=str(tmp_path))
    old = {k: v for k, v in asdict(cfg).items() if k != "autocast"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "eval.json").write_text("{}")
    with pytest.raises(ValueError, match="autocast: 'off' then, 'auto' now"):
        check_resumable(cfg)
    assert check_resumable(dataclasses.replace(cfg, autocast="off"))["autocast"] == "off"
