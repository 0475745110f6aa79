"""DSBench-lite's difficulty ladder (issue 33): split names, each level's train and held-out tasks, the prepared files
(ids and target unchanged, scoring identical), level 0's given pickles and contract, and the reference team's valid
submission at every level; a stored ladder episode re-scored by the DSBench coaches."""

import json

import pandas as pd
import pytest

import mappa_envs
from mappa_envs.coach import rescore
from mappa_envs.coach.rescore import coach_from_spec
from mappa_envs.core import read_jsonl, write_jsonl
from mappa_envs.suites import resolve_suite
from mappa_envs.tasks.dsbench import LITE_TASKS, DSBenchEnv, load_lite, score_bytes
from mappa_envs.tasks.dsbench.ladder import LEVELS, SPLITS, TOP_LEVEL, heldout_split, load_level, parse_split
from mappa_envs.tasks.dsbench.reference import run_reference


def make_env(**kw):
    kw.setdefault("sandbox", "subprocess")
    return mappa_envs.make("mappa/DSBench-v0", **kw)


def test_split_names():
    assert parse_split("level0-eval") == (0, "eval") and parse_split("train") == (TOP_LEVEL, "train")
    assert {f"level{k}-{p}" for k in LEVELS for p in ("train", "eval")} <= set(SPLITS)
    assert heldout_split("level1-train") == "level1-eval" and heldout_split("train") == "eval"
    assert heldout_split("level1-eval") is None
    with pytest.raises(ValueError, match="level0-train"):
        parse_split("level9-train")
    with pytest.raises(ValueError, match="DSBench-lite"):
        make_env(suite="dsbench", data_dir=".", split="level0-train")


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_has_the_train_and_heldout_tasks(level):
    train, heldout = make_env(split=f"level{level}-train"), make_env(split=f"level{level}-eval")
    ids = {s: {t.id for t in e.unwrapped.tasks} for s, e in (("train", train), ("eval", heldout))}
    assert ids["train"] == {t.id for t in load_lite("train").tasks} and len(ids["eval"]) == 4
    assert not ids["train"] & ids["eval"]
    assert train.unwrapped.level == level and all(t.metadata["level"] == level for t in train.unwrapped.tasks)
    assert DSBenchEnv.heldout_kwargs({"split": f"level{level}-train", "turns": 1}) == {
        "split": f"level{level}-eval",
        "turns": 1,
    }
    with pytest.raises(ValueError, match="not held out"):  # the training tasks at another level
        DSBenchEnv.heldout_kwargs({"split": f"level{level}-train"}, "train" if level < TOP_LEVEL else "level0-train")
    assert resolve_suite(f"dsbench:level{level}-eval").kwargs == {"suite": "lite", "split": f"level{level}-eval"}
    for env in (train, heldout):
        env.close()


@pytest.mark.parametrize("task_id", sorted(s.id for s in LITE_TASKS))
def test_prepared_files_keep_ids_and_target_and_the_scoring(task_id):
    top = next(t for t in load_lite("all").tasks if t.id == task_id)
    level1 = next(t for t in load_level("level1-all") if t.id == task_id)
    train, test = pd.read_csv(level1.given["train.csv"], dtype=str), pd.read_csv(level1.given["test.csv"], dtype=str)
    raw_train, raw_test = pd.read_csv(top.train_file, dtype=str), pd.read_csv(top.test_file, dtype=str)
    assert train["id"].equals(raw_train["id"]) and test["id"].equals(raw_test["id"])
    target = top.target_columns[0]
    assert train[target].equals(raw_train[target]) and target not in test.columns
    features = test.drop(columns=["id"]).apply(pd.to_numeric)  # every feature a number, none missing
    assert not features.isna().any().any() and list(train.columns[1:-1]) == list(test.columns[1:])
    assert (level1.answer_file, level1.train_file, level1.metric) == (top.answer_file, top.train_file, top.metric)
    sample = top.sample_file.read_bytes()
    assert score_bytes(level1, sample) == score_bytes(top, sample)


def test_level_1_files_are_made_again_when_their_sources_change(tmp_path):
    """The cleaned files are stamped with what they derive from (the ladder's version, pandas', the source files'
    bytes): a stale or unstamped copy is made again, never silently used."""
    from dataclasses import replace

    from mappa_envs.tasks.dsbench.ladder import _cleaned_files

    top = next(t for t in load_lite("all").tasks if t.id == "penguin-species")
    train_path = _cleaned_files(top, tmp_path)[0]
    fresh = train_path.read_bytes()
    train_path.write_text("id,stale\n1,2\n")  # a copy left by a build from before the stamp
    (tmp_path / top.id / "source.sha256").unlink()
    assert _cleaned_files(top, tmp_path)[0].read_bytes() == fresh
    raw = tmp_path / "raw-train.csv"
    lines = top.train_file.read_text().splitlines(keepends=True)
    raw.write_text("".join(lines[:-1]))  # the source lost its last row: another derivation
    changed = replace(top, train_file=raw)
    again, _ = _cleaned_files(changed, tmp_path)
    assert len(pd.read_csv(again)) == len(lines) - 2 and not list(tmp_path.glob(".*stale*"))


def test_level_0_gives_the_data_engineers_files_and_says_so():
    env = make_env(split="level0-eval", turns=1, role_prompts="small")
    u = env.unwrapped
    assert u.artifacts["data_engineer"] == () and u.artifacts["analyst"] == ("submission.csv",)
    engineer = u.roles[0]
    assert "given" in engineer.system_prompt and "X_test.pkl" in engineer.examples[0][0]
    env.reset(seed=0)
    assert {"X_train.pkl", "y_train.pkl", "X_test.pkl"} <= set(u.record.metadata["workspace_files"])
    assert "are given" in u.observe(u.agent_selection)
    paper = make_env(split="level0-train", turns=1).unwrapped
    assert all("the data engineer writes" not in r.system_prompt for r in paper.roles)
    assert make_env(split="level1-train").unwrapped.artifacts["data_engineer"] == (
        "X_train.pkl",
        "y_train.pkl",
        "X_test.pkl",
    )
    env.close()


@pytest.mark.parametrize("level", LEVELS)
def test_the_reference_team_submits_at_every_level(level):
    env = make_env(split=f"level{level}-eval", turns=1)
    rec = run_reference(env, "penguin-species")
    assert rec.outcome["valid"] and rec.outcome["beats_baseline"], rec.outcome
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(s.id for s in LITE_TASKS))
def test_the_reference_team_submits_on_every_lite_task_at_level_0(task_id):
    """Level 0's given pickles are made from level 1's prepared files, so a valid submission here also runs level 1's
    features through a fit on every task; level 1's files themselves are checked above on every task, and its
    episode on one task (``test_the_reference_team_submits_at_every_level``)."""
    env = make_env(split="level0-all", task_ids=[task_id], turns=1)
    rec = run_reference(env, task_id)
    assert rec.outcome["valid"], (task_id, rec.outcome["reason"])
    env.close()


WEAK = {  # a weak team at level 0: the data engineer's check fails, the modeler fits, the analyst writes a bad file
    "data_engineer": "```python\nimport pandas as pd\nX = pd.read_pickle('X_train.pkl')\nprint(X['rentals'])\n```",
    "modeler": "```python\nimport pickle, pandas as pd\nfrom sklearn.tree import DecisionTreeClassifier\n"
    "X, y = pd.read_pickle('X_train.pkl'), pd.read_pickle('y_train.pkl')\n"
    "pickle.dump(DecisionTreeClassifier().fit(X, y), open('model.pkl', 'wb'))\nprint(X.shape)\n```",
    "analyst": "```python\nimport pandas as pd\npd.DataFrame({'a': [1]}).to_csv('submission.csv', index=False)\n```",
}


def test_a_stored_ladder_episode_rescored_by_each_dsbench_coach(tmp_path):
    env = make_env(split="level0-eval", task_ids=["penguin-species"], turns=1)
    env.reset(seed=0)
    for agent in env.agent_iter():
        _, _, done, cut, _ = env.last()
        env.step(None if done or cut else WEAK[env.unwrapped.role(agent).name])
    write_jsonl(tmp_path / "episodes.jsonl", [env.unwrapped.record])
    env.close()
    kwargs = {"mappa/DSBench-v0": {"split": "level0-eval", "sandbox": "subprocess"}}
    scores = {}
    for spec in ("dsbench-rule", "dsbench-rule-blind", "dsbench-rule-hindsight"):
        out = tmp_path / spec
        rescore(tmp_path / "episodes.jsonl", coach_from_spec(spec), out, env_kwargs=kwargs, log=lambda _: None)
        (record,) = read_jsonl(out / "trajectories.jsonl")
        scores[spec] = [a.evaluation("rescored").score for a in record.actions]
        assert json.loads((out / "summary.json").read_text())["fallbacks"] == 0
    assert all(len(set(s)) == 3 for s in scores.values()), scores  # no two roles alike
    assert scores["dsbench-rule-hindsight"][2] < scores["dsbench-rule"][2]  # the wrong columns are the analyst's


@pytest.mark.parametrize("level", [0, 2])
def test_results_handoff_shows_later_roles_what_earlier_code_printed_and_not_the_code(level):
    """``handoff="results"``: the modeler sees the data engineer's output, not its code (small models copy the
    nearest code); its worked example is laid out exactly as the env lays out the real context."""
    from mappa_envs.tasks.dsbench import prompts

    split = f"level{level}-train" if level != TOP_LEVEL else "train"
    env = make_env(split=split, turns=1, role_prompts="small", handoff="results")
    u = env.unwrapped
    env.reset(seed=0)
    engineer = prompts.SMALL_GIVEN_DATA_ENGINEER_REPLY if level == 0 else prompts.SMALL_DATA_ENGINEER_REPLY
    env.step(engineer.replace('"rentals"', repr(u.ds_task().target_columns[0])))
    shown = u.messages("modeler_0")[-1]["content"]
    earlier = shown.split("## Work of the earlier agents\n")[1].split("\n\n## Your job")[0]
    assert "read_pickle" not in earlier and "read_csv" not in earlier  # no code of the data engineer's
    assert earlier.startswith("### Data engineer\n### Result of running the data engineer's code\n"), earlier
    example = u.roles[1].examples[0][0]
    example_earlier = example.split("## Work of the earlier agents\n")[1].split("\n\n## Your job")[0]
    assert example_earlier.splitlines()[:3] == earlier.splitlines()[:3]  # the same headings and status line
    assert example.endswith(f"## Your job\n{u.roles[1].instruction}") and shown.endswith(u.roles[1].instruction)
    assert u.record.metadata["handoff"] == "results"
    env.close()


def test_code_handoff_is_the_default_and_a_wrong_handoff_is_refused():
    env = make_env(split="level0-train", turns=1, role_prompts="small")
    u = env.unwrapped
    env.reset(seed=0)
    reply = "```python\nprint('checked')\n```"
    env.step(reply)
    assert reply in u.messages("modeler_0")[-1]["content"] and "handoff" not in u.record.metadata
    env.close()
    with pytest.raises(ValueError, match="handoff"):
        make_env(split="level0-train", handoff="summary")


def test_results_handoff_hides_code_that_did_not_run():
    """A reply cut inside its block runs nothing; under ``handoff="results"`` its code stays out of later roles'
    view all the same (what it said outside the block is shown)."""
    env = make_env(split="level0-train", turns=1, role_prompts="small", handoff="results")
    u = env.unwrapped
    env.reset(seed=0)
    env.step("I check the files.\n```python\nimport pandas as pd\nX = pd.read_pickle('X_train.pkl')")  # left open
    env.step("```python")  # the modeler: an empty, open fence
    shown = u.messages("analyst_0")[-1]["content"]
    assert "read_pickle" not in shown and "I check the files." in shown
    assert "### Modeler\n(no result: none of its code ran, and it said nothing else)" in shown
    env.close()


@pytest.mark.parametrize("task_id", ["penguin-species", "concrete-strength"])
def test_results_handoff_examples_fit_a_task_once_adapted_and_a_copy_fails(task_id):
    """Level 0's worked examples under ``handoff="results"`` (pandas pickling) are a reachable solution: adapted to
    the task (its target, a classifier for a class) they make a valid submission; copied verbatim, none."""
    from mappa_envs.tasks.dsbench import prompts

    env = make_env(split="level0-all", task_ids=[task_id], turns=1, role_prompts="small", handoff="results")
    u = env.unwrapped
    examples = {r.name: r.examples[0][1] for r in u.roles}
    assert examples["modeler"] == prompts.PANDAS_MODELER_REPLY and "import pickle" not in examples["analyst"]
    target = u.ds_tasks[task_id].target_columns[0]
    adapted = {**examples, "analyst": examples["analyst"].replace('"rentals"', repr(target))}
    if u.ds_tasks[task_id].task_type == "classification":
        adapted["modeler"] = adapted["modeler"].replace("Regressor", "Classifier")
    for replies, valid in ((adapted, True), (examples, False)):
        env.reset(seed=0)
        for name in ("data_engineer", "modeler", "analyst"):
            env.step(replies[name])
        assert u.record.outcome["valid"] is valid, (task_id, u.record.outcome["reason"])
    env.close()
