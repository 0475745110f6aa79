"""The typed records that cross packages on an action or an episode: the coach's evaluation of an action
(:class:`CoachEvaluation`), the generation that produced it (:class:`GenerationInfo`) and the episode's outcome
(:class:`Outcome`).

Each is written to JSON lines where the untyped dicts were before (an action's ``info["coach"]`` and
``info["generation"]``, the episode's ``outcome``), with the same keys, and reads files written before it was typed
(``tests/fixtures/run-e5d7fc4``). A field with a fixed set of values is a ``Literal``; a stored value outside it
is refused with the field's name, never read as a default.

>>> ev = CoachEvaluation.from_dict({"score": 7.0, "parse": "strict", "reward": 0.7})
>>> ev.reward, ev.to_dict()["parse"]
(0.7, 'strict')
>>> o = Outcome.from_dict({"correct": True, "predicted": "4", "answer": "4"})  # a record from before the contract
>>> o.success, o.score, o.kind, o["predicted"]
(True, 1.0, 'answer', '4')
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

ParseKind = Literal["strict", "reprompt", "lenient", "rule", "fallback", "ensemble"]
"""How a coach's score was read: the reply's ``PROCESS_SCORE`` line (``strict``), after a re-prompt (``reprompt``),
by the lenient last resort (``lenient``), computed by rules (``rule``), a fallback score (``fallback``: no score was
given), the aggregate of an ensemble's members (``ensemble``)."""
FinishReason = Literal["stop", "length", "abort"]
"""Why a generation ended: it sampled the end-of-sequence token or a stop string, it reached ``max_new_tokens``, or
the engine aborted it."""
OutcomeKind = Literal["answer", "graded"]
"""What a task's outcome is: ``answer`` (right or wrong) or ``graded`` (a ``quality`` in [0, 1] besides validity)."""
OUTCOME_KINDS: tuple[str, ...] = typing.get_args(OutcomeKind)


def _choice(value: Any, choices: Any, what: str) -> Any:
    allowed = typing.get_args(choices)
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {allowed}")
    return value


_WRITTEN_WHEN_SET: dict[str, Any] = {"coach_directed_text": [], "score_echoed": False, "queue_s": 0.0}
"""Fields of :class:`CoachEvaluation` that :meth:`~CoachEvaluation.to_dict` writes only when they differ from
this default: a file written before they existed reads and writes back the same JSON."""


@dataclass
class CoachEvaluation:
    """A coach's judgement of one action: the reward's in :attr:`ActionRecord.coach
    <mappa_envs.core.ActionRecord.coach>`, another coach's (``mappa rescore``) in the action's ``info[name]``."""

    score: float
    """In [0, 10]."""
    reasoning: str = ""
    raw_reply: str = ""
    backend: str = ""
    latency_s: float = field(default=0.0, compare=False)
    """Wall time of the evaluation (not compared: two evaluations equal in content are equal)."""
    retries: int = 0
    reprompted: bool = False
    parse: ParseKind = "strict"
    fallback_used: bool = False
    fallback_reason: str | None = None
    ambiguous: bool = False
    """The reply held several different ``PROCESS_SCORE`` values (outside its thinking); the last one was used."""
    answer_correct: bool | None = None
    coach_directed_text: list[str] = field(default_factory=list)
    """What the injection guard found addressed to the coach in the agents' text of this evaluation's prompt and
    neutralised there (kinds: ``score_line``, ``answer_line``, ``fence``, ``heading``, ``instruction``;
    :mod:`mappa_envs.coach.guard`); empty: nothing, or a coach that reads no text (the rule coaches)."""
    score_echoed: bool = False
    """The coach's score equals a score an agent wrote in its text (``PROCESS_SCORE: n``): a sign the coach read the
    agent rather than the rubric."""
    queue_s: float = field(default=0.0, compare=False)
    """Seconds the evaluation waited for a free coach slot before its call started (:class:`CoachPool`)."""
    cached: bool = field(default=False, compare=False)
    members: list[CoachEvaluation] = field(default_factory=list)
    """For ensembles: each member's evaluation."""
    normalized_score: float | None = None
    """The score normalised within its group (:func:`mappa_envs.coach.bias.normalize_scores`); None: not normalised."""

    def __post_init__(self) -> None:
        _choice(self.parse, ParseKind, "a coach evaluation's parse")
        self.members = [m if isinstance(m, CoachEvaluation) else CoachEvaluation.from_dict(m) for m in self.members]

    @property
    def reward(self) -> float:
        return self.score / 10.0

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "normalized_score"}
        for name, unset in _WRITTEN_WHEN_SET.items():  # a record without them reads and writes back the same
            if d[name] == unset:
                del d[name]
        d["members"] = [m.to_dict() for m in self.members]
        if "coach_directed_text" in d:
            d["coach_directed_text"] = list(d["coach_directed_text"])  # the dict's own list
        d["reward"] = self.reward
        if self.normalized_score is not None:
            d["normalized_score"] = self.normalized_score
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CoachEvaluation:
        """An evaluation from :meth:`to_dict`'s dict (its derived ``reward`` dropped); unknown keys are refused."""
        d = {k: v for k, v in d.items() if k != "reward"}
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"a coach evaluation with unknown keys {unknown}")
        return cls(**d)


@dataclass
class GenerationInfo:
    """What the policy sampled for an action (:class:`mappa_envs.core.Generation`), as training needs it: the token
    ids (with the end-of-sequence token when it stopped on one), why it ended and, when the engine gave them, each
    token's log-probability under the sampling policy."""

    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        _choice(self.finish_reason, FinishReason, "a generation's finish_reason")
        self.token_ids = [int(t) for t in self.token_ids]
        if self.logprobs is not None:
            self.logprobs = [float(x) for x in self.logprobs]
            if len(self.logprobs) != len(self.token_ids):
                raise ValueError(f"{len(self.logprobs)} log-probs for {len(self.token_ids)} sampled tokens")

    @property
    def truncated(self) -> bool:
        """Cut before it stopped on its own (``finish_reason`` other than ``"stop"``)."""
        return self.finish_reason != "stop"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"token_ids": list(self.token_ids), "finish_reason": self.finish_reason}
        if self.logprobs is not None:
            d["logprobs"] = list(self.logprobs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GenerationInfo:
        return cls(token_ids=d["token_ids"], finish_reason=d["finish_reason"], logprobs=d.get("logprobs"))


_OUTCOME_FIELDS = ("success", "score", "kind")


@dataclass(eq=False)
class Outcome(Mapping[str, Any]):
    """How an episode ended (:func:`mappa_envs.core.trajectory.checked_outcome`): whether it did what the task asks
    (:attr:`success`), the env's reward for it in [0, 1] (:attr:`score`), its :attr:`kind`, and the task's own
    :attr:`figures` (MathChat: ``predicted``, ``answer``, ``correct``; DSBench: ``metric``, ``value``, ``valid``,
    ``quality``...). Also a read-only mapping of all of them together (``outcome["valid"]``, ``dict(outcome)``),
    which is how it is written to JSON."""

    success: bool
    score: float
    kind: OutcomeKind = "answer"
    figures: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _choice(self.kind, OutcomeKind, "an outcome's kind")
        clash = sorted(set(self.figures) & set(_OUTCOME_FIELDS))
        if clash:
            raise ValueError(f"an outcome's figures may not hold {clash}: they are its fields")

    @property
    def quality(self) -> float | None:
        """A graded episode's quality in [0, 1]; None for an answer task's."""
        return float(self.figures.get("quality", 0.0)) if self.kind == "graded" else None

    def __repr__(self) -> str:
        """``Outcome(success=True, score=1.0, kind='answer', predicted='18', answer=18.0, correct=True)``: the three
        fields, then the task's figures, flat, as they are read (``outcome["predicted"]``)."""
        items = {"success": self.success, "score": self.score, "kind": self.kind, **self.figures}
        return "Outcome(" + ", ".join(f"{k}={v!r}" for k, v in items.items()) + ")"

    def to_dict(self) -> dict[str, Any]:
        return {**self.figures, "success": self.success, "score": self.score, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        """An outcome from its JSON dict. A record stored before the outcome contract is read the way it was meant:
        ``success`` from MathChat's ``correct``; ``score`` from its ``quality``, ``correct`` or ``success``, in that
        order; graded when it holds a ``quality``."""
        if isinstance(d, Outcome):
            return d
        figures = {k: v for k, v in d.items() if k not in _OUTCOME_FIELDS}
        success = bool(d["success"] if "success" in d else d.get("correct", False))
        score = next((float(d[k]) for k in ("score", "quality", "correct", "success") if k in d), 0.0)
        kind: OutcomeKind = d.get("kind") or ("graded" if "quality" in d else "answer")
        return cls(success=success, score=score, kind=kind, figures=figures)

    # the mapping: the figures and the three fields, as written
    def __getitem__(self, key: str) -> Any:
        if key in _OUTCOME_FIELDS:
            return getattr(self, key)
        return self.figures[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.figures) + len(_OUTCOME_FIELDS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


__all__ = [
    "OUTCOME_KINDS",
    "CoachEvaluation",
    "FinishReason",
    "GenerationInfo",
    "Outcome",
    "OutcomeKind",
    "ParseKind",
]
