"""The coach protocol: what a coach sees (:class:`CoachInput`), the prompt built from it, reply parsing, and the
evaluation it returns (:class:`CoachEvaluation`).

Replies must contain a line ``PROCESS_SCORE: x`` (x in [0, 10], clamped); when ground truth is given (final
agent only), also ``ANSWER_CORRECT: 0|1``. Prompt templates are plain text files: the package's defaults live in
``mappa_envs/coach/templates``; pass ``templates_dir=`` to use your own copies (same file names; a role-specific
file ``<task>/<role>.txt`` is optional, ``default.txt`` is used otherwise).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..core import ActionRecord, CoachEvaluation, EpisodeRecord, truncate_middle  # noqa: F401  (re-exported)
from .guard import FENCE_NOTE, Findings, guard, new_fence

NEUTRAL_SCORE = 5.0

_SCORE = re.compile(r"PROCESS_SCORE\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_ANSWER = re.compile(r"ANSWER_CORRECT\s*[:=]\s*\**\s*([01])\b", re.IGNORECASE)
SCORE_REGEX = r"[^\n]{0,160}\nPROCESS_SCORE: (10|[0-9])(\nANSWER_CORRECT: [01])?"
"""A reply shape a server that constrains decoding can enforce: one line of reasons, then the score line, then
optionally the answer line. For ``vllm serve``: ``OpenAIChatBackend(...,
extra_body={"structured_outputs": {"regex": SCORE_REGEX}})``; a small coach model then always writes a score
(the 135M bundled model, left free, mostly does not)."""
_LENIENT = re.compile(
    r"\b(?:score|rating|grade|rate)\b[^0-9\n]{0,20}(-?\d+(?:\.\d+)?)|(\d+(?:\.\d+)?)\s*/\s*10\b", re.IGNORECASE
)


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    written_by: str | None
    """Agent that last created or modified the file (None: present from the start, e.g. task data)."""


@dataclass(frozen=True)
class FileCheck:
    """What the env's own check of a hand-over file found (DSBench: :mod:`mappa_envs.tasks.dsbench.check`, run in
    the sandbox after the action that last touched a contract file; recorded in that action's
    ``info["workspace_check"]``)."""

    path: str
    present: bool
    ok: bool
    """Usable as the contract says (it loads, with the rows and columns it must have)."""
    problems: tuple[str, ...] = ()
    """What is wrong with it, hard (``ok`` False) or soft (missing values, a model that cannot predict...)."""
    rows: int | None = None
    agent: str = ""
    """The agent whose action the check followed."""
    given: bool = False
    """A file the task gave, to be kept intact."""


@dataclass(frozen=True)
class CoachInput:
    """Everything a coach is told about one action."""

    env_id: str
    task_id: str
    task: str
    task_type: str
    """For bias diagnostics and per-task templates, e.g. ``"math"``, ``"classification"``, ``"regression"``."""
    template: str
    """Template folder of the task (``"mathchat"``, ``"dsbench"``...)."""
    agent: str
    role: str
    turn: int
    agent_input: str
    output: str
    tool_feedback: str
    """What the action's tool calls showed the agents (the text the LLM coach reads)."""
    tool_status: tuple[str, ...] = ()
    """The execution status of each of the action's tool calls, in order (:class:`sandboxes.ExecStatus` values:
    what the rule-based coach reads, never the feedback text)."""
    tool_stdout: tuple[str, ...] = ()
    tool_stderr: tuple[str, ...] = ()
    """What each call's program printed (its own streams, without the feedback's formatting)."""
    files: tuple[FileInfo, ...] = ()
    ground_truth: str | None = None
    """Only for the final agent's last action, when the task has one."""
    is_final: bool = False
    upstream_failures: tuple[str, ...] = ()
    """Tool failures of earlier agents in the episode (agent: status), for credit assignment."""
    earlier_roles: tuple[str, ...] = ()
    """Roles that acted before this agent in the pipeline."""
    upstream_stdout: tuple[str, ...] = ()
    """What earlier agents' code printed when it ran OK (for consistency checks of an answer)."""
    artifacts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The task's hand-over contract: (role, files the role must write), e.g. DSBench's data engineer writes
    ``X_train.pkl``, ``y_train.pkl``, ``X_test.pkl``."""
    tools: tuple[str, ...] = ()
    """The tools this role may call."""
    answers: bool = False
    """The role states the task's answer (``Role.answers``)."""
    role_guidance: str = ""
    """The task's description of a good action of this role (``Role.coach_guidance``); empty: the template's."""
    outcome: dict[str, Any] | None = None
    """The host's scoring of the episode (final agent's last action only), e.g. DSBench's submission validity,
    metric and quality. Shown to the coach when the task has no single ground-truth answer."""
    system_prompt: str = ""
    """The agent's system prompt and the worked example turns it was shown (``Role.examples``): a rule-based coach
    recognises a copied example by them (:class:`mappa_envs.coach.RuleBasedCoach`)."""
    file_checks: tuple[FileCheck, ...] = ()
    """The latest check of each hand-over file, up to and including this action (:class:`FileCheck`)."""
    given: tuple[str, ...] = ()
    """Files the task gave that every role must keep intact (DSBench ladder level 0's pickles)."""
    changed: tuple[str, ...] = ()
    """The workspace files this action's code created, modified or deleted."""

    def key(self) -> str:
        """Cache key: a hash of the whole input."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()


def clamp(score: float) -> float:
    return min(10.0, max(0.0, float(score)))


_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)


def strip_thinking(reply: str) -> str:
    """The reply without its reasoning-model thinking: every ``<think>...</think>`` block, everything before a
    closing ``</think>`` whose opening tag the server dropped (as Qwen3's chat template does), and an unclosed
    ``<think>`` to the end. Scores written while thinking are drafts, not the verdict."""
    text = _THINK.sub("", reply or "")
    low = text.lower()
    if "</think>" in low:
        text = text[low.rindex("</think>") + len("</think>") :]
        low = text.lower()
    if "<think>" in low:
        text = text[: low.index("<think>")]
    return text


def score_lines(reply: str) -> list[float]:
    """Every ``PROCESS_SCORE: x`` of a reply outside its thinking, clamped to [0, 10], in order."""
    return [clamp(float(x)) for x in _SCORE.findall(strip_thinking(reply))]


def parse_score(reply: str) -> float | None:
    """The last ``PROCESS_SCORE: x`` of a reply outside its thinking (:func:`strip_thinking`), clamped to [0, 10];
    None when absent. Several different values make the evaluation ambiguous (:func:`is_ambiguous`)."""
    found = score_lines(reply)
    return found[-1] if found else None


def is_ambiguous(reply: str) -> bool:
    """More than one ``PROCESS_SCORE`` value outside the thinking (repeating the same value is not ambiguous)."""
    return len(set(score_lines(reply))) > 1


def parse_score_lenient(reply: str) -> float | None:
    """A last resort: 'score ... 7', 'rating: 8/10' (outside the thinking). None when nothing plausible is there."""
    found = [a or b for a, b in _LENIENT.findall(strip_thinking(reply))]
    for value in reversed(found):
        v = float(value)
        if 0 <= v <= 10:
            return v
    return None


def parse_answer_correct(reply: str) -> bool | None:
    """The last ``ANSWER_CORRECT: 0|1`` outside the thinking; None when absent."""
    found = _ANSWER.findall(strip_thinking(reply))
    return found[-1] == "1" if found else None


def reasoning_of(reply: str) -> str:
    """The reply without its thinking and its score lines."""
    return "\n".join(
        line for line in strip_thinking(reply).splitlines() if not _SCORE.search(line) and not _ANSWER.search(line)
    ).strip()


REPROMPT = (
    "Your reply did not contain the required line. Reply again with your reasoning in one or two sentences, then "
    "`PROCESS_SCORE: <integer from 0 to 10>` on its own line{answer}."
)


class Templates:
    """Prompt templates, from the package or from ``templates_dir`` (a folder with the same layout)."""

    def __init__(self, templates_dir: str | Path | None = None):
        self.dir = Path(templates_dir) if templates_dir else None

    def read(self, name: str) -> str | None:
        if self.dir is not None:
            path = self.dir / name
            return path.read_text(encoding="utf-8") if path.exists() else None
        ref = resources.files(__package__).joinpath("templates", name)
        return ref.read_text(encoding="utf-8") if ref.is_file() else None

    def role_guidance(self, template: str, role: str) -> str:
        return (self.read(f"{template}/{role}.txt") or self.read("default.txt") or "").strip()

    def build(self, inp: CoachInput, max_chars: int = 6000) -> list[dict[str, str]]:
        """The chat messages sent to an LLM coach, without the injection guard (:meth:`build_guarded` has it)."""
        return self._build(inp, max_chars, None, Findings())

    def build_guarded(self, inp: CoachInput, max_chars: int = 6000) -> tuple[list[dict[str, str]], Findings]:
        """The chat messages with the agents' text fenced by a fresh token and stripped of what addresses the coach
        (:mod:`mappa_envs.coach.guard`), and what was found in it."""
        findings = Findings()
        return self._build(inp, max_chars, new_fence(), findings), findings

    def _build(self, inp: CoachInput, max_chars: int, token: str | None, findings: Findings) -> list[dict[str, str]]:
        earlier = Findings()  # the input's earlier messages: flagged on the actions that wrote them, not on this one

        def agent_text(text: str, found: Findings = findings) -> str:  # an agent's or its tools' text, guarded
            return guard(text, token, found) if token is not None else text

        system = (self.read("system.txt") or "").strip()
        if token is not None:
            system += "\n\n" + FENCE_NOTE.format(token=token)
        user = self.read("user.txt") or ""
        gt = ""
        if inp.ground_truth is not None:
            gt = (self.read("ground_truth.txt") or "").format(ground_truth=inp.ground_truth)
        elif inp.outcome is not None:
            summary = inp.outcome.get("summary") or ", ".join(f"{k}={v}" for k, v in inp.outcome.items())
            gt = (self.read("outcome.txt") or "").format(outcome=agent_text(summary))  # it quotes the submission
        files = "\n".join(f"- {f.path} ({f.size} bytes, written by {f.written_by or 'the task'})" for f in inp.files)
        text = user.format(
            task=truncate_middle(inp.task, max_chars),
            role=inp.role.replace("_", " "),
            agent=inp.agent,
            turn=inp.turn,
            role_description=(inp.role_guidance or self.role_guidance(inp.template, inp.role)).splitlines()[0]
            if inp.role
            else "",
            agent_input=agent_text(truncate_middle(inp.agent_input, max_chars), earlier),
            output=agent_text(truncate_middle(inp.output, max_chars) or "(empty reply)"),
            tool_feedback=agent_text(truncate_middle(inp.tool_feedback, max_chars // 2) or "no tools used"),
            files=agent_text(files) if files else "(none)",
            ground_truth_section=gt,
            role_guidance=inp.role_guidance or self.role_guidance(inp.template, inp.role),
            answer_line=", and `ANSWER_CORRECT: 0` or `ANSWER_CORRECT: 1` on another line"
            if inp.ground_truth is not None
            else "",
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def workspace_files(record: EpisodeRecord, actions: list[ActionRecord]) -> tuple[FileInfo, ...]:
    """The workspace's files after ``actions`` (the episode's first ones): those it started with (author None) and
    those the actions' code wrote (author: the agent that last wrote it), with their sizes; deleted ones left out."""
    written: dict[str, str | None] = {p: None for p in record.metadata.get("workspace_files", {})}
    sizes: dict[str, int] = dict(record.metadata.get("workspace_files", {}))
    for act in actions:
        for call in act.tool_calls:
            for change in call.result.files_changed:
                sizes[change.path] = change.size
                if change.change == "deleted":
                    written.pop(change.path, None)
                else:
                    written[change.path] = act.agent
    return tuple(FileInfo(p, sizes.get(p, 0), a) for p, a in sorted(written.items()))


def file_checks(actions: list[ActionRecord]) -> tuple[FileCheck, ...]:
    """The latest recorded check of each file over ``actions`` (``info["workspace_check"]["files"]``)."""
    latest: dict[str, FileCheck] = {}
    for act in actions:
        for path, e in (act.info.get("workspace_check") or {}).get("files", {}).items():
            latest[path] = FileCheck(
                path,
                bool(e.get("present")),
                bool(e.get("ok")),
                tuple(str(p) for p in e.get("problems", ())),
                e.get("rows") if isinstance(e.get("rows"), int) else None,
                act.agent,
                bool(e.get("given")),
            )
    return tuple(latest[p] for p in sorted(latest))


def _tool_results(action: ActionRecord) -> dict[str, tuple[str, ...]]:
    """The statuses and the program's own output of the action's tool calls (:class:`CoachInput` fields)."""
    results = [c.result for c in action.tool_calls]
    return {
        "tool_status": tuple(str(r.status) for r in results),
        "tool_stdout": tuple(r.stdout for r in results),
        "tool_stderr": tuple(r.stderr for r in results),
    }


def inputs_for_episode(
    record: EpisodeRecord,
    action: ActionRecord,
    *,
    task_type: str,
    template: str,
    final_agent: str,
    is_final: bool,
    artifacts: dict[str, tuple[str, ...]] | None = None,
    tools: tuple[str, ...] = (),
    answers: bool = False,
    guidance: str = "",
) -> CoachInput:
    """Build the coach input of ``action`` from the episode so far (what the coach may know at that point)."""
    earlier = record.actions[: action.index]
    files = workspace_files(record, [*earlier, action])
    failures = tuple(
        f"{a.agent}: {c.result.status}"
        for a in earlier
        for c in a.tool_calls
        if not c.result.ok and a.agent != action.agent
    )
    feedback = "\n\n".join(c.feedback for c in action.tool_calls)
    # the system prompt and any worked example turns are the role's scaffolding, the rest is the episode's input
    scaffold = [m for m in action.messages if m["role"] == "system" or m.get("name") == "example"]
    agent_input = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in action.messages if m not in scaffold)
    gt, outcome = None, None
    if is_final and action.agent == final_agent:
        if record.ground_truth is not None:
            gt = str(record.ground_truth)
        elif record.outcome:
            outcome = dict(record.outcome)
    return CoachInput(
        env_id=record.env_id,
        task_id=record.task_id,
        task=record.task,
        task_type=task_type,
        template=template,
        agent=action.agent,
        role=action.role,
        turn=action.turn,
        agent_input=agent_input,
        output=action.output,
        tool_feedback=feedback,
        **_tool_results(action),
        files=files,
        ground_truth=gt,
        is_final=is_final,
        upstream_failures=failures,
        earlier_roles=tuple(dict.fromkeys(a.role for a in earlier if a.agent != action.agent)),
        upstream_stdout=tuple(
            c.result.stdout for a in earlier for c in a.tool_calls if c.result.ok and a.agent != action.agent
        ),
        artifacts=tuple((role, tuple(files)) for role, files in (artifacts or {}).items()),
        outcome=outcome,
        tools=tuple(tools),
        answers=answers,
        role_guidance=guidance,
        system_prompt="\n\n".join(m["content"] for m in scaffold),
        file_checks=file_checks([*earlier, action]),
        given=tuple(record.metadata.get("given_files", ())),
        changed=tuple(sorted({c.path for call in action.tool_calls for c in call.result.files_changed})),
    )
