"""A hindsight coach: one call per finished episode sees every action and the outcome, and returns one score per
action, assigning blame where the per-action coach could not (it scores each action knowing only what came
before it). The paper names such reward backpropagation as future work.

A hindsight coach has ``evaluate_episode(inputs, record) -> [CoachEvaluation per action]`` (:class:`HindsightCoach`);
``mappa rescore --coach-mode hindsight`` uses it on stored episodes (:mod:`mappa_envs.coach.rescore`). Here:

- :class:`RuleHindsightCoach` (deterministic, for CPU runs and tests): the per-action rule coach's scores, then
  blame propagated from the outcome (its rules in its docstring);
- :func:`parse_hindsight_scores`: the protocol extension for LLM hindsight coaches, one ``PROCESS_SCORE[i]: s``
  line per action index, each missing or unreadable score a flagged per-action fallback.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from ..core import EpisodeRecord
from ..grading import extract_answer, math_equal
from .protocol import CoachEvaluation, CoachInput, clamp
from .rule_based import RuleBasedCoach

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_INDEXED = re.compile(r"PROCESS_SCORE\s*\[\s*(\d+)\s*\]\s*:\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


@runtime_checkable
class HindsightCoach(Protocol):
    def evaluate_episode(self, inputs: Sequence[CoachInput], record: EpisodeRecord) -> list[CoachEvaluation]:
        """One evaluation per input (the episode's actions, in order), knowing the whole episode and its outcome."""
        ...


def parse_hindsight_scores(reply: str, n: int) -> tuple[list[float | None], list[str]]:
    """The ``PROCESS_SCORE[i]: s`` scores of actions ``0..n-1`` (the last line of an index wins; scores clamped to
    [0, 10]) and the problems found: a missing index, an index out of range."""
    scores: list[float | None] = [None] * n
    problems = []
    for index, value in _INDEXED.findall(reply):
        i = int(index)
        if i >= n:
            problems.append(f"PROCESS_SCORE[{i}] names no action (the episode has {n})")
            continue
        scores[i] = clamp(float(value))
    problems += [f"no PROCESS_SCORE[{i}]" for i, s in enumerate(scores) if s is None]
    return scores, problems


@dataclass
class RuleHindsightCoach:
    """The rule coach's per-action scores, then blame from the outcome:

    - **A wrong value carried to the answer** (a task with a ground truth, the final answer wrong): the earliest
      action that introduced the answered value (the last number its code printed, or an answer it boxed) -3; the
      final agent's action +2 (it was misled; its per-action score already holds the wrong answer's -3).
    - **A printout against the ground truth** (``answer_key=True`` only: a per-action answer key, which the
      method's coach never gets): an action whose code's last printed number is the answer +2; another number -1
      (unless already blamed above).
    - **A missing hand-over file** (a task with artifacts, the episode failed): the last action of each role whose
      owed file is missing at the end -2; each later action whose tool run failed +1 (it was blocked).
    - **Success**: every action of a successful episode +1.
    """

    base: RuleBasedCoach = field(default_factory=RuleBasedCoach)
    answer_key: bool = True
    """Check every printout against the ground truth (``rule-hindsight``, the answer-key coach); False
    (``rule-hindsight-outcome``): blame only from the outcome and the team's final answer."""
    name: str = "rule-hindsight"

    def __post_init__(self) -> None:
        if not self.answer_key and self.name == "rule-hindsight":
            self.name = "rule-hindsight-outcome"
        # what it sees (mappa_envs.coach.information): the outcome, the final answer's key (the base rule coach),
        # and with answer_key every action's printout checked against the ground truth
        self.information = ("outcome", "per-action-answer-key" if self.answer_key else "final-answer-key")

    def evaluate_episode(self, inputs: Sequence[CoachInput], record: EpisodeRecord) -> list[CoachEvaluation]:
        start = time.perf_counter()
        evals = [self.base.evaluate(inp) for inp in inputs]
        notes: list[list[tuple[float, str]]] = [[] for _ in inputs]
        if inputs:
            _carried_value(inputs, record, notes)
            if self.answer_key:
                _printouts(inputs, record, notes)
            _missing_handover(inputs, record, notes)
        if record.success:
            for n in notes:
                n.append((+1, "the episode succeeded"))
        seconds = (time.perf_counter() - start) / max(1, len(inputs))
        out = []
        for ev, adj in zip(evals, notes, strict=True):
            reasoning = ev.reasoning + ("; hindsight: " + "; ".join(f"{d:+g} {w}" for d, w in adj) if adj else "")
            score = clamp(ev.score + sum(d for d, _ in adj))
            out.append(replace(ev, score=score, reasoning=reasoning, backend=self.name, latency_s=seconds))
        return out


def _carried_value(inputs: Sequence[CoachInput], record: EpisodeRecord, notes: list[list[tuple[float, str]]]) -> None:
    final = inputs[-1]
    if record.ground_truth is None or record.success:
        return
    answer = extract_answer(final.output)
    if answer is None or math_equal(answer, str(record.ground_truth)):
        return
    for i, inp in enumerate(inputs[:-1]):
        printed = [v for out in inp.tool_stdout for v in _NUMBER.findall(out)[-1:]]
        boxed = extract_answer(inp.output) if inp.answers else None
        was_printed = any(math_equal(answer, v) for v in printed)
        if was_printed or (boxed is not None and math_equal(answer, boxed)):
            what = "printed" if was_printed else "boxed"
            notes[i].append(
                (-3, f"{what} {answer}, the wrong value the team answered (the answer: {record.ground_truth})")
            )
            if inp.agent != final.agent:
                notes[-1].append((+2, f"its wrong answer {answer} came from {inp.role}'s action {i}"))
            return


def _printouts(inputs: Sequence[CoachInput], record: EpisodeRecord, notes: list[list[tuple[float, str]]]) -> None:
    if record.ground_truth is None:
        return
    answer = str(record.ground_truth)
    for i, inp in enumerate(inputs):
        printed = [v for out in inp.tool_stdout for v in _NUMBER.findall(out)[-1:]]
        if not printed or any(d < 0 and "wrong value" in w for d, w in notes[i]):
            continue  # no printout, or already blamed for carrying its wrong value to the answer
        if any(math_equal(v, answer) for v in printed):
            notes[i].append((+2, f"its code printed the answer {answer}"))
        else:
            notes[i].append((-1, f"its code printed {printed[-1]}, a wrong value (the answer: {answer})"))


def _missing_handover(
    inputs: Sequence[CoachInput], record: EpisodeRecord, notes: list[list[tuple[float, str]]]
) -> None:
    if record.success or not inputs[-1].artifacts:
        return
    present = {f.path for f in inputs[-1].files}
    missing = {role: [p for p in files if p not in present] for role, files in inputs[-1].artifacts}
    for role, files in missing.items():
        owners = [i for i, inp in enumerate(inputs) if inp.role == role]
        if not files or not owners:
            continue
        notes[owners[-1]].append((-2, f"its missing {', '.join(files)} failed the episode"))
        for i in range(owners[-1] + 1, len(inputs)):
            if inputs[i].role != role and any(s != "ok" for s in inputs[i].tool_status):
                notes[i].append((+1, f"blocked by {role}'s missing {', '.join(files)}"))


__all__ = ["HindsightCoach", "RuleHindsightCoach", "parse_hindsight_scores"]
