"""The report's figures: learning curves, coach-score distributions per role, coach bias by task type and outcome."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from mappa_envs.coach.bias import bias_report, format_report
from mappa_envs.coach.calibration import BUCKETS, calibration, format_calibration
from mappa_envs.core import EpisodeRecord

from .run_data import ROLE_METRICS, Run

# matplotlib is imported where a figure is drawn: it is optional (the report extra).


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(runs: Sequence[Run], path: Path) -> Path:
    plt = _plt()
    panels = [("team", "accuracy / success"), *ROLE_METRICS]
    if any("mean_quality" in m for r in runs for m in r.metrics):
        panels.insert(1, ("mean_quality", "DSBench mean quality"))
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    from matplotlib.ticker import MaxNLocator

    for ax, (key, title) in zip(axes.ravel(), panels, strict=False):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for i, run in enumerate(runs):
            its = [m["iteration"] for m in run.metrics]
            if key in ("team", "mean_quality"):
                name = "accuracy" if key == "team" else "mean_quality"
                ax.plot(its, [m.get(name, 0.0) for m in run.metrics], styles[i % 4], marker="o", label=run.label)
                continue
            for j, role in enumerate(run.roles):
                ys = [m.get(role, {}).get(key) for m in run.metrics]
                if all(y is None for y in ys):
                    continue
                ax.plot(
                    its,
                    [float("nan") if y is None else y for y in ys],
                    styles[i % 4],
                    color=f"C{j}",
                    marker="o",
                    label=f"{run.label}: {role}" if len(runs) > 1 else role,
                )
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _scores_by_role(records: Sequence[EpisodeRecord]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for r in records:
        for a in r.actions:
            if a.coach is not None:
                out[a.role].append(float(a.coach.score))
    return out


def plot_coach_scores(runs: Sequence[Run], path: Path) -> Path | None:
    plt = _plt()
    series = []  # (run, role, first, last)
    for run in runs:
        if not run.rollouts:
            continue
        first = _scores_by_role(run.rollouts[min(run.rollouts)])
        last = _scores_by_role(run.rollouts[max(run.rollouts)])
        series += [(run, role, first.get(role, []), last.get(role, [])) for role in run.roles]
    series = [s for s in series if s[2] or s[3]]
    if not series:
        return None
    cols = min(3, len(series))
    rows = (len(series) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.ravel()[len(series) :]:
        ax.axis("off")
    bins = [x - 0.5 for x in range(12)]
    for ax, (run, role, first, last) in zip(axes.ravel(), series, strict=False):
        ax.hist([first, last], bins=bins, label=["first iteration", "last iteration"], color=["C7", "C0"])
        ax.set_title(f"{run.label}: {role}" if len(runs) > 1 else role, fontsize=9)
        ax.set_xlabel("coach score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_coach_bias(runs: Sequence[Run], path: Path) -> tuple[Path | None, str]:
    plt = _plt()
    texts, bars = [], []
    for run in runs:
        groups, gaps = bias_report(run.records())
        if not groups:
            continue
        texts.append(f"{run.label}\n{format_report(groups, gaps)}")
        bars += [(run.label, g) for g in groups if g.dimension in ("task_type", "outcome")]
    if not bars:
        return None, ""
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(bars)), 3.6))
    names = [
        f"{label}\n{g.dimension}={g.group}" if len(runs) > 1 else f"{g.dimension}=\n{g.group}" for label, g in bars
    ]
    means = [g.mean for _, g in bars]
    errs = [0.0 if g.n < 2 else g.mean - g.ci95[0] for _, g in bars]
    ax.bar(
        range(len(bars)),
        means,
        yerr=errs,
        capsize=3,
        color=["C1" if g.dimension == "outcome" else "C2" for _, g in bars],
    )
    ax.set_xticks(range(len(bars)), names, fontsize=7)
    ax.set_ylabel("mean coach score (95% CI)")
    ax.set_ylim(0, 10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path, "\n\n".join(texts)


def plot_calibration(runs: Sequence[Run], path: Path) -> tuple[Path | None, str]:
    """A reliability diagram per run (per role: the success rate of the episodes whose actions scored in each
    bucket, AUROC in the legend) and the calibration tables (AUROC per role and task type, gaps with p-values)."""
    tables = [(run, calibration(run.records())) for run in runs if run.rollouts]
    tables = [(run, t) for run, t in tables if t.get("role")]
    if not tables:
        return None, ""
    plt = _plt()
    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 3.6), squeeze=False)
    mids = [(lo + min(hi, 10)) / 2 for lo, hi in BUCKETS]
    for ax, (run, table) in zip(axes.ravel(), tables, strict=True):
        for j, (role, c) in enumerate(sorted(table["role"].items())):
            rows = c.reliability()
            ys = [rate if n else float("nan") for _, n, rate, _ in rows]
            ax.plot(mids, ys, marker="o", color=f"C{j}", label=f"{role} (AUROC {c.auroc:.2f})")
        ax.set_xlim(0, 10)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("coach score (bucket middle)")
        ax.set_ylabel("episode success rate")
        ax.set_title(f"{run.label}: reliability" if len(runs) > 1 else "reliability", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path, "\n\n".join(f"{run.label}\n{format_calibration(t)}" for run, t in tables)
