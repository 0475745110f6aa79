"""mappa eval: teams (endpoints, local models, a training run's exported models), k samples, intervals, JSON."""

import importlib.util
import json

import pytest

from baselines.evaluate import EvalConfig, build_policies, evaluate, format_tables, summarize, team_from_args
from benchmarks.flaky_coach_server import FlakyCoachServer
from mappa_envs.metrics import wilson_interval


@pytest.fixture
def server():
    s = FlakyCoachServer(failure_rate=0.0)
    yield s
    s.close()


def test_team_resolution(tmp_path):
    roles = ["problem_solver", "code_executor", "verifier"]
    team = team_from_args(roles, model="tiny-random", role_endpoints={"verifier": "m@http://x/v1"})
    assert team["problem_solver"] == {"kind": "local", "model": "tiny-random"}
    assert team["verifier"] == {"kind": "endpoint", "url": "http://x/v1", "model": "m"}
    with pytest.raises(ValueError, match="unknown roles"):
        team_from_args(roles, role_models={"coder": "x"})
    with pytest.raises(ValueError, match="MODEL@URL"):
        team_from_args(roles, role_endpoints={"verifier": "http://x/v1"})
    with pytest.raises(FileNotFoundError, match="models/<role>"):
        team_from_args(roles, run_dir=str(tmp_path))


def test_eval_through_endpoints_writes_tables_and_json(server, tmp_path):
    cfg = EvalConfig(suites=("aime", "dsbench"), k=2, limit=2, sandbox="subprocess", concurrency=4)
    roles = ["problem_solver", "code_executor", "verifier", "data_engineer", "modeler", "analyst"]
    team = team_from_args(roles, role_endpoints={r: f"local@{server.url}" for r in roles})
    result = evaluate(build_policies(team, cfg), cfg, out_dir=tmp_path, team=team, log=lambda *_: None)
    aime, ds = result["suites"]["aime"], result["suites"]["dsbench"]
    assert aime["episodes"] == 4 and aime["problems"] == 2 and aime["kind"] == "math"
    assert aime["ci95"] == list(wilson_interval(aime["correct"], 4))
    assert ds["episodes"] == 4 and set(ds["tasks"]) and all(t["samples"] == 2 for t in ds["tasks"].values())
    assert ds["success_rate"] == 0.0 and ds["mean_quality"] == 0.0  # the server never writes code
    assert set(aime["behaviour"]) == {"problem_solver", "code_executor", "verifier"}
    assert aime["behaviour"]["code_executor"]["tool_call_rate"] == 0.0
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["suites"]["aime"]["accuracy"] == aime["accuracy"]
    assert len((tmp_path / "aime.jsonl").read_text().splitlines()) == 4
    table = format_tables(result)
    assert "accuracy" in table and "mean quality" in table and "analyst" in table


def test_summaries_of_dsbench_records():
    from mappa_envs.core import EpisodeRecord

    recs = [
        EpisodeRecord("e", str(i), "t1" if i < 2 else "t2", "task", seed=i, outcome=o)
        for i, o in enumerate(
            [
                {"success": True, "valid": True, "value": 0.9, "quality": 0.8, "metric": "accuracy"},
                {"success": False, "valid": False, "value": None, "quality": 0.0, "metric": "accuracy"},
                {"success": True, "valid": True, "value": 2.0, "quality": 0.5, "metric": "rmse"},
                {"success": True, "valid": True, "value": 3.0, "quality": 0.3, "metric": "rmse"},
            ]
        )
    ]
    s = summarize("dsbench", recs, k=2)
    assert s["success_rate"] == 0.75 and s["mean_quality"] == pytest.approx(0.4)
    assert s["tasks"]["t1"]["valid"] == 1 and s["tasks"]["t2"]["mean_value"] == pytest.approx(2.5)
    lo, hi = s["quality_ci95"]
    assert lo < 0.4 < hi


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the 'models' extra")
def test_eval_of_a_training_runs_exported_models(tmp_path):
    """mappa train writes models/<role>/; mappa eval --run plays each role with its own trained weights."""
    from baselines.local_trainer import LocalTrainer, TrainConfig
    from baselines.models import tiny_model_dir

    cfg = TrainConfig(
        model=str(tiny_model_dir()),
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        lr=1e-3,
        out_dir=str(tmp_path / "run"),
        coach="mappa_envs.coach:LengthCoach",
        truncated="keep",  # the random model's 8 tokens are always cut: keep them, so the weights do train
        progress=False,
    )
    trainer = LocalTrainer(cfg)
    trainer.train()
    trainer.close()
    for role in ("problem_solver", "code_executor", "verifier"):
        assert (tmp_path / "run" / "models" / role / "config.json").exists()
    roles = ["problem_solver", "code_executor", "verifier"]
    team = team_from_args(roles, run_dir=str(tmp_path / "run"))
    ecfg = EvalConfig(suites=("amc",), k=1, limit=2, engine="transformers", max_new_tokens=8, sandbox="subprocess")
    policies = build_policies(team, ecfg)
    assert len({id(p) for p in policies.values()}) == 3  # separate weights per role
    result = evaluate(policies, ecfg, out_dir=tmp_path / "eval", team=team, log=lambda *_: None)
    assert result["suites"]["amc"]["episodes"] == 2
