"""A DSBench hindsight coach: :class:`~mappa_envs.coach.dsbench_rules.DSBenchCoach`'s per-action scores, then the
blame moved once the episode's outcome is known (``dsbench-rule-hindsight``; :mod:`mappa_envs.coach.hindsight` has
the protocol and the general rule hindsight coach)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..core import EpisodeRecord
from .dsbench_rules import DSBenchCoach, _State, read_state
from .protocol import CoachEvaluation, CoachInput, clamp

Notes = list[list[tuple[float, str]]]


@dataclass
class DSBenchHindsightCoach:
    """The per-action scores of :class:`~mappa_envs.coach.dsbench_rules.DSBenchCoach`, then, knowing the outcome:

    - **A broken hand-over** (the episode failed and, at the end, a contract file is missing or the env's check of it
      found it unusable, such as an ``X_test.pkl`` without test.csv's rows; or a given file was changed): the first
      role, in pipeline order, with such a file: its last action -2; every later action that could not deliver or
      whose code failed +1 (it was blocked); the last action of each earlier role that delivered all its files +1.
    - **An invalid submission** with every hand-over file usable: the analyst's last action -2 for the wrong row
      count, -1 otherwise (columns, values); the last action of each other role that delivered +1.
    - **Success**: the last action of each role that delivered (its files usable; a role that owes none: it broke
      no given file) + the submission's quality (0 to 1), and +1 more when it beats the trivial baseline.

    An episode it cannot read keeps its per-action scores, each flagged as a fallback with the reason.
    """

    base: DSBenchCoach = field(default_factory=DSBenchCoach)
    name: str = "dsbench-rule-hindsight"
    information: tuple[str, ...] = ("outcome", "final-answer-key")
    """What it sees (:mod:`mappa_envs.coach.information`): the outcome of the episode (validity, reason and quality:
    the submission scored against the test answers), and the base coach's final-action scoring."""

    def evaluate_episode(self, inputs: Sequence[CoachInput], record: EpisodeRecord) -> list[CoachEvaluation]:
        start = time.perf_counter()
        evals = [self.base.evaluate(inp) for inp in inputs]
        notes: Notes = [[] for _ in inputs]
        try:
            if inputs:
                _blame(inputs, record, notes)
        except Exception as e:  # an episode it cannot read: the per-action scores stand, flagged
            why = f"hindsight could not read the episode ({type(e).__name__}: {str(e)[:200]}); per-action score kept"
            return [replace(ev, backend=self.name, fallback_used=True, fallback_reason=why) for ev in evals]
        seconds = (time.perf_counter() - start) / max(1, len(inputs))
        out = []
        for ev, adj in zip(evals, notes, strict=True):
            reasoning = ev.reasoning + ("; hindsight: " + "; ".join(f"{d:+.2g} {w}" for d, w in adj) if adj else "")
            score = round(clamp(ev.score + sum(d for d, _ in adj)), 2)
            out.append(replace(ev, score=score, reasoning=reasoning, backend=self.name, latency_s=seconds))
        return out


def _blame(inputs: Sequence[CoachInput], record: EpisodeRecord, notes: Notes) -> None:
    """The hindsight adjustments (see :class:`DSBenchHindsightCoach`), appended to ``notes`` per action."""
    outcome = record.outcome or {}
    end = read_state(inputs[-1])  # the workspace and the env's checks at the end
    order = list(dict.fromkeys(inp.role for inp in inputs))
    last = {inp.role: i for i, inp in enumerate(inputs)}
    agent_role = {inp.agent: inp.role for inp in inputs}
    failed: dict[str, list[str]] = {r: [p for p in end.contract.get(r, ()) if not end.usable(p)] for r in order}
    for p in inputs[-1].given:  # a given file broken: charged to the role whose action the check followed
        check = end.checks.get(p)
        if not end.usable(p) and check is not None and check.agent in agent_role:
            failed[agent_role[check.agent]].append(p)
    delivered = [r for r in order if not failed[r]]
    if record.success:
        quality = min(1.0, max(0.0, float(outcome.get("quality") or 0.0)))
        bonus = 1.0 if outcome.get("beats_baseline", quality > 0) else 0.0
        for r in delivered:
            why = "beats the trivial baseline" if bonus else "no better than the trivial baseline: no bonus"
            notes[last[r]].append((bonus, f"delivered its part of a valid submission that {why}"))
            notes[last[r]].append((quality, f"its part of a submission of quality {quality:.3f}"))
        return
    broken = next((r for r in order if failed[r] and r != order[-1]), None)
    if broken is not None:
        what = ", ".join(_why(end, p) for p in failed[broken])
        notes[last[broken]].append((-2, f"its {what} failed the episode"))
        for i in range(last[broken] + 1, len(inputs)):
            inp = inputs[i]
            stuck = any(s != "ok" for s in inp.tool_status) or bool(failed.get(inp.role))
            if inp.role != broken and stuck:
                notes[i].append((+1, f"blocked by {broken}'s {', '.join(failed[broken])}"))
        for r in order[: order.index(broken)]:
            if r in delivered and end.contract.get(r):
                notes[last[r]].append((+1, "delivered its part of an episode that failed later"))
        return
    analyst = order[-1]
    reason = str(outcome.get("reason", ""))
    rows = outcome.get("stage") == "rows" or (outcome.get("stage") is None and "rows, expected" in reason)
    notes[last[analyst]].append((-2 if rows else -1, f"its invalid submission: {reason[:120]}"))
    for r in delivered:
        if r != analyst and end.contract.get(r):
            notes[last[r]].append((+1, "delivered its part; the submission failed after it"))


def _why(st: _State, path: str) -> str:
    """``X_test.pkl`` missing, or unusable with the check's first problem."""
    check = st.checks.get(path)
    if path not in st.authors:
        return f"missing {path}"
    return f"unusable {path} ({check.problems[0]})" if check is not None and check.problems else f"unusable {path}"


__all__ = ["DSBenchHindsightCoach"]
