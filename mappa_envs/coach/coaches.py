"""Coaches: score one action (:class:`CoachInput`) -> :class:`CoachEvaluation`.

- :class:`Coach`: what every coach implements (a ``name`` and ``evaluate``);
- :class:`~mappa_envs.coach.rule_based.RuleBasedCoach`: deterministic rubric on tool feedback, format and (final
  agent) answer correctness;
- :class:`~mappa_envs.coach.llm.LLMCoach`: any chat backend with the protocol of :mod:`mappa_envs.coach.protocol`;
- :class:`EnsembleCoach`: mean or median of several coaches (the paper's proposal against single-coach bias);
- :class:`LengthCoach`: a plumbing coach for smoke runs.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from .protocol import CoachEvaluation, CoachInput, clamp


class Coach(Protocol):
    name: str
    information: tuple[str, ...]
    """What the coach sees (:mod:`mappa_envs.coach.information`); a coach without it is ``undeclared``."""

    def evaluate(self, inp: CoachInput) -> CoachEvaluation: ...


class CoachStats:
    """Thread-safe counters shared by a coach: calls, retries, re-prompts, fallbacks, cache hits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {
            "calls": 0,
            "retries": 0,
            "reprompts": 0,
            "lenient": 0,
            "ambiguous": 0,
            "fallbacks": 0,
        }
        self.counts["cache_hits"] = 0

    def add(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counts[k] = self.counts.get(k, 0) + v


class EnsembleCoach:
    """Aggregates several coaches' scores (``"mean"`` or ``"median"``); members' evaluations are kept."""

    def __init__(self, coaches: Sequence[Coach], aggregate: str = "mean"):
        if not coaches:
            raise ValueError("an ensemble needs at least one coach")
        if aggregate not in ("mean", "median"):
            raise ValueError("aggregate must be 'mean' or 'median'")
        self.coaches, self.aggregate = list(coaches), aggregate
        self.name = f"ensemble-{aggregate}[{', '.join(c.name for c in self.coaches)}]"
        self.information = tuple(x for c in self.coaches for x in getattr(c, "information", ()))

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        start = time.perf_counter()
        evs = [c.evaluate(inp) for c in self.coaches]
        usable = [e for e in evs if not e.fallback_used] or evs
        agg = statistics.mean if self.aggregate == "mean" else statistics.median
        answers = [e.answer_correct for e in usable if e.answer_correct is not None]
        return CoachEvaluation(
            score=clamp(agg(e.score for e in usable)),
            reasoning=" | ".join(f"{e.backend}: {e.score:g}" for e in evs),
            backend=self.name,
            latency_s=time.perf_counter() - start,
            retries=sum(e.retries for e in evs),
            parse="ensemble",
            fallback_used=all(e.fallback_used for e in evs),
            fallback_reason="every member fell back" if all(e.fallback_used for e in evs) else None,
            answer_correct=(sum(answers) * 2 > len(answers)) if answers else None,
            coach_directed_text=list(dict.fromkeys(k for e in evs for k in e.coach_directed_text)),
            score_echoed=any(e.score_echoed for e in usable),
            members=list(evs),
        )


class LengthCoach:
    """Scores an action by its length in characters, modulo 11: a plumbing coach for smoke runs, not a judge.

    A random model's gibberish gets the same rule-based score on every action, so no role would have an advantage
    to learn from (and a role whose advantages are all 0 is not updated); these arbitrary but varying scores make
    every role of a smoke run update, sync and checkpoint for real (``mappa train --preset smoke``).
    """

    information = ("none",)

    def evaluate(self, inp: CoachInput) -> CoachEvaluation:
        return CoachEvaluation(
            score=float(len(inp.output) % 11), reasoning="length modulo 11", backend="length", parse="rule"
        )
