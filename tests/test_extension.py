"""The extension API: a task in one module (SQLQuery-v0, the example), tools separate from tasks, and a
third-party package that registers a task through an entry point."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mappa_envs
from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
from mappa_envs.core import get_tool, list_tools


def test_the_example_task_registers_its_tool_beside_the_built_in_one():
    import mappa_envs.tasks.sql_query  # noqa: F401  (its import registers the "sql" tool)

    assert {"python", "sql"} <= set(list_tools())


def _play(env, query, answer):
    env.reset(seed=0, options={"task_index": 0})
    env.step(f"```sql\n{query}\n```")
    env.step("That is the count.")
    env.step(f"\\boxed{{{answer}}}")


def test_sql_episode_runs_queries_in_the_sandbox_read_only():
    env = mappa_envs.make("mappa/SQLQuery-v0")
    task = env.tasks[0]
    _play(env, task.metadata["reference_sql"], task.answer)
    call = env.record.actions[0].tool_calls[0]
    assert call.tool == "sql" and call.result.ok and str(task.answer) in call.result.stdout
    assert env.record.outcome["correct"] is True and env.rewards["answerer_0"] == 1.0
    env.reset(seed=0)
    env.step("```sql\nDROP TABLE orders\n```")
    assert "readonly" in env.record.actions[0].tool_calls[0].feedback  # the database cannot be changed
    env.close()


def test_rule_coach_scores_the_sql_tool_role_and_uses_task_guidance():
    from mappa_envs.coach import Templates
    from mappa_envs.coach.protocol import inputs_for_episode

    env = CoachRewardWrapper(mappa_envs.make("mappa/SQLQuery-v0"), RuleBasedCoach(), blocking=True)
    task = env.unwrapped.tasks[0]
    _play(env, task.metadata["reference_sql"], task.answer)
    rec = env.unwrapped.record
    first = rec.actions[0]
    assert "code ran without error" in first.coach.reasoning  # a tool role by its tools, not its name
    inp = inputs_for_episode(
        rec,
        first,
        task_type="sql",
        template="default",
        final_agent="answerer_0",
        is_final=False,
        tools=("sql",),
        guidance=env.unwrapped.role("query_writer_0").coach_guidance,
    )
    assert "focused SQL" in Templates().build(inp)[1]["content"]
    env.close()


def test_unknown_tool_fails_at_construction():
    from mappa_envs.core import PipelineEnv, Role, Task

    class Bad(PipelineEnv):
        def grade(self, task, record):
            return 0.0, {}

    with pytest.raises(KeyError, match="no tool registered as 'shell'"):
        Bad([Role("a", "s", "i", tools=("shell",))], [Task("t", "p")])
    assert get_tool("python").name == "python"


def _pip_install(package: Path, site: Path) -> None:
    """``pip install`` a package folder into ``site`` (no dependencies, no build isolation: offline)."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(package)], check=True, capture_output=True)


def test_third_party_package_registers_a_task_by_entry_point(tmp_path):
    pkg = tmp_path / "theirpkg"
    (pkg / "theirpkg").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "theirpkg"
            version = "0.0.1"
            [project.entry-points."mappa_envs.envs"]
            theirpkg = "theirpkg:register"
            """
        )
    )
    (pkg / "theirpkg" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from mappa_envs.core import PipelineEnv, Role, Task


            class EchoEnv(PipelineEnv):
                env_id = "theirpkg/Echo-v0"

                def __init__(self, **kw):
                    super().__init__([Role("echoer", "Repeat the task.", "Repeat it.")], [Task("t0", "hello")], **kw)

                def grade(self, task, record):
                    ok = record.actions[-1].output.strip() == task.prompt
                    return float(ok), {"correct": ok, "success": ok}


            def register():
                import mappa_envs

                mappa_envs.register("theirpkg/Echo-v0", "theirpkg:EchoEnv")
            """
        )
    )
    site = tmp_path / "site"
    _pip_install(pkg, site)
    code = (
        "import mappa_envs; env = mappa_envs.make('theirpkg/Echo-v0'); env.reset(seed=0); env.step('hello'); "
        "print(env.possible_agents, dict(env.record.outcome))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(site), "PATH": ""}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "['echoer_0'] {'correct': True, 'success': True, 'score': 1.0, 'kind': 'answer'}" in out.stdout


def test_every_outcome_says_success_and_score():
    """The outcome contract: every env's outcome holds ``success`` (bool) and ``score`` (its reward, in [0, 1]),
    which training, evaluation and reports read (EpisodeRecord.success / .score); a grade() without ``success``
    is an error that names it."""
    import mappa_envs
    from mappa_envs.core import PipelineEnv, Role, Task

    for env_id, kwargs, reply in (
        ("mappa/MathChat-v0", {"split": "arith1-eval", "sandbox": "subprocess"}, "\\boxed{3}"),
        ("mappa/SQLQuery-v0", {"sandbox": "subprocess"}, "\\boxed{3}"),
    ):
        env = mappa_envs.make(env_id, **kwargs)
        env.reset(seed=0)
        for _ in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else reply)
        rec = env.unwrapped.record
        assert isinstance(rec.outcome["success"], bool) and 0.0 <= rec.outcome["score"] <= 1.0, (env_id, rec.outcome)
        assert rec.success == rec.outcome["success"] and rec.score == rec.outcome["score"]
        env.close()

    class NoSuccess(PipelineEnv):
        def grade(self, task, record):
            return 1.0, {"correct": True}

    env = NoSuccess([Role("solo", "s", "i")], [Task("t0", "p")], sandbox="subprocess")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="without 'success'"):
        env.step("hello")
    env.close()


def test_the_outcome_kind_is_declared_and_checked():
    """A task declares its outcome kind (``PipelineEnv.outcome_kind``): evaluation, training metrics and tables read
    it from the record (``EpisodeRecord.kind`` / ``.quality``), not from which keys the outcome happens to hold.
    A graded task without a quality in [0, 1], or a reward outside [0, 1], is the task's error, named."""
    from baselines.evaluation.evaluate import summarize
    from mappa_envs.core import EpisodeRecord, PipelineEnv, Role, Task
    from mappa_envs.core.trajectory import checked_outcome
    from mappa_envs.metrics import summary_table

    def run(cls):
        env = cls([Role("solo", "s", "i")], [Task("t0", "p")], sandbox="subprocess")
        env.reset(seed=0)
        env.step("hello")
        env.close()
        return env.record

    class Scored(PipelineEnv):
        outcome_kind = "graded"

        def grade(self, task, record):
            return 0.5, {"success": True, "quality": 0.5, "correct": True}  # 'correct' does not make it an answer

    rec = run(Scored)
    assert rec.kind == "graded" and rec.quality == 0.5 and rec.outcome["kind"] == "graded"
    assert summarize("s", [rec], k=1)["kind"] == "graded" and "mean quality: 0.500" in summary_table([rec])

    class Answered(PipelineEnv):
        def grade(self, task, record):
            return 1.0, {"success": True}  # no 'correct': still an answer task (the default kind)

    rec = run(Answered)
    assert rec.kind == "answer" and rec.quality is None and summarize("s", [rec], k=1)["accuracy"] == 1.0

    for reward, outcome, kind, why in (
        (0.5, {"success": True}, "graded", "quality must be a number in \\[0, 1\\], not None"),
        (0.5, {"success": True, "quality": 1.5}, "graded", "not 1.5"),
        (2.0, {"success": True}, "answer", "a reward of 2.0, outside"),
        (float("nan"), {"success": True}, "answer", "a reward of nan"),
        (1.0, {"success": True}, "scored", "outcome_kind 'scored' is not one of"),
    ):
        with pytest.raises(ValueError, match=why):
            checked_outcome("T", kind, reward, outcome)
    # records stored before the kinds: a quality made them graded
    old = EpisodeRecord("e", "id", "t", "p", 0, outcome={"success": False, "quality": 0.25, "score": 0.25})
    assert old.kind == "graded" and old.quality == 0.25


def _install_rloo(tmp_path):
    """The RLOO plug-in package (tests/plugins/mappa_rloo, 34 lines) installed as a user would: by pip, its
    estimator found through its entry point, nothing in mappa-envs edited."""
    site = tmp_path / "site"
    _pip_install(Path(__file__).parent / "plugins" / "mappa_rloo", site)
    root = Path(__file__).resolve().parents[1]
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{root}"}


def test_an_estimator_plug_in_is_found_by_its_entry_point(tmp_path):
    """A registered estimator from another package: the checks know it (and its samples-per-prompt need), and its
    advantages are RLOO's leave-one-out values."""
    env = _install_rloo(tmp_path)
    code = textwrap.dedent(
        """
        import torch
        from baselines.algorithm.advantages import AdvantageBatch, compute_advantages, estimator_spec
        from baselines.planning.checks import check_config
        from baselines.config import TrainConfig

        batch = AdvantageBatch(rewards=torch.tensor([1.0, 0.0, 0.5, 0.2]), outcomes=torch.zeros(4),
                               mask=torch.ones(4, 2), group_ids=["a", "a", "b", "c"])
        adv = compute_advantages("rloo", batch, beta=0.0)
        print(adv[:, 0].tolist(), estimator_spec("rloo").min_samples_per_prompt)
        for n in (1, 2):
            cfg = TrainConfig(estimator="rloo", samples_per_prompt=n, model="tiny-random", memory_check=False)
            print([c.detail for c in check_config(cfg, roles=["r"], n_tasks=64) if c.name == "estimator"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "[1.0, -1.0, 0.0, 0.0] 2"  # 1 - 0, 0 - 1; groups b and c have one action: no baseline
    assert "rloo needs samples_per_prompt >= 2" in lines[1] and lines[2] == "['rloo, 2 samples per prompt']"


@pytest.mark.slow
def test_mappa_ablate_compares_a_plug_in_with_a_built_in(tmp_path):
    """Issue 19's plug-ins through `mappa ablate --arms coach,rloo`: RLOO from its own package trained on the
    smoke preset beside the built-in coach REINFORCE++, then one report. On the single-process trainer: the
    estimator is the same code on both trainers, and `.ci/run` runs `mappa ablate --preset smoke` on the distributed
    one (Ray, vLLM, DeepSpeed)."""
    env = _install_rloo(tmp_path)
    out = tmp_path / "ablation"
    cmd = [sys.executable, "-m", "benchmarks.cli", "ablate", "--preset", "smoke", "--trainer", "local", "--no-resume"]
    cmd += ["--arms", "coach,rloo", "--samples-per-prompt", "2", "--out", str(out)]
    proc = subprocess.run(cmd, env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    for arm in ("coach", "rloo"):
        metrics = [json.loads(ln) for ln in (out / arm / "seed-0" / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 2 and json.loads((out / arm / "seed-0" / "config.json").read_text())["estimator"] == (
            "reinforce_pp" if arm == "coach" else "rloo"
        )
    assert any(m["problem_solver"]["skipped"] == 0 for m in metrics)  # rloo's advantages moved a role
    assert "rloo" in (out / "report" / "report.md").read_text()
