"""Statistics over episode records: accuracy with confidence intervals and per-role behaviour."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .core import EpisodeRecord, fenced_blocks, tool_languages


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sensible at 0 and n, unlike the normal approximation)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class RoleStats:
    role: str
    actions: int = 0
    code_actions: int = 0
    """Actions holding at least one closed block in a tool's language (```python, ```sql...: :func:`tool_languages`),
    whether or not the role could call that tool."""
    tool_actions: int = 0
    """Actions that called a tool at least once."""
    tool_calls: int = 0
    tool_ok: int = 0
    chars: int = 0
    issues: int = 0

    @property
    def code_rate(self) -> float:
        return self.code_actions / self.actions if self.actions else 0.0

    @property
    def tool_call_rate(self) -> float:
        """The share of actions that called a tool (one definition for training, evaluation and reports)."""
        return self.tool_actions / self.actions if self.actions else 0.0

    @property
    def tool_success_rate(self) -> float:
        return self.tool_ok / self.tool_calls if self.tool_calls else 0.0

    @property
    def mean_chars(self) -> float:
        return self.chars / self.actions if self.actions else 0.0


def role_stats(records: Sequence[EpisodeRecord]) -> dict[str, RoleStats]:
    stats: dict[str, RoleStats] = {}
    languages = tool_languages()
    for rec in records:
        for act in rec.actions:
            s = stats.setdefault(act.role, RoleStats(act.role))
            s.actions += 1
            s.code_actions += bool(fenced_blocks(act.output, *languages)[0])
            s.tool_actions += bool(act.tool_calls)
            s.tool_calls += len(act.tool_calls)
            s.tool_ok += sum(c.result.ok for c in act.tool_calls)
            s.chars += len(act.output)
            s.issues += len(act.issues)
    return stats


def accuracy(records: Sequence[EpisodeRecord]) -> tuple[int, int]:
    """(successful episodes, graded episodes): :attr:`EpisodeRecord.success` of every episode with an outcome."""
    graded = [r for r in records if r.outcome]
    return sum(r.success for r in graded), len(graded)


def summary_table(records: Sequence[EpisodeRecord]) -> str:
    """Per-role behaviour and overall accuracy as a text table."""
    lines = [f"{'role':<16}{'actions':>8}{'code':>8}{'tool ok':>9}{'chars':>8}{'issues':>8}"]
    for s in role_stats(records).values():
        tool = f"{s.tool_ok}/{s.tool_calls}" if s.tool_calls else "-"
        lines.append(f"{s.role:<16}{s.actions:>8}{s.code_rate:>8.0%}{tool:>9}{s.mean_chars:>8.0f}{s.issues:>8}")
    k, n = accuracy(records)
    lo, hi = wilson_interval(k, n)
    quality = [r.quality for r in records if r.quality is not None]
    name = "success rate" if quality else "accuracy"  # a graded task's word, an answer task's
    lines.append(f"{name}: {k}/{n} = {k / n if n else 0:.1%} (95% CI {lo:.1%}-{hi:.1%})")
    if quality:
        lines.append(f"mean quality: {sum(quality) / len(quality):.3f} over {len(quality)} episodes")
    return "\n".join(lines)


def per_task(records: Sequence[EpisodeRecord]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if r.outcome:
            out[r.task_id].append(r.success)
    return dict(out)


def mcnemar_exact(before: Sequence[float], after: Sequence[float]) -> dict[str, float | int]:
    """Exact McNemar test of paired outcomes (the same problems before and after): a binomial test, p = 1/2, on
    the discordant pairs (``gained``: after > before; ``lost``: after < before). ``p_value`` is two-sided;
    ``p_value_gain`` one-sided, for "after is better". On numbers (a problem's mean over k samples) it is the exact
    sign test."""
    if len(before) != len(after):
        raise ValueError(f"paired outcomes need equal lengths, not {len(before)} and {len(after)}")
    gained = sum(1 for b, a in zip(before, after, strict=True) if float(a) > float(b))
    lost = sum(1 for b, a in zip(before, after, strict=True) if float(a) < float(b))
    n = gained + lost

    def at_least(k: int) -> float:  # P(X >= k), X ~ Binomial(n, 1/2)
        return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0

    return {
        "pairs": len(before),
        "gained": gained,
        "lost": lost,
        "p_value": min(1.0, 2 * min(at_least(gained), at_least(lost))) if n else 1.0,
        "p_value_gain": at_least(gained),
    }


def paired_test(task_ids: Sequence[str], before: Sequence[bool], after: Sequence[bool]) -> dict[str, Any]:
    """The paired test of two evaluations of the same episodes (``task_ids`` in episode order, the same for both).
    With one sample per problem: the exact McNemar test on the episodes. With k samples of a problem (its id
    repeated), the samples are not independent: each problem's mean outcome is one pair (the exact sign test on
    problems), ``unit`` says which."""
    if not (len(task_ids) == len(before) == len(after)):
        raise ValueError(f"{len(task_ids)} task ids for {len(before)} and {len(after)} outcomes")
    if len(set(task_ids)) == len(task_ids):
        return {**mcnemar_exact(before, after), "unit": "episode"}
    order: list[str] = []
    sums: dict[str, list[float]] = {}
    for tid, b, a in zip(task_ids, before, after, strict=True):
        if tid not in sums:
            order.append(tid)
            sums[tid] = [0.0, 0.0, 0]
        sums[tid][0] += float(b)
        sums[tid][1] += float(a)
        sums[tid][2] += 1
    means_b = [sums[t][0] / sums[t][2] for t in order]
    means_a = [sums[t][1] / sums[t][2] for t in order]
    return {**mcnemar_exact(means_b, means_a), "unit": "problem"}


def _printed_numbers(text: str) -> list[str]:
    import re

    return re.findall(r"-?\d+(?:\.\d+)?", text)


def role_behaviour(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, float]]:
    """Per role, what its actions did (MathChat's behaviour figures; roles without answers or tools get zeros):

    - ``boxed_rate``: actions with a numeric ``\\boxed{}`` answer;
    - ``right_answer_rate``: actions whose ``\\boxed{}`` answer equals the episode's ground truth;
    - ``code_rate``: actions with a closed ```python block; ``tool_success_rate``: tool calls that ran OK;
    - ``right_number_rate``: episodes where the role's code, run OK, printed the ground truth as its last number.
    """
    from .grading import extract_answer, math_equal, to_number

    out: dict[str, dict[str, float]] = {}
    stats = role_stats(records)
    for role, s in stats.items():
        acts = [(r, a) for r in records for a in r.actions if a.role == role]
        answers = [(r, extract_answer(a.output)) for r, a in acts]
        numeric = [(r, x) for r, x in answers if x is not None and to_number(x) is not None]
        truth = [r for r in records if r.ground_truth is not None and any(a.role == role for a in r.actions)]
        printed = 0
        for r in truth:
            lasts = [
                v[-1]
                for a in r.actions
                if a.role == role
                for c in a.tool_calls
                if c.result.ok and (v := _printed_numbers(c.result.stdout))
            ]
            printed += any(math_equal(x, str(r.ground_truth)) for x in lasts)
        out[role] = {
            "actions": s.actions,
            "boxed_rate": len(numeric) / len(acts) if acts else 0.0,
            "right_answer_rate": (
                sum(r.ground_truth is not None and math_equal(x, str(r.ground_truth)) for r, x in numeric) / len(acts)
                if acts
                else 0.0
            ),
            "code_rate": s.code_rate,
            "tool_success_rate": s.tool_success_rate,
            "right_number_rate": printed / len(truth) if truth and s.tool_calls else 0.0,
        }
    return out


BEHAVIOUR_LABELS = (
    ("boxed_rate", "boxed answer"),
    ("right_answer_rate", "right answer"),
    ("code_rate", "code"),
    ("tool_success_rate", "tool success"),
    ("right_number_rate", "right number printed"),
)
"""The figures of :func:`role_behaviour` with their names in tables and console lines."""


def paired_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """The exact paired test (:func:`paired_test`) between two evaluations of the same held-out episodes
    (``task_ids`` and ``outcomes`` in the same order, as ``mappa train``'s ``eval.json`` holds them), with both
    accuracies and their Wilson intervals; None when they are not the same episodes."""
    if before.get("task_ids") != after.get("task_ids") or "outcomes" not in before or "outcomes" not in after:
        return None
    test = paired_test(before["task_ids"], before["outcomes"], after["outcomes"])
    return {
        **test,
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "ci95_before": list(wilson_interval(before["correct"], before["episodes"])),
        "ci95_after": list(wilson_interval(after["correct"], after["episodes"])),
    }
