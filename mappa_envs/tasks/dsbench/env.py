"""DSBench-v0: a data engineer, a modeler and an analyst solve a Kaggle-style modeling task in one workspace.

==================  ==================================================================================
id                  ``mappa/DSBench-v0``
agents              ``data_engineer_0``, ``modeler_0``, ``analyst_0`` (up to 4 turns each, all run Python)
workspace           one per episode, kept across every agent and turn; it starts with ``train.csv``,
                    ``test.csv`` and ``sample_submission.csv`` (never the test answers)
artifacts           data engineer: ``X_train.pkl``, ``y_train.pkl``, ``X_test.pkl``; modeler: ``model.pkl``;
                    analyst: ``submission.csv`` (the contract is in every role's prompt)
observation         text: the agent's system prompt, the task, earlier agents' outputs and tool results
action              text: the agent's reply; its ```python blocks run in the sandbox; a reply without code
                    ends the agent's turns
reward              at the end, to every agent: the submission's normalised quality in [0, 1]
                    (``reward="success"``: 1.0 for a valid submission)
terminal infos      ``valid``, ``reason``, ``metric``, ``value``, ``baseline``, ``quality``, ``success``,
                    ``beats_baseline``, ``rows``, ``summary``
==================  ==================================================================================

The submission is scored on the host from ``submission.csv`` only (:mod:`.scoring`): nothing an agent wrote is
unpickled outside the sandbox. The sandbox is ``auto`` by default (unless ``$MAPPA_SANDBOX`` names another): Docker
where an engine runs, else bubblewrap, else plain subprocesses (with a warning); the backend used is in
``record.metadata["sandbox"]``.

Arguments: ``suite`` (``lite``: the bundled DSBench-lite, built on first use; ``dsbench``: the original DSBench
data, which needs ``data_dir``), ``split`` (``train``, ``eval`` or ``all``), ``task_ids`` (a subset),
``tasks`` (a list of :class:`DSTask`), ``turns`` (per role), ``reward``, ``prompt_style`` (original DSBench:
``cleaned`` or ``original`` descriptions), ``role_prompts`` (``"paper"``, the default: the full hand-over contract
in every role's prompt; ``"small"``: one worked example per role on a made-up task, for small models),
``sandbox``, ``sandbox_kwargs`` (default limits: 120 s, 2 GB per execution) and the text limits of
:class:`~mappa_envs.core.PipelineEnv`.

Held-out tasks (:meth:`DSBenchEnv.heldout_kwargs`): split ``eval`` of the same suite and data folder, for a run
that trains on split ``train``.

Version history: v0, initial release.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandboxes import Limits, Sandbox

from ...core import PYTHON_TOOL, EpisodeRecord, PipelineEnv, Role, Task
from ...heldout import pick_split
from . import prompts
from .lite import load_lite
from .scoring import score_workspace
from .tasks import DSTask, load_dsbench

DEFAULT_LIMITS = Limits(timeout_s=120.0, memory_mb=2048, cpus=1.0, pids=64, output_bytes=16_384, file_size_mb=256)


def dsbench_roles(turns: int = 4, role_prompts: str = "paper") -> tuple[Role, ...]:
    """The three roles with the prompts of ``role_prompts`` (:data:`prompts.ROLE_PROMPTS`): ``"paper"``, the
    contract-in-full prompts; ``"small"``, short instructions with one worked example each, for small models."""
    if role_prompts not in prompts.ROLE_PROMPTS:
        raise ValueError(f"role_prompts must be one of {prompts.ROLE_PROMPTS}, not {role_prompts!r}")
    small = role_prompts == "small"
    prefix = "SMALL_" if small else ""

    def role(name: str) -> Role:
        upper = name.upper()
        return Role(
            name,
            getattr(prompts, f"{prefix}{upper}_SYSTEM").replace("{turns}", str(turns)),
            getattr(prompts, f"{prefix}{upper}_INSTRUCTION"),
            max_turns=turns,
            tools=(PYTHON_TOOL,),
            continue_instruction=prompts.SMALL_CONTINUE if small else prompts.CONTINUE,
            examples=prompts.SMALL_EXAMPLES[name] if small else (),
        )

    return tuple(role(name) for name in ("data_engineer", "modeler", "analyst"))


class DSBenchEnv(PipelineEnv):
    metadata = {**PipelineEnv.metadata, "name": "dsbench_v0"}
    env_id = "mappa/DSBench-v0"
    task_type = "data_science"
    coach_template = "dsbench"
    artifacts = prompts.ARTIFACTS
    outcome_kind = "graded"  # a submission's quality in [0, 1] (scoring.Score.quality), besides its validity
    eval_suites = {"dsbench": {"suite": "lite", "split": "eval"}}  # mappa eval's default suite (mappa_envs.suites)

    def __init__(
        self,
        suite: str = "lite",
        split: str = "all",
        *,
        data_dir: str | Path | None = None,
        tasks: Sequence[DSTask] | None = None,
        task_ids: Sequence[str] | None = None,
        turns: int = 4,
        reward: str = "quality",
        prompt_style: str = "cleaned",
        role_prompts: str = "paper",
        sandbox: str | Sandbox | None = None,
        sandbox_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        if reward not in ("quality", "success"):
            raise ValueError(f"reward must be 'quality' or 'success', not {reward!r}")
        if tasks is not None:
            ds = list(tasks)
        elif suite == "lite":
            ds = load_lite(split, root=data_dir).tasks
        elif suite == "dsbench":
            if data_dir is None:
                raise ValueError(
                    "suite='dsbench' needs data_dir=<folder with data_resplit/ and answers/ of the DSBench release>"
                )
            ds = load_dsbench(data_dir, split, prompt_style).tasks
        else:
            raise ValueError(f"suite must be 'lite' or 'dsbench', not {suite!r}")
        if task_ids is not None:
            by_id = {t.id: t for t in ds}
            unknown = [i for i in task_ids if i not in by_id]
            if unknown:
                raise KeyError(f"unknown DSBench task ids {unknown}; available: {sorted(by_id)}")
            ds = [by_id[i] for i in task_ids]
        self.suite, self.split, self.reward_kind, self.role_prompts = suite, split, reward, role_prompts
        self.ds_tasks: dict[str, DSTask] = {t.id: t for t in ds}
        if sandbox is None or isinstance(sandbox, str):
            sandbox_kwargs = {"limits": DEFAULT_LIMITS, **(sandbox_kwargs or {})}
        super().__init__(
            dsbench_roles(turns, role_prompts),
            [t.to_task() for t in ds],
            sandbox=sandbox,
            **kwargs,
            sandbox_kwargs=sandbox_kwargs,
        )

    @classmethod
    def heldout_kwargs(cls, train_kwargs: Mapping[str, Any], split: str | None = None) -> dict[str, Any] | None:
        """Split ``eval`` (or ``split`` when it is ``train`` or ``eval``) of the same suite, data folder and settings;
        none when training on given ``tasks`` or on ``all`` (the default), or on ``eval`` without a split asked for."""
        train = train_kwargs.get("split", "all")
        if train_kwargs.get("tasks") is not None or train == "all":  # "all" holds every split's tasks
            return None
        default = "eval" if train == "train" else None
        chosen = pick_split(cls.env_id, split, train=train, splits=("train", "eval", "all"), default=default)
        if chosen is None:
            return None
        if chosen == "all":
            raise ValueError(f"{cls.env_id}: split 'all' holds the training tasks too; it is not held out")
        return {**{k: v for k, v in train_kwargs.items() if k != "task_ids"}, "split": chosen}

    @classmethod
    def suite_kwargs(cls, split: str) -> dict[str, Any]:
        """``dsbench:<split>``: that split of DSBench-lite."""
        return {"suite": "lite", "split": split}

    def ds_task(self, task: Task | None = None) -> DSTask:
        """The host-side :class:`DSTask` of ``task`` (default: the current episode's)."""
        task = task or self.task
        if task is None:
            raise RuntimeError("call reset() first")
        return self.ds_tasks[task.id]

    def task_prompt(self, task: Task) -> str:
        ds = self.ds_tasks[task.id]
        files = ", ".join(ds.workspace_files())
        return f"{task.prompt.strip()}\n\n## Workspace\nThe current directory starts with: {files}."

    def on_episode_start(self, task: Task) -> None:
        assert self.record is not None
        written = {}
        for name, path in self.ds_tasks[task.id].workspace_files().items():
            data = Path(path).read_bytes()
            self.session.write_file(name, data)
            written[name] = len(data)
        self.record.metadata["workspace_files"] = written

    def grade(self, task: Task, record: EpisodeRecord) -> tuple[float, dict[str, Any]]:
        ds = self.ds_tasks[task.id]
        score = score_workspace(ds, self.session)
        reward = score.quality if self.reward_kind == "quality" else float(score.success)
        return reward, {**score.outcome(), "task_type": ds.task_type, "summary": score.summary()}


__all__ = ["DEFAULT_LIMITS", "DSBenchEnv", "dsbench_roles"]
