"""Pooled statistics of a multi-seed ablation (``mappa ablate``: arms x seeds).

    mappa report ablation OUT [--out DIR]

Reads ``OUT/ablation.json`` (the arms with their ``information`` labels, the seeds) and every run
``OUT/<arm>/seed-<s>/`` into tidy rows, one per evaluated episode: (arm, seed, split, task_id, category, before,
after). A run whose ``eval.json`` has no ``after`` is unfinished: skipped, counted and named. The figures come
out as plain data (:func:`summarize`); :mod:`benchmarks.ablation_report` writes them as Markdown, JSON and PNG.

Method. Outcomes are averaged to one cell per (seed, problem). A mean over the seeds x problems table, an arm's
accuracy or the paired difference of two arms (same seed: same starting weights and prompts; same problems), has
crossed random seed and problem effects, y[s, p] = mu + a[s] + b[p] + e[s, p], so that

    Var(mean) = v_seed / S + v_problem / P + v_residual / (S * P).

On a difference, ``v_seed`` is the arm x seed interaction, ``v_problem`` the arm x problem one. The components are
the ANOVA estimators of the balanced table (statsmodels ``anova_lm``'s sums of squares), which are the REML
estimates there; one at or below zero is pooled into the residual, as REML sets it to zero. ``MixedLM`` with the
same crossed components was tried first: on 0/1 outcomes it failed to converge, switched optimisers and left a
seed component of 2.6e-4 where REML's is exactly 0. The test is a t test with Satterthwaite's degrees of freedom
(none in statsmodels for this: the formula is in :func:`_crossed_variance`); all pairwise p-values (every split)
are Holm-corrected together (``multipletests``).

Small-seed caveats. With three seeds ``v_seed`` rests on two degrees of freedom. Per-seed differences that spread
more than the problem-level noise explains make ``v_seed`` dominate and the df fall to about S - 1 = 2: a
difference seen on one seed is not significant (per seed +40, 0, 0 of 96: p = 0.42). Differences that spread less
set ``v_seed`` to zero and the problems decide (df about S * P). The switch is abrupt: on 96 problems with A-only
and B-only counts (11, 2), (8, 2), (5, 2) on three seeds p = 0.0009, with (12, 2), (8, 2), (4, 2) p = 0.12; a
difference significant with ``v_seed`` = 0 deserves the per-seed table beside it. A difference carried by the same
few problems in every seed is evidence about those problems, not multiplied by the seeds. Accuracy is a linear
probability model: intervals are clipped to [0, 1], and with few discordant problems the t approximation is more
liberal than an exact test (5 problems right for A only, on every seed: p = 0.025 against the exact sign test's
0.0625). Per-seed exact McNemar tests are for reading, uncorrected.

Power: :func:`minimum_detectable_difference` (seed-level paired t test, df = seeds - 1, ``TTestPower``) and
:func:`per_seed_sd` (the fitted components as that design's per-seed SD), for a pre-registration.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from mappa_envs.metrics import paired_test

COLUMNS = ("arm", "seed", "split", "task_id", "category", "before", "after", "before_lenient", "after_lenient")
"""``before``/``after``: the task's own (strict) outcome; ``*_lenient``: the lenient grade where the evaluation holds
one (MathChat: an unboxed final number counts too; ``lenient_outcomes`` in eval.json), else missing."""
PLANNED_SEEDS = (5, 10)
"""Seed counts, beside the ablation's own, at which the report gives the minimum detectable difference."""


@dataclass
class Ablation:
    """An ablation folder read: evaluated episodes as tidy ``rows`` (:data:`COLUMNS`), training accuracy per
    iteration as ``curves`` (arm, seed, iteration, accuracy), the runs ``skipped`` and other ``notes``."""

    path: Path
    arms: dict[str, str]
    """arm name -> its information label, in ablation.json's order"""
    seeds: list[int]
    preset: str | None = None
    rows: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=("arm", "seed", "iteration", "accuracy")))
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_ablation(path: str | Path) -> Ablation:
    """Every finished run of the ablation folder ``path`` (layout: module docstring); the others in ``skipped``."""
    path = Path(path)
    spec = json.loads((path / "ablation.json").read_text())
    arms = {a["name"]: a.get("information") or _config_label(path / a["name"]) for a in spec["arms"]}
    ab = Ablation(path, arms, [int(s) for s in spec["seeds"]], spec.get("preset"))
    rows, curves = [], []
    for arm in arms:
        for seed in ab.seeds:
            run = path / arm / f"seed-{seed}"
            episodes = _read_run(run, f"{arm}/seed-{seed}", ab.notes, ab.skipped)
            if episodes is None:
                continue
            rows += [(arm, seed, *e) for e in episodes]
            curves += [(arm, seed, m["iteration"], m["accuracy"]) for m in _metrics(run) if "accuracy" in m]
    ab.rows = pd.DataFrame(rows, columns=COLUMNS)
    ab.curves = pd.DataFrame(curves, columns=ab.curves.columns)
    ab.notes += _unshared_before(ab.rows)
    return ab


def _config_label(arm_dir: Path) -> str:
    for config in sorted(arm_dir.glob("seed-*/config.json")):
        return str(json.loads(config.read_text()).get("reward_information", "?"))
    return "?"


def _metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _read_run(run: Path, label: str, notes: list[str], skipped: list[str]) -> list[tuple] | None:
    """(split, task_id, category, before, after, before_lenient, after_lenient) per episode of one run (the lenient
    grades None where the evaluation has none); None (and a line in ``skipped``) when
    the run is missing or unfinished."""
    if not (run / "eval.json").is_file():
        skipped.append(f"{label}: no eval.json (missing or unfinished)")
        return None
    ev = json.loads((run / "eval.json").read_text())
    if not ev.get("after"):
        skipped.append(f"{label}: no after-training evaluation in eval.json (unfinished)")
        return None
    main = ev["after"].get("split", "main")
    pairs = {main: (ev.get("before"), ev["after"])}
    pairs |= {name: (p.get("before"), p.get("after")) for name, p in (ev.get("splits") or {}).items()}
    episodes = []
    for split, (before, after) in pairs.items():
        if not before or not after or before.get("task_ids") != after.get("task_ids"):
            notes.append(f"{label}: split {split} left out (no before/after pair on the same episodes)")
            continue
        ids = after["task_ids"]
        categories = after.get("categories") or before.get("categories") or ["all"] * len(ids)
        missing = [None] * len(ids)
        lenient = (before.get("lenient_outcomes") or missing, after.get("lenient_outcomes") or missing)
        outcomes = zip(ids, categories, before["outcomes"], after["outcomes"], *lenient, strict=True)
        episodes += [(split, str(t), str(c), bool(b), bool(a), lb, la) for t, c, b, a, lb, la in outcomes]
    return episodes


def _unshared_before(rows: pd.DataFrame) -> list[str]:
    """Arms of one seed should share their before-training evaluation; a note per (seed, split) where not."""
    notes = []
    for (seed, split), group in rows.groupby(["seed", "split"], sort=False):
        if group.groupby("arm", sort=False)["before"].apply(tuple).nunique() > 1:
            notes.append(f"seed {seed}, split {split}: the arms' before-training evaluations differ")
    return notes


@dataclass(frozen=True)
class Estimate:
    """A mean over a seeds x problems table with its t interval; the variance components behind it."""

    estimate: float
    se: float
    df: float
    low: float
    high: float
    p_value: float
    """two-sided, of mean = 0"""
    seeds: int
    problems: int
    var_seed: float
    var_problem: float
    var_residual: float


def crossed_mean(cells: np.ndarray, level: float = 0.95) -> Estimate:
    """The mean of ``cells`` (seeds x problems) with crossed random seed and problem effects (module docstring).
    With one seed (or one problem) the other factor is the only one: a one-sample t interval over it."""
    cells = np.asarray(cells, dtype=float)
    n_seeds, n_problems = cells.shape
    if min(cells.shape) > 1:
        var, df, comps = _crossed_variance(cells)
    else:  # one seed (or one problem): its variation is all there is, a component of its own
        flat = cells.ravel()
        spread = float(flat.var(ddof=1)) if flat.size > 1 else math.nan
        var, df = spread / flat.size, flat.size - 1
        comps = (spread, 0.0, 0.0) if n_problems == 1 else (0.0, spread, 0.0)
    mean, se = float(cells.mean()), math.sqrt(var)
    if se > 0:
        half = stats.t.ppf(0.5 + level / 2, df) * se
        low, high, p = float(mean - half), float(mean + half), float(2 * stats.t.sf(abs(mean) / se, df))
    elif se == 0:  # every cell alike: nothing varies, the mean is exact
        low, high, p = mean, mean, 1.0 if mean == 0 else 0.0
    else:  # one cell
        low, high, p = math.nan, math.nan, math.nan
    return Estimate(mean, se, float(df), low, high, p, n_seeds, n_problems, *map(float, comps))


def _crossed_variance(cells: np.ndarray) -> tuple[float, float, tuple[float, float, float]]:
    """(variance of the mean, Satterthwaite df, (v_seed, v_problem, v_residual)) of a balanced seeds x problems
    table. With mean squares M_k on d_k degrees of freedom and V * S * P = sum(c_k * M_k) (c = 1 for each kept
    factor, 1 - kept for the residual), df = (sum c_k M_k)^2 / sum((c_k M_k)^2 / d_k)."""
    n_seeds, n_problems = cells.shape
    ss = _sums_of_squares(cells)
    res_ss, res_df = ss.pop("residual")
    divisor = {"seed": n_problems, "problem": n_seeds}
    while True:  # pool the smallest factor whose component is not positive, then look again
        ms_res = res_ss / res_df
        low = [k for k in ss if ss[k][0] / ss[k][1] <= ms_res]
        if not low:
            break
        k = min(low, key=lambda k: ss[k][0] / ss[k][1])
        res_ss, res_df = res_ss + ss[k][0], res_df + ss.pop(k)[1]
    terms = [(1.0, s / d, d) for s, d in ss.values()] + [(1.0 - len(ss), ms_res, res_df)]
    total = sum(c * m for c, m, _ in terms)
    spread = sum((c * m) ** 2 / d for c, m, d in terms if c)
    comps = {k: (s / d - ms_res) / divisor[k] for k, (s, d) in ss.items()}
    df = total**2 / spread if spread > 0 else math.inf
    return total / (n_seeds * n_problems), df, (comps.get("seed", 0.0), comps.get("problem", 0.0), ms_res)


def _sums_of_squares(cells: np.ndarray) -> dict[str, tuple[float, int]]:
    """(sum of squares, df) of seed, problem and residual: the two-way ANOVA table of a balanced table with one
    cell per (seed, problem), statsmodels ``anova_lm``'s, from row and column means (``anova_lm`` would fit an OLS
    on S + P dummy columns for it: a QR decomposition that BLAS threads make slow on a busy machine)."""
    n_seeds, n_problems = cells.shape
    grand = cells.mean()
    seed_means, problem_means = cells.mean(axis=1, keepdims=True), cells.mean(axis=0, keepdims=True)
    return {
        "seed": (float(n_problems * ((seed_means - grand) ** 2).sum()), n_seeds - 1),
        "problem": (float(n_seeds * ((problem_means - grand) ** 2).sum()), n_problems - 1),
        "residual": (
            float(((cells - seed_means - problem_means + grand) ** 2).sum()),
            (n_seeds - 1) * (n_problems - 1),
        ),
    }


def per_seed_sd(est: Estimate, n_seeds: int | None = None, n_problems: int | None = None) -> float:
    """The per-seed SD of a seed-level design giving ``est``'s standard error at ``n_seeds`` x ``n_problems``
    (default: its own), from its variance components: sqrt(S * (v_seed/S + v_problem/P + v_residual/(S*P)))."""
    s, p = n_seeds or est.seeds, n_problems or est.problems
    return math.sqrt(s * (est.var_seed / s + est.var_problem / p + est.var_residual / (s * p)))


def minimum_detectable_difference(sd_per_seed: float, n_seeds: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference a paired t test over ``n_seeds`` seed-level differences of SD
    ``sd_per_seed`` detects (two-sided ``alpha``, ``power``): statsmodels ``TTestPower``, df = seeds - 1.

    >>> round(minimum_detectable_difference(0.05, 3), 3)
    0.163
    """
    if n_seeds < 2 or not sd_per_seed > 0:
        return math.nan
    effect = TTestPower().solve_power(nobs=n_seeds, alpha=alpha, power=power, alternative="two-sided")
    return float(effect * sd_per_seed)


def _cells(rows: pd.DataFrame, arm: str, split: str, column: str) -> pd.DataFrame:
    """seeds x problems: an arm's mean outcome per (seed, problem) on a split."""
    sub = rows[(rows["arm"] == arm) & (rows["split"] == split)]
    return sub.pivot_table(index="seed", columns="task_id", values=column, aggfunc="mean").dropna(axis=1)


def _numbers(est: Estimate, accuracy: bool = False) -> dict[str, float]:
    """An estimate's figures; an accuracy's interval clipped to [0, 1] and without the (meaningless) p of 0."""
    low, high = (max(0.0, est.low), min(1.0, est.high)) if accuracy else (est.low, est.high)
    keys = ("estimate", "se", "df", "seeds", "problems", "var_seed", "var_problem", "var_residual")
    figures = {"low": low, "high": high} | {k: getattr(est, k) for k in keys}
    return figures if accuracy else figures | {"p_value": est.p_value}


def _accuracy(rows: pd.DataFrame, split: str, arm: str, information: str) -> dict[str, Any]:
    after, before = (crossed_mean(_cells(rows, arm, split, c).to_numpy()) for c in ("after", "before"))
    entry = {"split": split, "arm": arm, "information": information}
    change = after.estimate - before.estimate
    entry |= {"before": _numbers(before, True), "after": _numbers(after, True), "change": change}
    sub = rows[(rows["arm"] == arm) & (rows["split"] == split)]
    if len(sub) and sub[["before_lenient", "after_lenient"]].notna().all().all():  # every episode graded leniently
        b, a = (float(sub[c].astype(bool).mean()) for c in ("before_lenient", "after_lenient"))
        entry["lenient"] = {"before": b, "after": a, "change": a - b}
    return entry


def _difference(rows: pd.DataFrame, split: str, a: str, b: str, arms: dict[str, str]) -> dict[str, Any] | None:
    """Arm ``a`` minus arm ``b`` after training, paired by seed and problem, with the per-seed figures and the
    minimum detectable difference at this and :data:`PLANNED_SEEDS` seeds; None when the two share no cells."""
    ca, cb = _cells(rows, a, split, "after"), _cells(rows, b, split, "after")
    diff = (ca - cb).dropna(axis=0, how="all").dropna(axis=1)
    if diff.size < 2:
        return None
    est = crossed_mean(diff.to_numpy())
    per_seed = [_one_seed(int(seed), ca.loc[seed, diff.columns], cb.loc[seed, diff.columns]) for seed in diff.index]
    counts = list(dict.fromkeys((est.seeds, *PLANNED_SEEDS)))
    sd = {n: per_seed_sd(est, n) for n in counts}
    observed = float(np.std([d["difference"] for d in per_seed], ddof=1)) if len(per_seed) > 1 else math.nan
    power = {
        "sd_per_seed": sd[est.seeds],
        "sd_per_seed_observed": observed,
        "mdd": {str(n): minimum_detectable_difference(sd[n], n) for n in counts},
    }
    entry = {"split": split, "a": a, "b": b, "information_a": arms[a], "information_b": arms[b]}
    return entry | _numbers(est) | {"per_seed": per_seed, "power": power}


def _one_seed(seed: int, a: pd.Series, b: pd.Series) -> dict[str, Any]:
    """One seed alone: the mean difference and the exact McNemar (sign) test of a's cells against b's."""
    test = paired_test(list(a.index), b.tolist(), a.tolist())
    difference = float((a - b).mean())
    return {
        "seed": seed,
        "difference": difference,
        "a_better": test["gained"],
        "b_better": test["lost"],
        "p_value": test["p_value"],
    }


def _categories(ab: Ablation) -> list[dict[str, Any]]:
    groups = ab.rows.groupby(["split", "arm", "category"], sort=False)
    table = groups.agg(
        seeds=("seed", "nunique"), episodes=("after", "size"), before=("before", "sum"), after=("after", "sum")
    )
    return [
        {"split": s, "arm": a, "information": ab.arms[a], "category": c, **{k: int(v) for k, v in r.items()}}
        for (s, a, c), r in table.iterrows()
    ]


def _curves(ab: Ablation) -> list[dict[str, Any]]:
    table = ab.curves.groupby(["arm", "iteration"], sort=False)["accuracy"].agg(["mean", "min", "max", "std", "count"])
    return [
        {"arm": arm, "information": ab.arms[arm], "iteration": int(it), "seeds": int(r["count"])}
        | {k: float(r[k]) for k in ("mean", "min", "max", "std")}
        for (arm, it), r in table.sort_index(level=1, sort_remaining=False).iterrows()
    ]


def summarize(ab: Ablation) -> dict[str, Any]:
    """Every figure of the report, as plain data (the JSON file; the Markdown is written from it)."""
    splits = list(dict.fromkeys(ab.rows["split"]))
    present = [a for a in ab.arms if (ab.rows["arm"] == a).any()]
    accuracy = [_accuracy(ab.rows, s, a, ab.arms[a]) for s in splits for a in present]
    pairs = [_difference(ab.rows, s, a, b, ab.arms) for s in splits for a, b in combinations(present, 2)]
    differences = [d for d in pairs if d]
    holm = multipletests([d["p_value"] for d in differences], method="holm")[1] if differences else []
    for d, p in zip(differences, holm, strict=True):
        d["p_holm"] = float(p)
    runs = ab.rows[["arm", "seed"]].drop_duplicates()
    notes = list(ab.notes)
    if any(d["seeds"] < 2 for d in differences):
        notes.append("one seed in common: seed variance not estimable, intervals and tests cover problems only")
    return {
        "ablation": str(ab.path),
        "preset": ab.preset,
        "arms": [{"name": a, "information": i} for a, i in ab.arms.items()],
        "seeds": ab.seeds,
        "finished_runs": len(runs),
        "skipped": ab.skipped,
        "notes": notes,
        "accuracy": accuracy,
        "differences": differences,
        "categories": _categories(ab),
        "curves": _curves(ab),
    }
