"""How far two coaches agree on the same actions (``mappa report coach-agreement``).

Two evaluations of each action, for example the one a run was trained with (the action's ``coach``) and another coach's
from ``mappa rescore`` (``info["rescored"]``), are compared per role and per task type: Spearman's rank
correlation, the mean difference (B - A) with a 95% interval, the confusion of high (> 5) and low scores, and
both score histograms (integer bins 0-10).

>>> round(spearman([1, 2, 3, 4], [10, 20, 30, 40]), 3), round(spearman([1, 2, 3], [3, 2, 1]), 3)
(1.0, -1.0)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core import EpisodeRecord

HIGH = 5.0
"""A score above this is "high" in the confusion table (the rule coach's neutral score is 5)."""


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share their mean rank
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties: mean ranks); NaN when either side is constant or there are < 2 pairs."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} and {len(b)} scores")
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else float("nan")


@dataclass
class Agreement:
    """Two coaches' scores of the same actions of one group (a role, a task type, or all)."""

    group: str
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.a)

    @property
    def rank_correlation(self) -> float:
        return spearman(self.a, self.b)

    @property
    def mean_difference(self) -> tuple[float, float, float]:
        """Mean of B - A with a 95% interval (normal approximation)."""
        d = [y - x for x, y in zip(self.a, self.b, strict=True)]
        if not d:
            return (float("nan"),) * 3
        m = sum(d) / len(d)
        if len(d) < 2:
            return m, float("nan"), float("nan")
        half = 1.96 * math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))
        return m, m - half, m + half

    @property
    def confusion(self) -> dict[str, int]:
        """Counts of (A high or low, B high or low), high meaning a score above :data:`HIGH`."""
        out = {"high/high": 0, "high/low": 0, "low/high": 0, "low/low": 0}
        for x, y in zip(self.a, self.b, strict=True):
            out[f"{'high' if x > HIGH else 'low'}/{'high' if y > HIGH else 'low'}"] += 1
        return out

    def histogram(self, side: str) -> list[int]:
        """Scores of coach ``side`` ('a' or 'b') in integer bins 0-10."""
        counts = [0] * 11
        for s in self.a if side == "a" else self.b:
            counts[min(10, max(0, round(s)))] += 1
        return counts


def action_groups(record: EpisodeRecord, role: str) -> tuple[tuple[str, str], ...]:
    """The (dimension, group) pairs an action of ``role`` in ``record`` counts in: all, its role, its task type."""
    return (("all", "all"), ("role", role), ("task_type", str(record.metadata.get("task_type", "?"))))


def agreement(
    records: Iterable[EpisodeRecord],
    key_a: str = "coach",
    key_b: str = "rescored",
    other: Iterable[EpisodeRecord] | None = None,
) -> dict[str, dict[str, Agreement]]:
    """Per dimension (``all``, ``role``, ``task_type``), per group, the scores of ``key_a`` and ``key_b`` on the same
    actions. With ``other``, ``key_b`` is read from its records, matched by (episode id, action index). Actions
    missing either evaluation are left out."""
    b_scores: dict[tuple[str, int], float] | None = None
    if other is not None:
        b_scores = {
            (rec.episode_id, act.index): ev.score
            for rec in other
            for act in rec.actions
            if (ev := act.evaluation(key_b)) is not None
        }
    out: dict[str, dict[str, Agreement]] = defaultdict(dict)
    for rec in records:
        for act in rec.actions:
            a = act.evaluation(key_a)
            if a is None:
                continue
            if b_scores is None:
                ev_b = act.evaluation(key_b)
                b = ev_b.score if ev_b is not None else None
            else:
                b = b_scores.get((rec.episode_id, act.index))
            if b is None:
                continue
            for dim, group in action_groups(rec, act.role):
                g = out[dim].setdefault(group, Agreement(group))
                g.a.append(float(a.score))
                g.b.append(b)
    return dict(out)


def format_agreement(table: dict[str, dict[str, Agreement]], name_a: str = "A", name_b: str = "B") -> str:
    """Markdown: one row per group (pairs, rank correlation, mean difference with its interval, high/low
    confusion), then the histograms of the whole set."""
    lines = [
        f"| group | actions | Spearman | {name_b} - {name_a} [95% CI] | high/high | high/low | low/high | low/low |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for dim in ("all", "role", "task_type"):
        for group, g in sorted(table.get(dim, {}).items()):
            m, lo, hi = g.mean_difference
            c = g.confusion
            label = group if dim == "all" else f"{dim} {group}"
            lines.append(
                f"| {label} | {g.n} | {g.rank_correlation:.2f} | {m:+.2f} [{lo:+.2f}, {hi:+.2f}] | {c['high/high']} | "
                f"{c['high/low']} | {c['low/high']} | {c['low/low']} |"
            )
    whole = table.get("all", {}).get("all")
    if whole is not None:
        lines += [
            "",
            "score histograms (bins 0-10):",
            f"{name_a}: {whole.histogram('a')}",
            f"{name_b}: {whole.histogram('b')}",
        ]
    return "\n".join(lines)


__all__ = ["HIGH", "Agreement", "action_groups", "agreement", "format_agreement", "spearman"]
