"""How well a coach's per-action scores predict ground truth: the AUROC of the score for the episode's success, and
a reliability table (score bucket -> success rate), per role and task type (``mappa report coach-agreement``).

A coach whose scores do not separate the actions of successful episodes from those of failed ones (AUROC near
0.5) gives process rewards unrelated to the outcome; a gap between task types (the paper's coach scored
regression above classification) shows as different AUROCs and reliability rows.

>>> auroc([0.9, 0.8, 0.3], [True, True, False])
1.0
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core import EpisodeRecord
from ..metrics import wilson_interval
from .agreement import action_groups

BUCKETS = ((0, 2), (2, 4), (4, 6), (6, 8), (8, 10.01))
"""Score buckets of the reliability table: [0, 2), [2, 4), ... [8, 10]."""


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The probability that a random positive's score exceeds a random negative's (ties count one half): the
    Mann-Whitney form of the area under the ROC curve. NaN without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def auroc_se(a: float, n_pos: int, n_neg: int) -> float:
    """The standard error of an AUROC (Hanley & McNeil, 1982); NaN without both classes."""
    if math.isnan(a) or not n_pos or not n_neg:
        return float("nan")
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))


def auroc_interval(a: float, n_pos: int, n_neg: int) -> tuple[float, float]:
    """A 95% interval of an AUROC (Hanley & McNeil's standard error)."""
    se = auroc_se(a, n_pos, n_neg)
    if math.isnan(se):
        return (float("nan"), float("nan"))
    return (max(0.0, a - 1.96 * se), min(1.0, a + 1.96 * se))


@dataclass
class Calibration:
    group: str
    scores: list[float] = field(default_factory=list)
    success: list[bool] = field(default_factory=list)

    @property
    def auroc(self) -> float:
        return auroc(self.scores, self.success)

    @property
    def auroc_ci95(self) -> tuple[float, float]:
        n_pos = sum(self.success)
        return auroc_interval(self.auroc, n_pos, len(self.success) - n_pos)

    @property
    def auroc_se(self) -> float:
        n_pos = sum(self.success)
        return auroc_se(self.auroc, n_pos, len(self.success) - n_pos)

    @property
    def informative(self) -> bool:
        """The score separates success from failure beyond chance: the AUROC's interval excludes 0.5."""
        lo, hi = self.auroc_ci95
        return not math.isnan(lo) and (lo > 0.5 or hi < 0.5)

    def reliability(self) -> list[tuple[str, int, float, tuple[float, float]]]:
        """Per score bucket: (bucket, actions, success rate of their episodes, its Wilson interval)."""
        rows = []
        for lo, hi in BUCKETS:
            hits = [y for s, y in zip(self.scores, self.success, strict=True) if lo <= s < hi]
            k = sum(hits)
            rate = k / len(hits) if hits else float("nan")
            interval = wilson_interval(k, len(hits)) if hits else (float("nan"), float("nan"))
            rows.append((f"[{lo:g}, {min(hi, 10):g}]", len(hits), rate, interval))
        return rows


def calibration(records: Iterable[EpisodeRecord], key: str = "coach") -> dict[str, dict[str, Calibration]]:
    """Per dimension (``all``, ``role``, ``task_type``) and group: each scored action's score (its evaluation
    ``key``: :meth:`~mappa_envs.core.ActionRecord.evaluation`) and whether its episode succeeded."""
    out: dict[str, dict[str, Calibration]] = defaultdict(dict)
    for rec in records:
        for act in rec.actions:
            ev = act.evaluation(key)
            if ev is None:
                continue
            for dim, group in action_groups(rec, act.role):
                c = out[dim].setdefault(group, Calibration(group))
                c.scores.append(float(ev.score))
                c.success.append(rec.success)
    return dict(out)


@dataclass(frozen=True)
class CalibrationGap:
    """Two groups of one dimension (two task types, two roles) whose AUROCs differ: ``diff = auroc_a - auroc_b``,
    with a two-sided z-test p-value. The actions are treated as independent samples, but the actions of one episode
    share its success label: with several actions per episode the p-value is optimistic (read a borderline
    "significant" with that in mind)."""

    dimension: str
    a: str
    b: str
    diff: float
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < 0.05


def calibration_gaps(table: dict[str, dict[str, Calibration]], dims: Sequence[str] = ("task_type", "role")):
    """Every pair of groups, per dimension, whose AUROCs are both defined: how far the coach's scores predict
    success better for one than for the other (the paper's regression-above-classification bias shows here)."""
    gaps = []
    for dim in dims:
        groups = sorted((g, c) for g, c in table.get(dim, {}).items() if not math.isnan(c.auroc_se))
        for i, (ga, ca) in enumerate(groups):
            for gb, cb in groups[i + 1 :]:
                diff, se = ca.auroc - cb.auroc, math.hypot(ca.auroc_se, cb.auroc_se)
                if se == 0:  # both AUROCs exact (0 or 1): any difference is certain
                    p = 1.0 if diff == 0 else 0.0
                else:
                    p = math.erfc(abs(diff) / se / math.sqrt(2))
                gaps.append(CalibrationGap(dim, ga, gb, diff, p))
    return gaps


def format_calibration(table: dict[str, dict[str, Calibration]], name: str = "coach") -> str:
    """Markdown: per group the AUROC with its interval (and whether it is informative), then the reliability table
    of the whole set."""
    lines = [f"calibration of {name!r} against the episode's success:"]
    lines += ["| group | actions | successes | AUROC [95% CI] |", "|---|---|---|---|"]
    for dim in ("all", "role", "task_type"):
        for group, c in sorted(table.get(dim, {}).items()):
            lo, hi = c.auroc_ci95
            note = "" if c.informative else " (not above chance)"
            label = group if dim == "all" else f"{dim} {group}"
            value = (
                "- (every episode had the same outcome)"
                if math.isnan(c.auroc)
                else f"{c.auroc:.2f} [{lo:.2f}, {hi:.2f}]{note}"
            )
            lines.append(f"| {label} | {len(c.scores)} | {sum(c.success)} | {value} |")
    whole = table.get("all", {}).get("all")
    if whole is not None:
        lines += ["", "| score | actions | episode success [95% CI] |", "|---|---|---|"]
        for bucket, n, rate, (lo, hi) in whole.reliability():
            lines.append(f"| {bucket} | {n} | {rate:.0%} [{lo:.0%}, {hi:.0%}] |" if n else f"| {bucket} | 0 | - |")
    gaps = calibration_gaps(table)
    if gaps:
        lines += ["", "| calibration gap | AUROC difference | p (two-sided) |", "|---|---|---|"]
        for g in gaps:
            mark = " (significant)" if g.significant else ""
            lines.append(f"| {g.dimension}: {g.a} - {g.b} | {g.diff:+.2f} | {g.p_value:.3g}{mark} |")
    return "\n".join(lines)


__all__ = [
    "BUCKETS",
    "Calibration",
    "CalibrationGap",
    "auroc",
    "auroc_interval",
    "auroc_se",
    "calibration",
    "calibration_gaps",
    "format_calibration",
]
