"""Training reports: learning curves, coach-score distributions, coach bias, behaviour, and run comparisons.

    mappa report run RUN_DIR [RUN_DIR ...] [--label NAME ...] [--out DIR]

Reads each run's ``metrics.jsonl``, ``rollouts/iter-*.jsonl`` and ``eval.json`` (``mappa train``), and any
``mappa eval`` result given with ``--eval``, and writes ``report.md`` with PNG figures beside it and
``report.html`` (the same, self-contained: figures embedded). With several runs (for example REINFORCE++ with the
coach, outcome-only and GRPO on the same seeds) every figure overlays them: the process-versus-outcome ablation.

Figures: ``curves.png`` (per iteration: team accuracy or DSBench success, and per role the mean coach score,
tool-call rate, tool success rate, response length, KL), ``coach_scores.png`` (distribution of coach scores per
role, first versus last iteration), ``coach_bias.png`` (mean coach score by task type and by outcome, 95%
intervals).

With held-out evaluations before and after training (``mappa train``'s ``eval.json``), the report opens with the
comparison: per run the accuracy before and after with 95% Wilson intervals, the exact McNemar test of its own
change, the training time; between every two runs evaluated on the same episodes, the exact McNemar test of their
after-training outcomes; per role the behaviour figures before and after.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa_envs.coach.bias import bias_report, format_report
from mappa_envs.core import EpisodeRecord, read_jsonl
from mappa_envs.metrics import paired_test, wilson_interval

ROLE_METRICS = (
    ("mean_coach_score", "mean reward x 10 (the coach's score; outcome-only: the outcome)"),
    ("tool_call_rate", "tool-call rate"),
    ("tool_success_rate", "tool success rate"),
    ("response_chars", "response length (chars)"),
    ("kl", "KL to the reference"),
)


class Run:
    """One training run's logs."""

    def __init__(self, path: str | Path, label: str | None = None):
        self.path = Path(path)
        if not (self.path / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{self.path} has no metrics.jsonl: not a `mappa train` output folder")
        self.label = label or self.path.name
        self.metrics = [json.loads(x) for x in (self.path / "metrics.jsonl").read_text().splitlines() if x.strip()]
        self.rollouts: dict[int, list[EpisodeRecord]] = {}
        for f in sorted((self.path / "rollouts").glob("iter-*.jsonl")):
            self.rollouts[int(f.stem.split("-")[1])] = list(read_jsonl(f))
        self.eval = json.loads((self.path / "eval.json").read_text()) if (self.path / "eval.json").exists() else {}
        cfg = self.path / "config.json"
        self.config = json.loads(cfg.read_text()) if cfg.exists() else {}

    @property
    def roles(self) -> list[str]:
        roles: list[str] = []
        for m in self.metrics:
            roles += [k for k, v in m.items() if isinstance(v, dict) and k not in roles]
        return roles

    def records(self) -> list[EpisodeRecord]:
        return [r for it in sorted(self.rollouts) for r in self.rollouts[it]]


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
            ev = a.info.get("coach")
            if ev is not None:
                out[a.role].append(float(ev["score"]))
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


def _final_table(runs: Sequence[Run]) -> list[str]:
    lines = [
        "| run | iterations | accuracy (last) | role | coach score | tool calls | tool ok | chars |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        if not run.metrics:
            continue
        last = run.metrics[-1]
        for role in run.roles:
            m = last.get(role, {})
            lines.append(
                f"| {run.label} | {len(run.metrics)} | {last.get('accuracy', 0):.1%} | {role} | "
                f"{m.get('mean_coach_score', 0):.2f} | {m.get('tool_call_rate', 0):.1%} | "
                f"{m.get('tool_success_rate', 0):.1%} | {m.get('response_chars', 0):.0f} |"
            )
    return lines


FAULT_KEYS = (
    "coach_evaluations",
    "coach_calls",
    "coach_retries",
    "coach_reprompts",
    "coach_lenient",
    "coach_ambiguous",
    "coach_fallbacks",
    "masked_fallbacks",
    "truncated_responses",
    "masked_truncated",
    "masked_empty",
    "masked_actions",
    "retokenized_responses",
    "grpo_singletons",
)


def _faults_table(runs: Sequence[Run]) -> list[str]:
    """Per run and role, summed over the iterations: what the coach did (calls, retries, re-prompts, lenient
    parses, fallbacks) and which actions the loss never saw (fallbacks, truncated responses)."""
    head = ["run", "role", *(k.replace("_", " ") for k in FAULT_KEYS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        for role in run.roles:
            rows = [m.get(role, {}) for m in run.metrics]
            if not any(k in r for r in rows for k in FAULT_KEYS):
                continue  # a run made before these counts were logged
            sums = [sum(int(r.get(k, 0)) for r in rows) for k in FAULT_KEYS]
            lines.append(f"| {run.label} | {role} | " + " | ".join(str(v) for v in sums) + " |")
    return lines if len(lines) > 2 else []


BEHAVIOUR = (
    ("boxed_rate", "boxed"),
    ("right_answer_rate", "right answer"),
    ("code_rate", "code"),
    ("tool_success_rate", "tool ok"),
    ("right_number_rate", "right number"),
)


def _acc(e: dict[str, Any]) -> str:
    lo, hi = wilson_interval(e["correct"], e["episodes"])
    return f"{e['accuracy']:.1%} [{lo:.1%}, {hi:.1%}] ({e['correct']}/{e['episodes']})"


def _paired(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    if "outcomes" not in before or "outcomes" not in after or before.get("task_ids") != after.get("task_ids"):
        return None
    return paired_test(before["task_ids"], before["outcomes"], after["outcomes"])


def comparison_tables(runs: Sequence[Run]) -> list[str]:
    """Markdown tables of the runs' held-out evaluations (``eval.json`` with ``before`` and ``after``): each run's
    change with its exact paired test, every pair of runs' after-training outcomes tested against each other, and
    the per-role behaviour before and after. Empty when no run has both evaluations."""
    done = [r for r in runs if "before" in r.eval and "after" in r.eval]
    if not done:
        return []
    lines = [
        "| run | estimator | coach | held-out | before | after | gained / lost | p (two-sided) | p (gain) | "
        "training time | evaluation time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in done:
        b, a = r.eval["before"], r.eval["after"]
        t = _paired(b, a)
        test = f"{t['gained']} / {t['lost']} | {t['p_value']:.3g} | {t['p_value_gain']:.3g}" if t else "- | - | -"
        train_s = sum(float(m.get("iteration_s", 0.0)) for m in r.metrics)
        eval_s = [e.get("seconds") for e in (b, a)]
        evals = " + ".join(f"{x:.0f} s" for x in eval_s) if all(x is not None for x in eval_s) else "-"
        lines.append(
            f"| {r.label} | {r.config.get('estimator')} | {r.config.get('coach')} | {a.get('split')} | {_acc(b)} | "
            f"{_acc(a)} | {test} | {train_s:.0f} s ({len(r.metrics)} iterations) | {evals} |"
        )
    pairs = [(x, y) for i, x in enumerate(done) for y in done[i + 1 :]]
    rows = []
    for x, y in pairs:
        t = _paired(y.eval["after"], x.eval["after"])  # "after" = x: x alone right counts as gained
        if t is not None:
            rows.append(
                f"| {x.label} vs {y.label} | {t['gained']} | {t['lost']} | {t['p_value']:.3g} | "
                f"{t['pairs']} {t['unit']}s |"
            )
    if rows:
        lines += [
            "",
            "After training, run against run on the same held-out episodes (exact McNemar on episodes; with k "
            "samples per problem, the exact sign test on the problems' means):",
            "",
            "| runs (A vs B) | A better | B better | p (two-sided) | pairs |",
            "|---|---|---|---|---|",
            *rows,
        ]
    beh = []
    for r in done:
        b, a = r.eval["before"].get("behaviour") or {}, r.eval["after"].get("behaviour") or {}
        for role in a:
            cells = [f"{b.get(role, {}).get(k, 0):.0%} -> {a[role].get(k, 0):.0%}" for k, _ in BEHAVIOUR]
            beh.append(f"| {r.label} | {role} | " + " | ".join(cells) + " |")
    if beh:
        lines += [
            "",
            "Per-role behaviour on the held-out episodes, before -> after (share of the role's actions; right "
            "number: episodes where its code printed the answer):",
            "",
            "| run | role | " + " | ".join(label for _, label in BEHAVIOUR) + " |",
            "|---|---|" + "---|" * len(BEHAVIOUR),
            *beh,
        ]
    return lines


def _eval_lines(name: str, result: dict[str, Any]) -> list[str]:
    lines = []
    if "suites" in result:  # mappa eval
        lines += [
            f"**{name}** (`mappa eval`)",
            "",
            "| suite | episodes | accuracy / success | 95% CI | mean quality |",
            "|---|---|---|---|---|",
        ]
        for suite, s in result["suites"].items():
            score = s.get("accuracy", s.get("success_rate", 0.0))
            quality = f"{s['mean_quality']:.3f}" if "mean_quality" in s else "-"
            lines.append(
                f"| {suite} | {s['episodes']} | {score:.1%} | [{s['ci95'][0]:.1%}, {s['ci95'][1]:.1%}] | {quality} |"
            )
        return [*lines, ""]
    for when in ("before", "after"):  # mappa train's held-out evaluations
        if when in result:
            e = result[when]
            lines.append(
                f"- {name}, held-out {e.get('split')} {when}: accuracy {e.get('accuracy', 0):.1%} "
                f"({e.get('correct')}/{e.get('episodes')})"
            )
    return lines


def write_report(runs: Sequence[Run], out: str | Path, evals: Sequence[str] = ()) -> Path:
    """Write ``report.md``, the PNG figures and ``report.html`` into ``out``; returns the Markdown path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = [("Learning curves and behaviour per role", plot_curves(runs, out / "curves.png"))]
    scores = plot_coach_scores(runs, out / "coach_scores.png")
    if scores:
        figures.append(("Coach-score distributions per role (first vs last iteration)", scores))
    bias_png, bias_text = plot_coach_bias(runs, out / "coach_bias.png")
    if bias_png:
        figures.append(("Coach bias by task type and outcome", bias_png))
    md = [f"# Training report: {', '.join(r.label for r in runs)}", ""]
    for run in runs:
        c = run.config
        md.append(
            f"- **{run.label}** (`{run.path}`): env {c.get('env_id')}, estimator {c.get('estimator')}, coach "
            f"{c.get('coach')}, model {c.get('model')}, seed {c.get('seed')}, {len(run.metrics)} iterations"
        )
    comparison = comparison_tables(runs)
    if comparison:
        md += ["", "## Held-out results before and after training", "", *comparison]
    md += ["", "## Last iteration", "", *_final_table(runs), ""]
    faults = _faults_table(runs)
    if faults:
        md += ["## Coach faults and masked actions (all iterations)", "", *faults, ""]
    ev_lines = []
    for run in runs:
        ev_lines += _eval_lines(run.label, run.eval)
    for path in evals:
        ev_lines += _eval_lines(Path(path).parent.name, json.loads(Path(path).read_text()))
    if ev_lines:
        md += ["## Evaluation", "", *ev_lines, ""]
    for title, png in figures:
        md += [f"## {title}", "", f"![{title}]({png.name})", ""]
    if bias_text:
        md += ["## Coach bias (tables)", "", "```", bias_text, "```", ""]
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text(_html(md, out))
    return out / "report.md"


def _html(md: list[str], out: Path) -> str:
    """A self-contained HTML rendering of the report's Markdown (tables, lists, code, embedded figures)."""
    body, in_code, table = [], False, []

    def flush_table() -> None:
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= {"-"}]
            cells = [[html.escape(c.strip()) for c in r.strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            rest = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in cells[1:])
            body.append(f"<table><tr>{head}</tr>{rest}</table>")
            table.clear()

    for line in md:
        if line.startswith("```"):
            flush_table()
            body.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
        elif in_code:
            body.append(html.escape(line))
        elif line.startswith("|"):
            table.append(line)
        else:
            flush_table()
            if line.startswith("!["):
                name = line[line.rindex("(") + 1 : -1]
                data = base64.b64encode((out / name).read_bytes()).decode()
                body.append(f'<img src="data:image/png;base64,{data}" style="max-width:100%">')
            elif line.startswith("#"):
                level = len(line) - len(line.lstrip("#"))
                body.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
            elif line.startswith("- "):
                body.append(f"<li>{html.escape(line[2:]).replace('**', '')}</li>")
            elif line:
                body.append(f"<p>{html.escape(line).replace('**', '')}</p>")
    flush_table()
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
    )
    head = f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
    return f"{head}<body>{''.join(body)}</body></html>"


__all__ = ["Run", "plot_coach_bias", "plot_coach_scores", "plot_curves", "write_report"]
