"""Coach bias diagnostics, and per-group score normalisation as a countermeasure.

The paper's coach scored regression tasks 1.15-1.67 points higher than classification ones, and the agents
learned to exploit it. :func:`bias_report` tabulates coach scores by role, task type and outcome with 95%
confidence intervals and flags gaps between groups that are both large (``min_gap`` points) and significant
(Welch's t-test, ``alpha``). :func:`normalize_scores` (off unless called) rescales scores within each group to the
global mean and spread, so no group is favoured on average.

    mappa report coach-bias runs/*/trajectories.jsonl [--normalize]
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core import ActionRecord, EpisodeRecord

DIMENSIONS = ("role", "task_type", "outcome")


@dataclass
class GroupStats:
    dimension: str
    group: str
    n: int
    mean: float
    std: float

    @property
    def ci95(self) -> tuple[float, float]:
        if self.n < 2:
            return (float("nan"), float("nan"))
        half = _t95(self.n - 1) * self.std / math.sqrt(self.n)
        return (self.mean - half, self.mean + half)


@dataclass
class Gap:
    dimension: str
    high: str
    low: str
    difference: float
    p_value: float


def _t95(df: int) -> float:
    try:
        from scipy import stats

        return float(stats.t.ppf(0.975, df))
    except ImportError:  # pragma: no cover - scipy comes with scikit-learn
        return 1.96


def _welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) < 2 or len(b) < 2:
        return 1.0
    from scipy import stats

    if statistics.pstdev(a) == 0 and statistics.pstdev(b) == 0:
        return 0.0 if statistics.mean(a) != statistics.mean(b) else 1.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _outcome_label(rec: EpisodeRecord) -> str:
    if not rec.outcome:
        return "unknown"
    return "success" if rec.success else "failure"


def scored_actions(records: Iterable[EpisodeRecord]) -> list[tuple[dict[str, str], float, ActionRecord]]:
    """(group labels, score, action) for every action that carries a coach evaluation."""
    out = []
    for rec in records:
        task_type = str(rec.metadata.get("task_type", "unknown"))
        outcome = _outcome_label(rec)
        for act in rec.actions:
            if act.coach is None:
                continue
            out.append(({"role": act.role, "task_type": task_type, "outcome": outcome}, float(act.coach.score), act))
    return out


def bias_report(
    records: Iterable[EpisodeRecord],
    *,
    min_gap: float = 0.5,
    alpha: float = 0.05,
    score_key: str = "score",
) -> tuple[list[GroupStats], list[Gap]]:
    """Per-group score statistics and the flagged gaps (see the module docstring)."""
    items = scored_actions(records)
    if score_key != "score":
        items = [(g, float(_or(getattr(a.coach, score_key), s)), a) for g, s, a in items]
    groups: list[GroupStats] = []
    gaps: list[Gap] = []
    for dim in DIMENSIONS:
        values: dict[str, list[float]] = defaultdict(list)
        for labels, score, _ in items:
            values[labels[dim]].append(score)
        for name in sorted(values):
            xs = values[name]
            groups.append(
                GroupStats(dim, name, len(xs), statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0)
            )
        names = sorted(values)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                diff = statistics.mean(values[a]) - statistics.mean(values[b])
                p = _welch_p(values[a], values[b])
                if abs(diff) >= min_gap and p < alpha:
                    high, low = (a, b) if diff > 0 else (b, a)
                    gaps.append(Gap(dim, high, low, abs(diff), p))
    return groups, gaps


def normalize_scores(records: Iterable[EpisodeRecord], by: Sequence[str] = ("role", "task_type")) -> int:
    """Rescale coach scores within each group to the global mean and standard deviation (a countermeasure to
    group bias; off by default). Writes the evaluation's ``normalized_score`` and sets the action's reward to
    ``normalized_score / 10``. Returns the number of actions changed."""
    items = scored_actions(records)
    if len(items) < 2:
        return 0
    scores = [s for _, s, _ in items]
    mu, sigma = statistics.mean(scores), statistics.pstdev(scores)
    groups: dict[tuple[str, ...], list[tuple[float, ActionRecord]]] = defaultdict(list)
    for labels, score, act in items:
        groups[tuple(labels[d] for d in by)].append((score, act))
    for members in groups.values():
        xs = [s for s, _ in members]
        g_mu, g_sigma = statistics.mean(xs), statistics.pstdev(xs)
        for score, act in members:
            z = (score - g_mu) / g_sigma if g_sigma > 0 else 0.0
            norm = min(10.0, max(0.0, mu + z * sigma))
            act.coach.normalized_score = norm
            act.reward = norm / 10.0
    return len(items)


def format_report(groups: Sequence[GroupStats], gaps: Sequence[Gap]) -> str:
    lines = [f"{'dimension':<11}{'group':<20}{'n':>6}{'mean':>8}{'95% CI':>18}"]
    for g in groups:
        lo, hi = g.ci95
        ci = f"[{lo:.2f}, {hi:.2f}]" if g.n > 1 else "-"
        lines.append(f"{g.dimension:<11}{g.group:<20}{g.n:>6}{g.mean:>8.2f}{ci:>18}")
    if gaps:
        lines.append("")
        lines.append("FLAGGED systematic gaps:")
        for gap in gaps:
            lines.append(
                f"  {gap.dimension}: '{gap.high}' scored {gap.difference:.2f} points above '{gap.low}' "
                f"(Welch p = {gap.p_value:.2g})"
            )
    else:
        lines.append("\nno systematic gap flagged")
    return "\n".join(lines)
