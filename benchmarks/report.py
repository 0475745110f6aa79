"""Training reports: learning curves, coach-score distributions, coach bias, behaviour, and run comparisons.

    mappa report run RUN_DIR [RUN_DIR ...] [--label NAME ...] [--out DIR]

Reads each run's ``metrics.jsonl``, ``rollouts/iter-*.jsonl`` and ``eval.json`` (``mappa train``), and any
``mappa eval`` result given with ``--eval``, and writes ``report.md`` with PNG figures beside it and
``report.html`` (the same, self-contained: figures embedded). With several runs (for example REINFORCE++ with the
coach, outcome-only and GRPO on the same seeds) every figure overlays them: the process-versus-outcome ablation.

Figures: ``curves.png`` (per iteration: team accuracy or DSBench success, and per role the mean coach score,
tool-call rate, tool success rate, response length, KL), ``coach_scores.png`` (distribution of coach scores per
role, first versus last iteration), ``coach_bias.png`` (mean coach score by task type and by outcome, 95%
intervals), ``calibration.png`` (the reliability diagram per role: the success rate of the episodes whose actions
scored in each bucket; its tables give the AUROC of the score for success per role and task type, and the gaps
between groups with p-values).

With held-out evaluations before and after training (``mappa train``'s ``eval.json``), the report opens with the
comparison: per run the accuracy before and after with 95% Wilson intervals, the exact McNemar test of its own
change, the training time; between every two runs evaluated on the same episodes, the exact McNemar test of their
after-training outcomes; per role the behaviour figures before and after.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mappa_envs.metrics import BEHAVIOUR_LABELS, paired_change, wilson_interval

from .report_plots import plot_calibration, plot_coach_bias, plot_coach_scores, plot_curves
from .run_data import Run


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
    "coach_directed_text",
    "coach_score_echoed",
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


def _acc(e: dict[str, Any]) -> str:
    lo, hi = wilson_interval(e["correct"], e["episodes"])
    return f"{e['accuracy']:.1%} [{lo:.1%}, {hi:.1%}] ({e['correct']}/{e['episodes']})"


def comparison_tables(runs: Sequence[Run]) -> list[str]:
    """Markdown tables of the runs' held-out evaluations (``eval.json`` with ``before`` and ``after``): each run's
    change with its exact paired test, every pair of runs' after-training outcomes tested against each other, and
    the per-role behaviour before and after. Empty when no run has both evaluations."""
    done = [r for r in runs if "before" in r.eval and "after" in r.eval]
    if not done:
        return []
    lines = [
        "| run | estimator | coach | reward sees | held-out | before | after | gained / lost | p (two-sided) | "
        "p (gain) | training time | evaluation time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in done:
        b, a = r.eval["before"], r.eval["after"]
        t = paired_change(b, a)
        test = f"{t['gained']} / {t['lost']} | {t['p_value']:.3g} | {t['p_value_gain']:.3g}" if t else "- | - | -"
        train_s = sum(float(m.get("iteration_s", 0.0)) for m in r.metrics)
        eval_s = [e.get("seconds") for e in (b, a)]
        evals = " + ".join(f"{x:.0f} s" for x in eval_s) if all(x is not None for x in eval_s) else "-"
        lines.append(
            f"| {r.label} | {r.config.get('estimator')} | {r.config.get('coach')} | "
            f"{r.config.get('reward_information', 'undeclared')} | {a.get('split')} | {_acc(b)} | "
            f"{_acc(a)} | {test} | {train_s:.0f} s ({len(r.metrics)} iterations) | {evals} |"
        )
    pairs = [(x, y) for i, x in enumerate(done) for y in done[i + 1 :]]
    rows = []
    for x, y in pairs:
        t = paired_change(y.eval["after"], x.eval["after"])  # "after" = x: x alone right counts as gained
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
            cells = [f"{b.get(role, {}).get(k, 0):.0%} -> {a[role].get(k, 0):.0%}" for k, _ in BEHAVIOUR_LABELS]
            beh.append(f"| {r.label} | {role} | " + " | ".join(cells) + " |")
    if beh:
        lines += [
            "",
            "Per-role behaviour on the held-out episodes, before -> after (share of the role's actions; right "
            "number: episodes where its code printed the answer):",
            "",
            "| run | role | " + " | ".join(label for _, label in BEHAVIOUR_LABELS) + " |",
            "|---|---|" + "---|" * len(BEHAVIOUR_LABELS),
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
    calib_png, calib_text = plot_calibration(runs, out / "calibration.png")
    if calib_png:
        figures.append(("Coach calibration: score bucket vs episode success", calib_png))
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
    if calib_text:
        md += ["## Coach calibration (tables)", "", calib_text, ""]
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
