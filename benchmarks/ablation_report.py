"""The ablation report: :func:`benchmarks.ablation.summarize`'s figures as ``ablation.md`` (also printed),
``ablation.json`` (every number of the Markdown) and ``learning_curves.png`` (per arm, mean training accuracy per
iteration over seeds with its min-max band).

    mappa report ablation OUT [--out DIR]        (default DIR: OUT/report)

Tables: accuracy before and after training per split and arm, pooled over seeds and problems with 95% intervals;
the pairwise differences after training with Holm-corrected p-values and the per-seed differences; each seed
alone (exact McNemar, uncorrected); the minimum detectable difference at this and more seeds; before -> after per
problem category; the learning curves' first and last iterations. Every table names each arm's information label.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .ablation import PLANNED_SEEDS, load_ablation, summarize

# matplotlib is imported where a figure is drawn: it is optional (the report extra).

METHOD = (
    "Cells are (seed, problem) means. A mean (an arm's accuracy, or the paired difference A - B) has crossed random "
    "seed and problem effects: Var = v_seed/S + v_problem/P + v_residual/(S*P), from the balanced ANOVA (the REML "
    "estimates; a component at zero pooled into the residual), with a t test on Satterthwaite's df. Pairwise "
    "p-values are Holm-corrected over every row of every split. With 3 seeds the seed component rests on 2 df: "
    "seeds that disagree drive the df towards 2; seeds that agree leave the problems to decide. The minimum "
    "detectable difference is that of a seed-level paired t test (df = seeds - 1) with the fitted components' SD. "
    "With few discordant problems the t approximation is more liberal than an exact test: read the per-seed table."
)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _pts(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:+.1f} pts"


def _p(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3g}"


def _interval(e: dict[str, Any], fmt: Any) -> str:
    return f"{fmt(e['estimate'])} [{fmt(e['low'])}, {fmt(e['high'])}]"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return [*lines, *("| " + " | ".join(map(str, r)) + " |" for r in rows), ""]


def _accuracy_table(s: dict[str, Any]) -> list[str]:
    rows = []
    lenient = any("lenient" in a for a in s["accuracy"])
    for a in s["accuracy"]:
        counts = [a["after"]["seeds"], a["after"]["problems"]]
        figures = [_interval(a["before"], _pct), _interval(a["after"], _pct), _pts(a["change"])]
        if lenient:
            le = a.get("lenient")
            figures += [f"{_pct(le['before'])} -> {_pct(le['after'])} ({_pts(le['change'])})" if le else "-"]
        rows.append([a["split"], a["arm"], a["information"], *counts, *figures])
    head = ["split", "arm", "information", "seeds", "problems", "before", "after [95% interval]", "change"]
    head += ["lenient: before -> after (change)"] if lenient else []
    lines = ["## Accuracy, pooled over seeds and problems", ""]
    lines += ["95% intervals with both seed and problem variance (see Method).", ""]
    if lenient:
        lines += [
            "Lenient: the same episodes graded as if an unboxed final number also counted (the reward never "
            "does); strict minus lenient is what boxing alone accounts for.",
            "",
        ]
    return lines + _table(head, rows)


def _pair(d: dict[str, Any]) -> list[str]:
    return [d["split"], f"{d['a']} - {d['b']}", f"{d['information_a']} vs {d['information_b']}"]


def _difference_tables(s: dict[str, Any]) -> list[str]:
    """The pooled differences, then each seed alone."""
    pairs, seeds = [], []
    for d in s["differences"]:
        per_seed = ", ".join(_pts(x["difference"]) for x in d["per_seed"])
        test = [f"{d['df']:.1f}", _p(d["p_value"]), _p(d["p_holm"])]
        pairs.append([*_pair(d), _interval(d, _pts), *test, per_seed])
        for x in d["per_seed"]:
            seeds.append([*_pair(d), x["seed"], _pts(x["difference"]), x["a_better"], x["b_better"], _p(x["p_value"])])
    head = ["split", "A - B", "information", "difference [95% interval]", "df", "p", "p (Holm)", "per seed"]
    lines = ["## Pairwise differences after training", ""]
    lines += ["Paired by seed and problem; p-values Holm-corrected over every row.", "", *_table(head, pairs)]
    lines += ["## Each seed alone (exact McNemar, uncorrected: for reading, not for decisions)", ""]
    return lines + _table(["split", "A - B", "information", "seed", "difference", "A better", "B better", "p"], seeds)


def _power_table(s: dict[str, Any]) -> list[str]:
    rows = []
    for d in s["differences"]:
        mdd = d["power"]["mdd"]
        now = f"{_pts(mdd[str(d['seeds'])]).lstrip('+')} ({d['seeds']})"
        planned = [_pts(mdd[str(n)]).lstrip("+") for n in PLANNED_SEEDS]
        rows.append([*_pair(d), _pts(d["power"]["sd_per_seed"]).lstrip("+"), now, *planned])
    head = ["split", "A - B", "information", "SD per seed", "at its seeds (n)", *(f"{n} seeds" for n in PLANNED_SEEDS)]
    lines = ["## Minimum detectable difference (alpha 0.05, power 0.8, seed-level paired t test)", ""]
    return lines + _table(head, rows)


def _category_table(s: dict[str, Any]) -> list[str]:
    def count(k: int, n: int) -> str:
        return f"{k}/{n} ({_pct(k / n)})"

    keys = ("split", "arm", "information", "category", "seeds")
    rows = [
        [c[k] for k in keys] + [count(c["before"], c["episodes"]), count(c["after"], c["episodes"])]
        for c in s["categories"]
    ]
    lines = ["## By category (correct / episodes, pooled over seeds)", ""]
    return lines + _table([*keys, "before", "after"], rows)


def _curve_table(s: dict[str, Any]) -> list[str]:
    rows = []
    for arm in dict.fromkeys(c["arm"] for c in s["curves"]):
        its = [c for c in s["curves"] if c["arm"] == arm]
        first, last = its[0], its[-1]
        band = f"{_pct(last['mean'])} ({_pct(last['min'])}-{_pct(last['max'])})"
        rows.append([arm, first["information"], last["seeds"], len(its), _pct(first["mean"]), band])
    head = ["arm", "information", "seeds", "iterations", "first iteration", "last iteration (min-max)"]
    lines = ["## Learning curves (training accuracy, mean over seeds)", "", *_table(head, rows)]
    return lines + ([f"![learning curves]({s['figure']})", ""] if s.get("figure") else [])


def format_markdown(s: dict[str, Any]) -> str:
    """The report as Markdown, from :func:`benchmarks.ablation.summarize`'s figures."""
    lines = [f"# Ablation: {s['ablation']}", ""]
    runs = f"{s['finished_runs']} runs finished, {len(s['skipped'])} skipped"
    lines += [f"{len(s['arms'])} arms x {len(s['seeds'])} seeds (preset {s['preset']}): {runs}.", ""]
    if s["skipped"] or s["notes"]:
        lines += [*(f"- skipped {x}" for x in s["skipped"]), *(f"- note: {x}" for x in s["notes"]), ""]
    lines += [*_accuracy_table(s), *_difference_tables(s), *_power_table(s), *_category_table(s), *_curve_table(s)]
    return "\n".join([*lines, "## Method", "", METHOD])


def plot_learning_curves(s: dict[str, Any], path: Path) -> Path | None:
    """Per arm, mean training accuracy per iteration over seeds with its min-max band; None without curves or
    without matplotlib (a printed note)."""
    if not s["curves"]:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("matplotlib is not installed (pip install 'mappa-envs[report]'): no learning-curve figure")
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, arm in enumerate(dict.fromkeys(c["arm"] for c in s["curves"])):
        its = [c for c in s["curves"] if c["arm"] == arm]
        x = [c["iteration"] for c in its]
        label = f"{arm} ({its[0]['information']}, {max(c['seeds'] for c in its)} seeds)"
        ax.plot(x, [c["mean"] for c in its], marker="o", color=f"C{i}", label=label)
        ax.fill_between(x, [c["min"] for c in its], [c["max"] for c in its], color=f"C{i}", alpha=0.2)
    ax.set(xlabel="iteration", ylabel="training accuracy", title="mean over seeds (band: min-max)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _plain(x: Any) -> Any:
    """JSON-safe: NaN and infinities (a df with no spread, an SD of one seed) as null."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_report(path: str | Path, out: str | Path) -> tuple[str, dict[str, Any]]:
    """``out/ablation.md``, ``out/ablation.json`` and ``out/learning_curves.png`` of the ablation folder
    ``path``; returns the Markdown and its figures."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(load_ablation(path))
    figure = plot_learning_curves(summary, out / "learning_curves.png")
    summary["figure"] = figure.name if figure else None
    md = format_markdown(summary)
    (out / "ablation.md").write_text(md + "\n")
    (out / "ablation.json").write_text(json.dumps(_plain(summary), indent=2) + "\n")
    return md, summary
