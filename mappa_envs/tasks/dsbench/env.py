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
terminal infos      ``valid``, ``reason``, ``stage`` (where an invalid one failed), ``metric``, ``value``,
                    ``baseline``, ``quality``, ``success``, ``beats_baseline``, ``rows``, ``summary``
action info         ``workspace_check``: after an action that wrote, changed or deleted a contract file, what
                    the hand-over check found, run in the sandbox (:mod:`.check`: each file loaded, its rows,
                    columns and problems; the given files' hashes at ladder level 0)
==================  ==================================================================================

The submission is scored on the host from ``submission.csv`` only (:mod:`.scoring`): nothing an agent wrote is
unpickled outside the sandbox. The sandbox is ``auto`` by default (unless ``$MAPPA_SANDBOX`` names another): Docker
where an engine runs, else bubblewrap, else plain subprocesses (with a warning); the backend used is in
``record.metadata["sandbox"]``.

The ladder level is the tasks' own (``extra["level"]``; tasks of several levels are refused), and each record keeps
it (``metadata["level"]``), so a re-score applies that level's contract (:meth:`DSBenchEnv.artifacts_for`).

Arguments: ``suite`` (``lite``: the bundled DSBench-lite, built on first use; ``dsbench``: the original DSBench
data, which needs ``data_dir``), ``split`` (``train``, ``eval`` or ``all``; DSBench-lite's difficulty ladder adds
``level0-train``, ``level0-eval``, ... ``level2-*`` = the plain splits: :mod:`.ladder`), ``task_ids`` (a subset),
``tasks`` (a list of :class:`DSTask`), ``turns`` (per role), ``reward``, ``prompt_style`` (original DSBench:
``cleaned`` or ``original`` descriptions), ``role_prompts`` (``"paper"``, the default: the full hand-over contract
in every role's prompt; ``"small"``: one worked example per role on a made-up task, for small models), ``handoff``
(``"code"``, the default: later roles see the earlier roles' replies and what their code printed; ``"results"``:
only what it printed, as small models copy the nearest code: :data:`~mappa_envs.core.HANDOFFS`),
``sandbox``, ``sandbox_kwargs`` (default limits: 120 s, 2 GB per execution; warm execution: each block is forked
from a worker that has imported numpy, pandas, scipy and scikit-learn once per episode, instead of importing them
again in a fresh interpreter; ``{"mode": "fresh"}`` for the latter) and the text limits of
:class:`~mappa_envs.core.PipelineEnv`.

Held-out tasks (:meth:`DSBenchEnv.heldout_kwargs`): split ``eval`` of the same suite and data folder, for a run
that trains on split ``train`` (``levelK-eval`` for ``levelK-train``).

Version history: v0, initial release; the ladder's ``levelK-*`` splits were added later (the plain splits are
unchanged), then the hand-over check and the outcome's ``stage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sandboxes import Limits, Sandbox

from ...core import PYTHON_TOOL, ActionRecord, EpisodeRecord, PipelineEnv, Role, Task
from ...heldout import pick_split
from . import check, ladder, prompts
from .scoring import score_workspace
from .tasks import DSTask, load_dsbench

DEFAULT_LIMITS = Limits(timeout_s=120.0, memory_mb=2048, cpus=1.0, pids=64, output_bytes=16_384, file_size_mb=256)


def dsbench_roles(
    turns: int = 4, role_prompts: str = "paper", level: int = ladder.TOP_LEVEL, handoff: str = "code"
) -> tuple[Role, ...]:
    """The three roles with the prompts of ``role_prompts`` (:data:`prompts.ROLE_PROMPTS`): ``"paper"``, the
    contract-in-full prompts; ``"small"``, short instructions with one worked example each, for small models (the
    examples laid out for the env's ``handoff``: :func:`prompts.small_examples`). At ladder ``level`` 0 the data
    engineer checks the given files instead of writing them (:mod:`.ladder`)."""
    if role_prompts not in prompts.ROLE_PROMPTS:
        raise ValueError(f"role_prompts must be one of {prompts.ROLE_PROMPTS}, not {role_prompts!r}")
    small = role_prompts == "small"
    prefix = "SMALL_" if small else ""
    examples = prompts.small_examples(level, handoff) if small else {}

    def role(name: str) -> Role:
        upper = name.upper()
        given = level == 0 and name == "data_engineer"
        system = getattr(prompts, f"{prefix}{'GIVEN_' if given else ''}{upper}_SYSTEM")
        if level == 0:
            system = system.replace(*prompts.GIVEN_CONTRACT_LINE)
        return Role(
            name,
            system.replace("{turns}", str(turns)),
            getattr(prompts, f"{prefix}{'GIVEN_' if given else ''}{upper}_INSTRUCTION"),
            max_turns=turns,
            tools=(PYTHON_TOOL,),
            continue_instruction=prompts.SMALL_CONTINUE if small else prompts.CONTINUE,
            examples=examples.get(name, ()),
        )

    return tuple(role(name) for name in ("data_engineer", "modeler", "analyst"))


def task_level(tasks: Sequence[DSTask]) -> int:
    """The ladder level of ``tasks`` (``extra["level"]``; the top level when unset); tasks of several levels are
    refused: the hand-over contract and the prompts are one level's."""
    levels = {int(t.extra.get("level", ladder.TOP_LEVEL)) for t in tasks}
    if len(levels) > 1:
        raise ValueError(f"DSBench tasks of several ladder levels {sorted(levels)}: give one level's tasks")
    return levels.pop() if levels else ladder.TOP_LEVEL


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
            ds = ladder.load_level(split, root=data_dir)
        elif suite == "dsbench":
            if data_dir is None:
                raise ValueError(
                    "suite='dsbench' needs data_dir=<folder with data_resplit/ and answers/ of the DSBench release>"
                )
            if split not in ladder.PARTS:
                raise ValueError(f"the ladder's splits are DSBench-lite's; suite 'dsbench' takes {ladder.PARTS}")
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
        self.level = task_level(ds)
        self.artifacts = ladder.artifacts(self.level)
        self.ds_tasks: dict[str, DSTask] = {t.id: t for t in ds}
        self._row_counts: dict[str, tuple[int, int]] = {}
        self._given_sha256: dict[str, str] = {}
        if sandbox is None or isinstance(sandbox, str):
            sandbox_kwargs = {"limits": DEFAULT_LIMITS, "mode": "warm", **(sandbox_kwargs or {})}
        super().__init__(
            dsbench_roles(turns, role_prompts, self.level, kwargs.get("handoff", "code")),
            [t.to_task() for t in ds],
            sandbox=sandbox,
            **kwargs,
            sandbox_kwargs=sandbox_kwargs,
        )

    @classmethod
    def heldout_kwargs(cls, train_kwargs: Mapping[str, Any], split: str | None = None) -> dict[str, Any] | None:
        """Split ``eval`` (``levelK-eval`` for ``levelK-train``; or ``split`` when it is another split) of the same
        suite, data folder and settings; none when training on given ``tasks`` or on ``all`` (the default), or on
        ``eval`` without a split asked for. The training tasks at another ladder level are refused: not held out."""
        train = train_kwargs.get("split", "all")
        if train_kwargs.get("tasks") is not None or train.endswith("all"):  # "all" holds every split's tasks
            return None
        chosen = pick_split(cls.env_id, split, train=train, splits=ladder.SPLITS, default=ladder.heldout_split(train))
        if chosen is None:
            return None
        if chosen.endswith("all"):
            raise ValueError(f"{cls.env_id}: split 'all' holds the training tasks too; it is not held out")
        if ladder.parse_split(chosen)[1] == ladder.parse_split(train)[1]:  # the same tasks at another level
            raise ValueError(
                f"{cls.env_id}: split {chosen!r} holds the training tasks of {train!r}; it is not held out"
            )
        return {**{k: v for k, v in train_kwargs.items() if k != "task_ids"}, "split": chosen}

    @classmethod
    def suite_kwargs(cls, split: str) -> dict[str, Any]:
        """``dsbench:<split>``: that split of DSBench-lite."""
        return {"suite": "lite", "split": split}

    def artifacts_for(self, record: EpisodeRecord) -> dict[str, tuple[str, ...]]:
        """The contract of ``record``'s ladder level (``metadata["level"]``); this env's for a record without one."""
        level = record.metadata.get("level")
        return dict(self.artifacts) if level is None else ladder.artifacts(int(level))

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
        written, self._given_sha256 = {}, {}
        ds = self.ds_tasks[task.id]
        for name, path in ds.workspace_files().items():
            data = Path(path).read_bytes()
            self.session.write_file(name, data)
            written[name] = len(data)
        if self.level == 0:  # the given pickles, written by the sandbox's own pandas (ladder.GIVEN_CODE)
            result = self.session.run(ladder.given_code(ds))
            if not result.ok:
                raise RuntimeError(f"{task.id}: level 0's given files could not be made: {result.stderr[-500:]}")
            files = self.session.files()
            written.update({name: files[name] for name in ladder.GIVEN})
            self.record.metadata["given_files"] = list(ladder.GIVEN)  # to keep intact (the coach's contract)
            self._given_sha256 = {n: check.sha256(self.session.read_file(n)) for n in ladder.GIVEN}
        self.record.metadata["workspace_files"] = written
        self.record.metadata["level"] = self.level

    def _rows(self, ds: DSTask) -> tuple[int, int]:
        """(train.csv rows, test.csv rows) of the task's workspace files, read on the host (its own copies)."""
        if ds.id not in self._row_counts:
            files = ds.workspace_files()
            train, test = (pd.read_csv(files[n], usecols=[ds.id_column]) for n in ("train.csv", "test.csv"))
            self._row_counts[ds.id] = (len(train), len(test))
        return self._row_counts[ds.id]

    def on_action(self, action: ActionRecord) -> None:
        """An action that wrote, changed or deleted a contract file: the hand-over check (:mod:`.check`) in the
        sandbox, recorded in ``action.info["workspace_check"]`` for the coaches."""
        changed = {c.path for call in action.tool_calls for c in call.result.files_changed}
        if not changed & set(check.CHECKED):
            return
        ds = self.ds_task()
        train_rows, test_rows = self._rows(ds)
        action.info["workspace_check"] = check.run_check(
            self.session,
            train_rows=train_rows,
            test_rows=test_rows,
            columns=[ds.id_column, *ds.target_columns],
            given_sha256=self._given_sha256 if self.level == 0 else None,
            sample=ds.sample_file,
        )

    def grade(self, task: Task, record: EpisodeRecord) -> tuple[float, dict[str, Any]]:
        ds = self.ds_tasks[task.id]
        score = score_workspace(ds, self.session)
        reward = score.quality if self.reward_kind == "quality" else float(score.success)
        return reward, {**score.outcome(), "task_type": ds.task_type, "summary": score.summary()}


__all__ = ["DEFAULT_LIMITS", "DSBenchEnv", "dsbench_roles"]
