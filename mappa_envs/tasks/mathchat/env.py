"""MathChat-v0: a problem solver, a code executor and a verifier solve a competition math problem.

==================  ==================================================================================
id                  ``mappa/MathChat-v0``
agents              ``problem_solver_0`` (1 turn), ``code_executor_0`` (up to 2 turns, runs Python),
                    ``verifier_0`` (1 turn)
observation         text: the agent's system prompt, the problem, earlier agents' outputs and tool results
                    (``env.unwrapped.messages(agent)`` gives the same as chat messages)
action              text: the agent's reply; the code executor's ```python blocks are executed in the sandbox
reward              1.0 to every agent at the end if the verifier's last ``\\boxed{}`` equals the ground truth
                    (:func:`mappa_envs.grading.math_equal`), else 0.0
terminal infos      ``predicted`` (str or None), ``answer``, ``correct`` (bool)
==================  ==================================================================================

Arguments: ``split`` (see :mod:`mappa_envs.tasks.mathchat.data`), or ``tasks`` (a list of ``Task`` or dicts with
``prompt`` and ``answer``), or ``data_file`` (JSON list / JSON lines); ``sandbox`` (backend name or instance;
default ``"auto"``: Docker, else bubblewrap, else plain subprocesses with a warning);
``code_executor_turns``; ``prompt_style`` (``"paper"``, the default: the paper's prompts, for AIME/AMC; ``"small"``:
one worked example per role, for small models, with ``arith1-*``; ``"small-balanced"``: the worked example chosen
per task so that none favours an operation, with ``arith2-*``); ``unseal`` (True to build a sealed test split,
:mod:`mappa_envs.sealed`); the text limits of :class:`~mappa_envs.core.PipelineEnv`.

Held-out tasks (:meth:`MathChatEnv.heldout_kwargs`): the split asked for (``TrainConfig.eval_split``), else the
eval split of the training split: ``aime-train`` -> ``aime-eval-32``, ``amc-train`` -> ``amc-eval-32``,
``arith-train`` -> ``arith-eval``, ``arith1-train`` -> ``arith1-eval``, ``arith2-train`` -> ``arith2-dev-1step`` (its
sealed test splits only when asked for, with ``unseal``).

Version history: v0, initial release.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core import PYTHON_TOOL, EpisodeRecord, PipelineEnv, Role, Task
from ...grading import extract_answer, extract_answer_lenient, math_equal
from ...heldout import pick_split
from ...sealed import refuse
from . import prompts
from .data import SEALED, SPLITS, load_split, load_task_file, tasks_from_rows

HELDOUT = {
    "aime-train": "aime-eval-32",
    "aime-train-512": "aime-eval-32",
    "amc-train": "amc-eval-32",
    "arith-train": "arith-eval",
    "arith1-train": "arith1-eval",
    "arith2-train": "arith2-dev-1step",
}
"""The held-out split of each training split (evaluation without an explicit ``split``)."""


def mathchat_roles(code_executor_turns: int = 2, prompt_style: str = "paper") -> tuple[Role, ...]:
    """The three roles with the prompts of ``prompt_style`` (:data:`prompts.STYLES`): ``"paper"``, the paper's
    instructions; ``"small"``, short instructions with one worked example each (numbers outside the one-operation
    pool) for small models."""
    if prompt_style not in prompts.STYLES:
        raise ValueError(f"prompt_style must be one of {prompts.STYLES}, not {prompt_style!r}")
    prefix = "SMALL_" if prompt_style.startswith("small") else ""  # the small styles: SMALL_<the paper's name>

    def text(name: str) -> str:
        return getattr(prompts, prefix + name)

    def examples(role: str) -> tuple[tuple[str, str], ...]:
        return prompts.SMALL_EXAMPLES[role] if prefix else ()

    return (
        Role(
            "problem_solver",
            text("PROBLEM_SOLVER_SYSTEM"),
            text("PROBLEM_SOLVER_INSTRUCTION"),
            examples=examples("problem_solver"),
            answers=True,
        ),
        Role(
            "code_executor",
            text("CODE_EXECUTOR_SYSTEM"),
            text("CODE_EXECUTOR_INSTRUCTION"),
            max_turns=code_executor_turns,
            tools=(PYTHON_TOOL,),
            continue_instruction=text("CODE_EXECUTOR_CONTINUE"),
            examples=examples("code_executor"),
        ),
        Role(
            "verifier",
            text("VERIFIER_SYSTEM"),
            text("VERIFIER_INSTRUCTION"),
            examples=examples("verifier"),
            answers=True,
        ),
    )


class MathChatEnv(PipelineEnv):
    metadata = {**PipelineEnv.metadata, "name": "mathchat_v0"}
    env_id = "mappa/MathChat-v0"
    task_type = "math"
    coach_template = "mathchat"
    sealed_splits = SEALED
    eval_names = ("mathchat", "tasks")  # mappa eval --suites mathchat:<split>, tasks:<file> (mappa_envs.suites)
    eval_suites = {"aime": {"split": "aime-eval-32"}, "amc": {"split": "amc-eval-32"}}

    def __init__(
        self,
        split: str = "aime-train",
        *,
        tasks: Sequence[Task | dict[str, Any]] | None = None,
        data_file: str | None = None,
        code_executor_turns: int = 2,
        prompt_style: str = "paper",
        unseal: bool = False,
        **kwargs: Any,
    ):
        if tasks is None and data_file is None and split in SEALED and not unseal:
            raise refuse(self.env_id, split)
        if tasks is not None:
            task_list = tasks_from_rows(list(tasks), source="tasks argument", prefix="custom")
        elif data_file is not None:
            task_list = load_task_file(data_file)
        else:
            task_list = list(load_split(split))
        self.split = split if tasks is None and data_file is None else None
        self.prompt_style = prompt_style
        super().__init__(mathchat_roles(code_executor_turns, prompt_style), task_list, **kwargs)

    def examples(self, role: Role, task: Task) -> tuple[tuple[str, str], ...]:
        """``small-balanced``: the worked example ``task.metadata["example"]`` picks (one-step or two-step, by
        ``metadata["steps"]``; a task without the key gets one by a hash of its id), else the role's own."""
        if self.prompt_style != "small-balanced":
            return role.examples
        pool = prompts.BALANCED_TWO_STEP if task.metadata.get("steps") == 2 else prompts.BALANCED_ONE_STEP
        index = task.metadata.get("example")
        if not isinstance(index, int):
            index = zlib.crc32(task.id.encode())
        return pool[index % len(pool)][role.name]

    @classmethod
    def heldout_kwargs(cls, train_kwargs: Mapping[str, Any], split: str | None = None) -> dict[str, Any] | None:
        """The split asked for (any MathChat split but the training one), else the training split's eval split
        (:data:`HELDOUT`); ``tasks`` and ``data_file`` are dropped: the held-out tasks are a bundled split."""
        custom = train_kwargs.get("tasks") is not None or train_kwargs.get("data_file") is not None
        train = None if custom else train_kwargs.get("split", "aime-train")
        default = HELDOUT.get(train) if train else None
        chosen = pick_split(cls.env_id, split, train=train, splits=SPLITS, default=default, strict=True)
        if chosen is None:
            return None
        rest = {k: v for k, v in train_kwargs.items() if k not in ("tasks", "data_file")}
        return {**rest, "split": chosen}

    @classmethod
    def suite_kwargs(cls, split: str) -> dict[str, Any]:
        """A bundled split (``mathchat:arith1-eval``) or a task file (``tasks:<file>``, the format of ``data_file``)."""
        if split in SPLITS:
            return {"split": split}
        if not Path(split).is_file():
            raise FileNotFoundError(f"task file {split!r} not found, nor a MathChat split of that name: {SPLITS}")
        return {"data_file": split}

    def grade(self, task: Task, record: EpisodeRecord) -> tuple[float, dict[str, Any]]:
        verifier = self.roles[-1].agent
        outputs = [a.output for a in record.actions if a.agent == verifier]
        predicted = extract_answer(outputs[-1]) if outputs else None
        correct = predicted is not None and math_equal(predicted, task.answer)
        outcome = {"predicted": predicted, "answer": task.answer, "correct": correct, "success": correct}
        # what a grader that also reads an unboxed final number would say (reported beside the reward, never in it)
        lenient = extract_answer_lenient(outputs[-1]) if outputs else None
        outcome["lenient_correct"] = lenient is not None and math_equal(lenient, task.answer)
        return float(correct), outcome
