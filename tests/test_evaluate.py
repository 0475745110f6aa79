"""mappa eval: teams (endpoints, local models, a training run's exported models), k samples, intervals, JSON."""

import importlib.util
import json

import pytest

from baselines.evaluation.evaluate import EvalConfig, evaluate, format_tables, summarize
from baselines.evaluation.teams import build_policies, team_from_args
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
    assert aime["episodes"] == 4 and aime["problems"] == 2 and aime["kind"] == "answer"
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
def test_eval_of_a_training_runs_exported_models(tmp_path, monkeypatch):
    """mappa train writes models/<role>/; mappa eval --run plays each role with its own trained weights."""
    from baselines.training.local_trainer import LocalTrainer, TrainConfig
    from baselines.weights.models import tiny_model_dir

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
    # the swap matrix over real local models: 8 combinations, one engine per model (3 trained + the base)
    import baselines.evaluation.teams
    from baselines.evaluation import swap

    seen: dict = {}

    def spy(team, cfg, engines=None):  # the real builder, watched: which engine cache the matrix shares
        seen["engines"] = engines
        return build_policies(team, cfg, engines=engines)

    ecfg = EvalConfig(suites=("amc",), k=1, limit=1, engine="transformers", max_new_tokens=4, sandbox="subprocess")
    base = team_from_args(roles, model=str(tiny_model_dir()))
    monkeypatch.setattr(baselines.evaluation.teams, "build_policies", spy)
    matrix = swap.swap_matrix(roles, team, base, ecfg, tmp_path / "swap", log=lambda *_: None)
    assert len(matrix["rows"]) == 8 and len(seen["engines"]) == 4
    mixed = json.loads((tmp_path / "swap" / "verifier" / "eval.json").read_text())["team"]
    assert mixed["verifier"]["model"].endswith("models/verifier") and mixed["problem_solver"] == base["problem_solver"]


class _Arithmetic:
    """A policy for every role: boxes ``a + b`` of the problem's first two numbers (plus ``off``)."""

    def __init__(self, off: int = 0):
        self.off = off

    def generate(self, batch):
        import re

        replies = []
        for conversation in batch:
            problem = next(m["content"] for m in conversation if m["role"] == "user")
            a, b = (int(x) for x in re.findall(r"\d+", problem)[:2])
            replies.append(f"\\boxed{{{a + b + self.off}}}")
        return replies


def _task_file(tmp_path, answers):
    path = tmp_path / "sums.jsonl"
    rows = [
        {"id": f"s{i}", "prompt": f"What is {a} plus {b}?", "answer": str(ans)} for i, (a, b, ans) in enumerate(answers)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_task_file_suites_and_paired_comparison_of_two_teams(tmp_path):
    """`tasks:<file>` evaluates a task file; two teams on the same episodes get the exact McNemar test; a suite
    evaluated on other episodes (another limit) is refused."""
    from baselines.evaluation.evaluate import format_comparison, paired_comparison, suite_env

    # 6 problems: the "right" team is right where the answer is a + b (4 of them), the "off by one" team where it
    # is a + b + 1 (the other 2)
    path = _task_file(tmp_path, [(2, 3, 5), (4, 4, 8), (7, 1, 8), (9, 9, 18), (1, 1, 3), (5, 6, 12)])
    cfg = EvalConfig(suites=(f"tasks:{path}",), sandbox="subprocess", concurrency=3)
    env_id, kwargs = suite_env(f"tasks:{path}", cfg)
    assert env_id == "mappa/MathChat-v0" and kwargs["data_file"] == str(path)
    a = evaluate(_Arithmetic(0), cfg, log=lambda *_: None)
    b = evaluate(_Arithmetic(1), cfg, log=lambda *_: None)
    sa = a["suites"][f"tasks:{path}"]
    assert sa["outcomes"] == [True, True, True, True, False, False] and sa["correct"] == 4
    assert sa["task_ids"] == b["suites"][f"tasks:{path}"]["task_ids"]
    p = paired_comparison(a, b)[f"tasks:{path}"]
    assert (p["gained"], p["lost"], p["pairs"]) == (4, 2, 6)
    assert p["score_a"] == pytest.approx(4 / 6) and p["score_b"] == pytest.approx(2 / 6)
    assert p["p_value_gain"] == pytest.approx(22 / 64)  # P(X >= 4), X ~ Binomial(6, 1/2)
    assert "a better in 4, b in 2" in format_comparison({"sums": p})
    short = evaluate(_Arithmetic(1), EvalConfig(suites=cfg.suites, sandbox="subprocess", limit=3), log=lambda *_: None)
    with pytest.raises(ValueError, match="different episodes"):
        paired_comparison(a, short)


def test_suite_names_and_mathchat_arguments(tmp_path):
    from baselines.evaluation.evaluate import suite_env

    cfg = EvalConfig(mathchat_kwargs={"prompt_style": "small"})
    assert suite_env("mathchat:arith1-eval", cfg) == (
        "mappa/MathChat-v0",
        {"split": "arith1-eval", "prompt_style": "small"},
    )
    assert "prompt_style" not in suite_env("dsbench", cfg)[1]  # MathChat's arguments only
    with pytest.raises(FileNotFoundError, match="task file"):
        suite_env(f"tasks:{tmp_path / 'missing.json'}", cfg)
    with pytest.raises(ValueError, match="unknown suite"):
        suite_env("gsm8k", cfg)


def test_swap_matrix_says_which_roles_training_mattered(tmp_path, monkeypatch):
    """Every combination of trained and base weights per role, on the same episodes, with paired tests against the
    base and the all-trained team. Scripted models: only the trained verifier boxes the right sum (the verifier's
    answer is the team's), so exactly the combinations holding it gain every problem."""
    import baselines.evaluation.teams
    from baselines.evaluation.swap import combination_name, format_swap_matrix, swap_matrix
    from benchmarks.commands import evaluate as eval_command

    path = _task_file(tmp_path, [(2, 3, 5), (4, 4, 8), (7, 1, 8)])
    cfg = EvalConfig(suites=(f"tasks:{path}",), sandbox="subprocess", concurrency=3)
    roles = ["problem_solver", "code_executor", "verifier"]
    trained = {r: {"kind": "local", "model": f"run/models/{r}"} for r in roles}
    base = {r: {"kind": "local", "model": "base"} for r in roles}
    built = []

    def fake_build(team, cfg, engines=None):
        built.append(team)
        return {r: _Arithmetic(0 if who["model"] == "run/models/verifier" else 1) for r, who in team.items()}

    monkeypatch.setattr(baselines.evaluation.teams, "build_policies", fake_build)
    matrix = swap_matrix(roles, trained, base, cfg, tmp_path / "swap", log=lambda *_: None)
    suite = f"tasks:{path}"
    rows = {r["combination"]: r for r in matrix["rows"]}
    assert list(rows) == [
        "base",
        "trained: problem_solver",
        "trained: code_executor",
        "trained: verifier",
        "trained: problem_solver+code_executor",
        "trained: problem_solver+verifier",
        "trained: code_executor+verifier",
        "trained: all",
    ]
    for name, row in rows.items():
        vs_base = row["vs_base"][suite]
        assert vs_base["score_a"] == (1.0 if "verifier" in row["trained_roles"] else 0.0), name
        assert vs_base["gained"] == (3 if "verifier" in row["trained_roles"] else 0)
    assert rows["trained: code_executor"]["vs_trained"][suite]["lost"] == 3
    assert combination_name(roles, frozenset(roles)) == "trained: all" and len(built) == 8
    assert json.loads((tmp_path / "swap" / "swap_matrix.json").read_text())["roles"] == roles
    assert "| trained: verifier | 100.0% [" in format_swap_matrix(matrix)
    # --swap ROLE=base|RUN2 reads as --role-model entries of the run's team
    args = eval_command.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args(
        ["--run", "r1", "--swap", "verifier=base", "--swap", "code_executor=r2"]
    )
    assert eval_command._swapped(args) == {"verifier": "smollm2-135m", "code_executor": "r2/models/code_executor"}
