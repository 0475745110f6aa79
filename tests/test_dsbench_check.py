"""The hand-over check (mappa_envs.tasks.dsbench.check): run in the sandbox after an action that touched a contract
file, recorded on the action and in the JSON lines, read by the DSBench coaches (live and in ``mappa rescore``); the
level of a ladder episode taken from its tasks and its record."""

import pytest

import mappa_envs
from mappa_envs.coach import rescore
from mappa_envs.coach.protocol import inputs_for_episode
from mappa_envs.coach.rescore import coach_from_spec
from mappa_envs.core import read_jsonl, write_jsonl
from mappa_envs.tasks.dsbench import DSBenchEnv
from mappa_envs.tasks.dsbench.ladder import load_level

JUNK = (
    "```python\nfor p in ('X_train.pkl', 'y_train.pkl', 'X_test.pkl'):\n    open(p, 'w').write('x')\n"
    "print((258, 7), (86, 7))\n```"
)
LOOK = "```python\nimport pandas as pd\nprint(pd.read_csv('train.csv').shape)\n```"


def play(env, team: dict[str, list[str]]):
    """Run one episode of ``env`` with each role's replies in order (a reply without code once they run out)."""
    env.reset(seed=0)
    for agent in env.agent_iter():
        _, _, done, cut, _ = env.last()
        replies = team.get(env.unwrapped.role(agent).name, [])
        env.step(None if done or cut else (replies.pop(0) if replies else "Done."))
    return env.unwrapped.record


def test_junk_pickles_are_found_by_the_sandbox_check_and_rescored_low(tmp_path):
    """'x' written into the three pickles, with the right shapes printed, scored 10/10: the check now loads them in
    the sandbox, the record keeps what it found, and a re-score from the JSON lines reads it."""
    env = mappa_envs.make("mappa/DSBench-v0", split="eval", task_ids=["penguin-species"], turns=2, sandbox="subprocess")
    record = play(env, {"data_engineer": [LOOK, JUNK]})
    env.close()
    look, junk = record.actions[0], record.actions[1]
    assert "workspace_check" not in look.info  # it touched no contract file: no check, no cost
    check = junk.info["workspace_check"]
    assert check["status"] == "ok" and check["seconds"] < 60
    for p in ("X_train.pkl", "y_train.pkl", "X_test.pkl"):
        entry = check["files"][p]
        assert entry["present"] and not entry["ok"] and "does not load" in entry["problems"][0], entry
    write_jsonl(tmp_path / "episodes.jsonl", [record])
    kwargs = {"mappa/DSBench-v0": {"split": "eval", "sandbox": "subprocess"}}
    rescore(
        tmp_path / "episodes.jsonl", coach_from_spec("dsbench-rule"), tmp_path / "out", env_kwargs=kwargs, log=print
    )
    (stored,) = read_jsonl(tmp_path / "out" / "trajectories.jsonl")
    scores = [a.evaluation("rescored").score for a in stored.actions]
    assert scores[1] <= 5, scores
    modeler = next(a for a in stored.actions if a.role == "modeler")
    assert "blocked" in modeler.evaluation("rescored").reasoning


REMOVE = "```python\nimport os\nos.remove('X_test.pkl')\nprint('removed')\n```"
REWRITE = "```python\nimport pandas as pd\npd.read_pickle('X_train.pkl').iloc[:10].to_pickle('X_train.pkl')\n```"


@pytest.mark.parametrize("reply, path", [(REMOVE, "X_test.pkl"), (REWRITE, "X_train.pkl")])
def test_level_0_given_files_must_stay_intact(reply, path):
    env = mappa_envs.make(
        "mappa/DSBench-v0", split="level0-eval", task_ids=["penguin-species"], turns=1, sandbox="subprocess"
    )
    record = play(env, {"data_engineer": [reply]})
    env.close()
    entry = record.actions[0].info["workspace_check"]["files"][path]
    assert entry["given"] and not entry["ok"] and "keep it intact" in entry["problems"][0]
    coach = coach_from_spec("dsbench-rule")
    env = mappa_envs.make("mappa/DSBench-v0", split="level0-eval", sandbox="subprocess").unwrapped
    inp = inputs_for_episode(
        record,
        record.actions[0],
        task_type="classification",
        template="dsbench",
        final_agent="analyst_0",
        is_final=False,
        artifacts=env.artifacts_for(record),
        tools=("python",),
    )
    assert coach.evaluate(inp).score <= 3
    env.close()


def test_the_level_comes_from_the_tasks_and_the_record():
    """make(tasks=load_level("level0-eval")) was level 2 (the full data engineer contract, no pickles written, the
    prompt saying they are given); a re-score built the contract from its env arguments, not the record's level."""
    tasks = load_level("level0-eval")
    env = mappa_envs.make("mappa/DSBench-v0", tasks=tasks, sandbox="subprocess").unwrapped
    assert env.level == 0 and env.artifacts["data_engineer"] == ()
    with pytest.raises(ValueError, match="several ladder levels"):
        DSBenchEnv(tasks=[*tasks, *load_level("level1-eval")], sandbox="subprocess")
    env.reset(seed=0, options={"task_id": "penguin-species"})
    assert {"X_train.pkl", "X_test.pkl"} <= set(env.session.files())
    top = mappa_envs.make("mappa/DSBench-v0", split="eval", sandbox="subprocess").unwrapped
    assert top.artifacts_for(env.record)["data_engineer"] == ()  # the record's level, not the env's
    env.close()
    top.close()
