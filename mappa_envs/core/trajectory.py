"""Typed trajectory records: every action of every agent, with its full input context.

An :class:`EpisodeRecord` is what training, coaching, reports and replays read. It serialises to one JSON line
(:meth:`EpisodeRecord.to_json`) and back (:meth:`EpisodeRecord.from_json`), losslessly. What crosses packages on
it is typed (:mod:`mappa_envs.core.records`): the coach's evaluation and the generation of each action, the
episode's outcome.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sandboxes import ExecResult

from .records import OUTCOME_KINDS, CoachEvaluation, GenerationInfo, Outcome, OutcomeKind

Message = dict[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""


@dataclass
class ToolCall:
    """One tool invocation made on behalf of an action (for now: Python execution of its code blocks)."""

    tool: str
    input: str
    result: ExecResult
    feedback: str
    """The text shown to the agents (formatted and truncated from ``result``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "input": self.input,
            "result": self.result.to_dict(),
            "feedback": self.feedback,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(tool=d["tool"], input=d["input"], result=ExecResult.from_dict(d["result"]), feedback=d["feedback"])


@dataclass
class ActionRecord:
    """One action: who acted, on what input, what it produced, what the tools returned, how it was rewarded."""

    index: int
    """Position in the episode (0-based, across all agents)."""
    agent: str
    role: str
    turn: int
    """1-based turn of this agent."""
    messages: list[Message]
    """The agent's full input: the chat messages it was given for this action."""
    output: str
    """The action as text (normalised: see ``mappa_envs.core.text.normalize_action``)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    """Anomalies of the action (empty, binary, unclosed code fence, truncated in later observations...)."""
    raw_output_b64: str | None = None
    """Original bytes of a non-text action, base64-encoded."""
    reward: float = 0.0
    """Reward credited to this action (the env's own reward, or a wrapper's, e.g. the coach's score / 10)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Extra per-action data, e.g. other coaches' evaluations (``mappa rescore``: ``info[name]``)."""
    coach: CoachEvaluation | None = None
    """The coach's evaluation that gave this action its reward (written as ``info["coach"]``); None: not coached."""
    generation: GenerationInfo | None = None
    """What the policy sampled for this action (written as ``info["generation"]``); None: a policy without tokens."""

    def __post_init__(self) -> None:
        # records written before these fields were typed (and callers that still pass them in ``info``)
        self.info = dict(self.info)
        for name, typ in (("coach", CoachEvaluation), ("generation", GenerationInfo)):
            if name in self.info:
                if getattr(self, name) is not None:
                    raise ValueError(f"action {self.index}: {name!r} given both as a field and in info")
                value = self.info.pop(name)
                setattr(self, name, value if value is None or isinstance(value, typ) else typ.from_dict(value))

    @property
    def used_tools(self) -> bool:
        return bool(self.tool_calls)

    @property
    def tools_ok(self) -> bool:
        return bool(self.tool_calls) and all(c.result.ok for c in self.tool_calls)

    def evaluation(self, key: str = "coach") -> CoachEvaluation | None:
        """A coach's evaluation of this action: the reward's (``"coach"``: :attr:`coach`) or one stored under
        another name by ``mappa rescore`` (``info[key]``); None when there is none."""
        if key == "coach":
            return self.coach
        value = self.info.get(key)
        return value if value is None or isinstance(value, CoachEvaluation) else CoachEvaluation.from_dict(value)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("coach", "generation")}
        d["messages"] = [dict(m) for m in self.messages]
        d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        d["issues"] = list(self.issues)
        info = {k: v.to_dict() if isinstance(v, CoachEvaluation) else copy.deepcopy(v) for k, v in self.info.items()}
        if self.generation is not None:
            info["generation"] = self.generation.to_dict()
        if self.coach is not None:
            info["coach"] = self.coach.to_dict()
        d["info"] = info
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ActionRecord:
        d = dict(d)
        d["tool_calls"] = [ToolCall.from_dict(c) for c in d.get("tool_calls", [])]
        return cls(**d)


@dataclass
class EpisodeRecord:
    """A whole episode: the task, every action, and the outcome."""

    env_id: str
    episode_id: str
    task_id: str
    task: str
    seed: int | None
    actions: list[ActionRecord] = field(default_factory=list)
    ground_truth: Any = None
    outcome: Outcome | None = None
    """How the episode ended (:class:`~mappa_envs.core.records.Outcome`, checked by :func:`checked_outcome`); None
    while it runs. A mapping given here (a record from before the type) is read by :meth:`Outcome.from_dict`."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.outcome, Mapping) and not isinstance(self.outcome, Outcome):
            self.outcome = Outcome.from_dict(self.outcome) if self.outcome else None

    def actions_of(self, agent: str) -> list[ActionRecord]:
        return [a for a in self.actions if a.agent == agent]

    @property
    def success(self) -> bool:
        """Whether the episode succeeded (False while it runs)."""
        return self.outcome is not None and self.outcome.success

    @property
    def score(self) -> float:
        """The episode's score in [0, 1]: the env's reward for it (0 while it runs)."""
        return self.outcome.score if self.outcome is not None else 0.0

    @property
    def kind(self) -> OutcomeKind:
        """``"answer"`` or ``"graded"`` (``"answer"`` while it runs)."""
        return self.outcome.kind if self.outcome is not None else "answer"

    @property
    def quality(self) -> float | None:
        """A graded episode's quality in [0, 1]; None for an answer task's."""
        return self.outcome.quality if self.outcome is not None else None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["actions"] = [a.to_dict() for a in self.actions]
        d["outcome"] = copy.deepcopy(self.outcome.to_dict()) if self.outcome is not None else {}
        d["ground_truth"] = copy.deepcopy(self.ground_truth)
        d["metadata"] = copy.deepcopy(self.metadata)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeRecord:
        d = dict(d)
        d["actions"] = [ActionRecord.from_dict(a) for a in d.get("actions", [])]
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, default=_json_default)

    @classmethod
    def from_json(cls, line: str) -> EpisodeRecord:
        return cls.from_dict(json.loads(line))


def checked_outcome(source: str, kind: OutcomeKind, reward: float, outcome: Mapping[str, Any]) -> Outcome:
    """The outcome a task's ``grade`` returned, checked against the contract and completed with ``score`` (the
    reward) and ``kind``: ``success`` must be there, the reward in [0, 1], and a graded task's ``quality`` in
    [0, 1]. A breach is the task's bug, raised with its name (``source``), never recorded as a default."""
    problems = []
    if kind not in OUTCOME_KINDS:
        problems.append(f"outcome_kind {kind!r} is not one of {OUTCOME_KINDS}")
    if "success" not in outcome:
        problems.append(f"an outcome without 'success' ({sorted(outcome)}): every outcome says whether it succeeded")
    if not 0.0 <= float(reward) <= 1.0:  # NaN fails too
        problems.append(f"a reward of {reward!r}, outside [0, 1]")
    quality = outcome.get("quality")
    if kind == "graded" and not (isinstance(quality, int | float) and 0.0 <= quality <= 1.0):
        problems.append(f"a graded outcome's quality must be a number in [0, 1], not {quality!r}")
    if problems:
        raise ValueError(f"{source}.grade() returned " + "; ".join(problems))
    figures = {k: v for k, v in outcome.items() if k not in ("success", "score", "kind")}
    return Outcome(success=bool(outcome["success"]), score=float(reward), kind=kind, figures=figures)


def _json_default(obj: Any) -> Any:
    # numpy scalars and other number-likes that sneak into answers or infos
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def write_jsonl(path: str | Path, episodes: Iterable[EpisodeRecord], append: bool = False) -> int:
    """Write episodes as JSON lines; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(ep.to_json() + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[EpisodeRecord]:
    """Read episodes written by :func:`write_jsonl`, or a trainer's ``rollouts/iter-*.jsonl`` (whose lines wrap
    each episode as ``{"index": i, "episode": {...}}``); a malformed line raises with its line number."""
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if isinstance(row, dict) and "episode" in row and "actions" not in row:
                    row = row["episode"]
                yield EpisodeRecord.from_dict(row)
            except (ValueError, TypeError, KeyError) as e:  # JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{lineno}: not a valid episode record ({e})") from e
