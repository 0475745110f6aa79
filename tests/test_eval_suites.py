"""`mappa eval --suites` over any registered task (issue 32, item 3): suites come from the registry and the tasks'
declarations (mappa_envs.suites); the example task SQLQuery-v0 is evaluated as the built-in ones are, with intervals,
and a plugged-in task's sealed split is refused without --unseal-test and logged with it."""

import json
import re

import pytest

import mappa_envs
from baselines.evaluation.evaluate import EvalConfig, evaluate, suite_env
from mappa_envs.core import PipelineEnv, Role, ScriptedPolicy, Task
from mappa_envs.metrics import wilson_interval
from mappa_envs.suites import resolve_suite
from mappa_envs.tasks.sql_query import sql_tasks

EVAL = sql_tasks(0, "eval")


def _sql_team():
    """The query writer runs the reference query, then states its result; the answerer boxes the answer of every
    task of an even index, a wrong one otherwise (so the team is right on half the problems)."""

    def task_of(conversation):
        text = "\n".join(m["content"] for m in conversation)
        return next((i, t) for i, t in enumerate(EVAL) if t.prompt in text)

    def writer(conversation):
        _, task = task_of(conversation)
        if "That is your query's result" in conversation[-1]["content"]:
            return f"The answer is {task.answer}."
        return f"```sql\n{task.metadata['reference_sql']}\n```"

    def answerer(conversation):
        i, task = task_of(conversation)
        return f"\\boxed{{{task.answer if i % 2 == 0 else -1}}}"

    return {"query_writer": ScriptedPolicy(writer), "answerer": ScriptedPolicy(answerer)}


def test_mappa_eval_evaluates_the_sql_task_with_intervals(tmp_path, monkeypatch, capsys):
    import baselines.evaluation.teams
    from benchmarks.cli import main

    monkeypatch.setattr(baselines.evaluation.teams, "build_policies", lambda team, cfg, engines=None: _sql_team())
    out = tmp_path / "eval"
    argv = ["eval", "--suites", "sql:eval", "sql", "-k", "2", "--limit", "4", "--sandbox", "subprocess"]
    assert main([*argv, "--concurrency", "4", "--out", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    s = result["suites"]["sql:eval"]
    assert s["env_id"] == "mappa/SQLQuery-v0" and s["env_kwargs"]["split"] == "eval"
    assert s["kind"] == "answer" and (s["episodes"], s["problems"], s["k"]) == (8, 4, 2)
    assert s["correct"] == 4 and s["solved_at_least_once"] == 2
    assert s["ci95"] == pytest.approx(list(wilson_interval(4, 8))) and s["ci95"][0] < 0.5 < s["ci95"][1]
    assert s["task_ids"] == [f"sql-0-eval/{i // 2}" for i in range(8)]
    assert set(s["behaviour"]) == {"query_writer", "answerer"}
    writer = s["behaviour"]["query_writer"]
    assert writer["tool_call_rate"] == 0.5 and writer["tool_success_rate"] == 1.0  # a query, then the answer
    assert result["suites"]["sql"]["task_ids"] == s["task_ids"]  # `sql` alone: its held-out split, eval
    assert len((out / "sql-eval.jsonl").read_text().splitlines()) == 8 and (out / "sql.jsonl").exists()
    printed = capsys.readouterr().out
    lo, hi = s["ci95"]
    assert f"accuracy 50.0% [{lo:.1%}, {hi:.1%}]" in printed and "query_writer" in printed


def test_suite_names_resolve_for_the_built_in_and_the_plugged_in_tasks(tmp_path):
    cfg = EvalConfig()
    assert suite_env("aime", cfg) == ("mappa/MathChat-v0", {"split": "aime-eval-32"})
    assert suite_env("dsbench:train", cfg) == ("mappa/DSBench-v0", {"suite": "lite", "split": "train"})
    assert suite_env("sql", cfg) == suite_env("sql:eval", cfg) == ("mappa/SQLQuery-v0", {"split": "eval"})
    assert suite_env("mappa/SQLQuery-v0:train", cfg) == ("mappa/SQLQuery-v0", {"split": "train"})
    # extra arguments for every suite of a task, by its name (or env id), then a suite's own
    cfg = EvalConfig(sandbox="subprocess", env_kwargs={"sql": {"query_turns": 1, "seed": 2}, "sql:eval": {"seed": 3}})
    assert suite_env("sql:eval", cfg)[1] == {"split": "eval", "sandbox": "subprocess", "query_turns": 1, "seed": 3}
    with pytest.raises(ValueError, match=r"unknown suite 'gsm8k'.*sql\[:<split>\]"):
        suite_env("gsm8k", cfg)
    # a name two envs claim is the first registered's; the other is reached by its id
    mappa_envs.register("test/SQLCopy-v0", "mappa_envs.tasks.sql_query:SQLQueryEnv", {"seed": 1}, override=True)
    try:
        assert resolve_suite("sql:eval").env_id == "mappa/SQLQuery-v0"
        copy = resolve_suite("test/SQLCopy-v0")
        assert (copy.env_id, copy.kwargs, copy.task) == ("test/SQLCopy-v0", {"seed": 1, "split": "eval"}, "sql")
    finally:
        mappa_envs.registry.pop("test/SQLCopy-v0")


def test_a_plugin_that_fails_to_load_is_warned_and_named_not_hidden():
    """An env whose entry point does not import is left out of the suite names (the others still resolve), with a
    warning naming it and its error, and named again when a suite is not found."""
    from mappa_envs import suites

    mappa_envs.register("test/Broken-v0", "mappa_envs.no_such_module:Env", override=True)
    try:
        with pytest.warns(RuntimeWarning, match=r"'test/Broken-v0'.*ModuleNotFoundError.*no_such_module"):
            assert resolve_suite("sql:eval").env_id == "mappa/SQLQuery-v0"
        assert "ModuleNotFoundError" in suites.LOAD_ERRORS["test/Broken-v0"]
        with pytest.raises(ValueError, match=r"unknown suite 'gsm8k'.*test/Broken-v0 failed to load \(Module"):
            resolve_suite("gsm8k")
        with pytest.raises(ModuleNotFoundError, match="no_such_module"):  # by its own name: the import's error
            resolve_suite("broken")
    finally:
        mappa_envs.registry.pop("test/Broken-v0")
        suites.LOAD_ERRORS.pop("test/Broken-v0", None)


class _Tiny(PipelineEnv):
    """A plugged-in task with a sealed split that it does not refuse itself: the evaluation refuses it."""

    env_id = "test/Tiny-v0"
    sealed_splits = ("test",)

    def __init__(self, split: str = "train", unseal: bool = False, **kwargs):
        tasks = [Task(f"{split}/{i}", f"Say {split}-{i}.", f"{split}-{i}") for i in range(4)]
        super().__init__([Role("sayer", "Say what you are asked.", "Say it.")], tasks, **kwargs)

    @classmethod
    def heldout_kwargs(cls, train_kwargs, split=None):
        return {**train_kwargs, "split": "dev"} if train_kwargs.get("split", "train") == "train" else None

    def grade(self, task, record):
        ok = record.actions[-1].output.strip() == task.answer
        return float(ok), {"success": ok}


@pytest.fixture
def tiny():
    mappa_envs.register("test/Tiny-v0", _Tiny, override=True)
    yield
    mappa_envs.registry.pop("test/Tiny-v0", None)


def test_a_plugged_in_tasks_sealed_split_is_refused_unless_unsealed_and_logged(tiny, tmp_path, monkeypatch):
    from mappa_envs.sealed import SealedSplit, read_access_log

    monkeypatch.setenv("MAPPA_TEST_ACCESS_LOG", str(tmp_path / "access.jsonl"))
    say = ScriptedPolicy(lambda c: re.findall(r"Say (\w+-\d)\.", "\n".join(m["content"] for m in c))[-1])
    cfg = EvalConfig(suites=("tiny", "tiny:test"), sandbox="subprocess")
    with pytest.raises(SealedSplit, match="sealed test split"):
        evaluate(say, cfg, log=lambda _: None)
    with pytest.raises(SealedSplit):  # an argument cannot unseal it either: only unseal_test does
        suite_env("tiny:test", EvalConfig(env_kwargs={"tiny": {"unseal": True}}))
    assert read_access_log() == []
    cfg.unseal_test = True
    result = evaluate(say, cfg, out_dir=tmp_path / "eval", log=lambda _: None)
    dev, test = result["suites"]["tiny"], result["suites"]["tiny:test"]
    assert dev["env_kwargs"]["split"] == "dev" and dev["correct"] == 4  # `tiny` alone: its held-out tasks
    assert test["accuracy"] == 1.0 and test["ci95"] == pytest.approx(list(wilson_interval(4, 4)))
    (line,) = read_access_log()  # the sealed suite only
    assert (line["env_id"], line["split"], line["episodes"], line["correct"]) == ("test/Tiny-v0", "test", 4, 4)
    assert line["result_file"] == str(tmp_path / "eval" / "eval.json")


def test_a_task_without_heldout_tasks_is_evaluated_on_a_named_split(tiny):
    class NoHeldOut(_Tiny):
        sealed_splits = ()
        eval_names = ("plain",)

        @classmethod
        def heldout_kwargs(cls, train_kwargs, split=None):
            return None

    mappa_envs.register("test/Plain-v0", NoHeldOut, override=True)
    try:
        with pytest.raises(ValueError, match=r"declares no held-out tasks.*plain:<split>"):
            resolve_suite("plain")
        assert resolve_suite("plain:dev").kwargs == {"split": "dev"}
    finally:
        mappa_envs.registry.pop("test/Plain-v0")


def test_task_arguments_reach_any_tasks_suites_and_none_is_dropped(tmp_path, capsys):
    """``--env-arg TASK:KEY=VALUE`` reaches every suite of that task (a task name, another name of it, or its env
    id); a bare ``KEY=VALUE`` goes to the one task of the suites and is refused when they span several, or when
    TASK has no suite, instead of being dropped; a run of the SQL task passes its own arguments; the old spellings
    (``--dsbench-arg``, ``--task-arg``) still work and warn."""
    import argparse

    from benchmarks.commands import evaluate as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())

    def config(*argv):
        return command._eval_config(parser.parse_args(["eval", *argv]))

    cfg = config("--suites", "sql", "sql:eval", "--env-arg", "sql:query_turns=1")
    assert suite_env("sql", cfg) == ("mappa/SQLQuery-v0", {"split": "eval", "query_turns": 1})
    assert suite_env("sql:eval", cfg)[1]["query_turns"] == 1
    assert suite_env("sql", config("--suites", "sql", "--env-arg", "query_turns=3"))[1]["query_turns"] == 3
    cfg = config("--suites", "sql", "--env-arg", "mappa/SQLQuery-v0:query_turns=2")
    assert suite_env("sql", cfg)[1]["query_turns"] == 2
    cfg = config("--suites", "aime", "dsbench", "--env-arg", "mathchat:turns=2", "--env-arg", "dsbench:x=a:b")
    assert cfg.mathchat_kwargs == {"turns": 2} and cfg.dsbench_kwargs == {"x": "a:b"}  # a value may hold ':'
    assert config("--suites", "aime", "--env-arg", "tasks:turns=2").mathchat_kwargs == {"turns": 2}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env_id": "mappa/SQLQuery-v0", "env_kwargs": {"query_turns": 2}}))
    assert suite_env("sql", config("--suites", "sql", "--run", str(run)))[1]["query_turns"] == 2
    cfg = config("--suites", "sql", "--run", str(run), "--env-arg", "sql:query_turns=1")
    assert suite_env("sql", cfg)[1]["query_turns"] == 1  # the flag over the run's own
    with pytest.raises(SystemExit, match=r"are of the tasks \['dsbench', 'mathchat'\]; say which"):
        config("--suites", "aime", "dsbench", "--env-arg", "turns=2")
    with pytest.raises(SystemExit, match="no suite is of the task 'mathchat'"):
        config("--suites", "sql", "--env-arg", "mathchat:turns=2")
    with pytest.raises(SystemExit, match="takes \\[TASK:\\]KEY=VALUE, not 'query_turns'"):
        config("--suites", "sql", "--env-arg", "query_turns")
    capsys.readouterr()
    cfg = config("--suites", "sql", "dsbench", "--task-arg", "sql:query_turns=1", "--dsbench-arg", "x=1")
    assert suite_env("sql", cfg)[1]["query_turns"] == 1 and cfg.dsbench_kwargs == {"x": 1}
    err = capsys.readouterr().err
    assert "--task-arg is an old spelling of --env-arg TASK:KEY=VALUE; use --env-arg sql:query_turns=1" in err
    assert "use --env-arg dsbench:x=1" in err and "--dsbench-arg" not in parser.format_help()
