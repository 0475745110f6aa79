"""A DSBench hindsight coach: :class:`~mappa_envs.coach.dsbench_rules.DSBenchCoach`'s per-action scores, then the
blame moved once the episode's outcome is known (``dsbench-rule-hindsight``; :mod:`mappa_envs.coach.hindsight` has
the protocol and the general rule hindsight coach)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..core import EpisodeRecord
from .dsbench_rules import DSBenchCoach, printed_shapes, row_counts
from .protocol import CoachEvaluation, CoachInput, clamp

Notes = list[list[tuple[float, str]]]


@dataclass
class DSBenchHindsightCoach:
    """The per-action scores of :class:`~mappa_envs.coach.dsbench_rules.DSBenchCoach`, then, knowing the outcome:

    - **A broken hand-over** (the episode failed and a contract file is missing at the end): the first role, in
      pipeline order, with a missing file: its last action -2; every later action that could not deliver or whose
      code failed +1 (it was blocked); the last action of each earlier role that delivered all its files +1 (its
      part was done).
    - **A wrong row count** (every file there, the submission has the wrong number of rows): when the data
      engineer's printed shapes show no X_test with test.csv's row count, its last action -2 and the analyst's last
      +1 (the rows were lost upstream); otherwise the analyst's last action -2.
    - **Another invalid submission** (columns, values) with every file there: the analyst's last action -1, the last
      action of each other role that delivered +1.
    - **Success**: every action +1, and the last action of each role + the submission's quality (0 to 1).

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
    contract = {role: tuple(files) for role, files in inputs[-1].artifacts}
    order = list(dict.fromkeys(inp.role for inp in inputs))
    last = {inp.role: i for i, inp in enumerate(inputs)}
    present = {f.path for f in inputs[-1].files if f.size > 0}
    missing = {r: [p for p in contract.get(r, ()) if p not in present] for r in order}
    delivered = [r for r in order if contract.get(r) and not missing[r]]
    if record.success:
        quality = float(outcome.get("quality") or 0.0)
        for n in notes:
            n.append((+1, "the episode made a valid submission"))
        for r in order:
            notes[last[r]].append((min(1.0, max(0.0, quality)), f"its part of a submission of quality {quality:.3f}"))
        return
    broken = next((r for r in order if missing[r] and r != order[-1]), None)
    if broken is not None:
        notes[last[broken]].append((-2, f"its missing {', '.join(missing[broken])} failed the episode"))
        for i in range(last[broken] + 1, len(inputs)):
            inp = inputs[i]
            stuck = any(s != "ok" for s in inp.tool_status) or (contract.get(inp.role) and missing[inp.role])
            if inp.role != broken and stuck:
                notes[i].append((+1, f"blocked by {broken}'s missing {', '.join(missing[broken])}"))
        for r in order[: order.index(broken)]:
            if r in delivered:
                notes[last[r]].append((+1, "delivered its part of an episode that failed later"))
        return
    analyst = order[-1]
    reason = str(outcome.get("reason", ""))
    if "rows, expected" in reason and "data_engineer" in last:
        culprit = _rows_lost_upstream(inputs)
        if culprit:
            notes[last["data_engineer"]].append((-2, f"{culprit}: the submission's row count ({reason[:80]})"))
            notes[last[analyst]].append((+1, "the test rows were lost before its turn"))
            return
    notes[last[analyst]].append((-2 if "rows, expected" in reason else -1, f"its invalid submission: {reason[:120]}"))
    for r in delivered:
        if r != analyst:
            notes[last[r]].append((+1, "delivered its part; the submission failed after it"))


def _rows_lost_upstream(inputs: Sequence[CoachInput]) -> str:
    """Why the data engineer lost test rows ("" when its printed shapes show X_test whole, or nothing is known)."""
    counts = row_counts(inputs[0].task)
    engineer = [inp for inp in inputs if inp.role == "data_engineer"]
    if counts is None or not engineer:
        return ""
    rows = {n for inp in engineer for out in inp.tool_stdout for n, _ in printed_shapes(out)}
    if not rows or counts[1] in rows:
        return ""
    return f"no X_test shape it printed has test.csv's {counts[1]} rows (printed {sorted(rows)[:6]})"


__all__ = ["DSBenchHindsightCoach"]
