"""``mappa report``: a training report of runs (:mod:`benchmarks.report`), the pooled statistics of a multi-seed
ablation (:mod:`benchmarks.ablation_report`), the coach-bias report of trajectories (:mod:`mappa_envs.coach.bias`)
and the agreement of two coaches (:mod:`mappa_envs.coach.agreement`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from baselines.evaluation.protocol import format_leaderboard, leaderboard, load_result
from benchmarks.report import Run, _html, write_report
from mappa_envs.coach.agreement import agreement, format_agreement
from mappa_envs.coach.bias import bias_report, format_report, normalize_scores
from mappa_envs.coach.calibration import calibration, format_calibration
from mappa_envs.coach.rescore import episode_files
from mappa_envs.core import read_jsonl

# The ablation report (pandas, matplotlib) is imported where it is drawn: the other reports load neither.


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="reports over trajectories")
    rsub = p.add_subparsers(dest="report", required=True)
    r = rsub.add_parser("coach-bias", help="coach scores by role, task type and outcome, with flagged gaps")
    r.add_argument("trajectories", nargs="+", help="trajectory files (JSON lines)")
    r.add_argument("--min-gap", type=float, default=0.5, help="smallest gap (points) worth flagging")
    r.add_argument("--normalize", action="store_true", help="also show the effect of per-group normalisation")
    r.set_defaults(func=cmd_report_coach_bias)
    r = rsub.add_parser(
        "coach-agreement", help="two coaches' scores of the same actions (after mappa rescore), and their calibration"
    )
    r.add_argument("a", help="trajectories (a file or a mappa rescore folder) holding coach A's scores")
    r.add_argument("b", nargs="?", default=None, help="other trajectories holding coach B's (default: A's file)")
    r.add_argument("--key-a", default="coach", help="A's evaluation key in each action's info (default: coach)")
    r.add_argument("--key-b", default="rescored", help="B's evaluation key (default: rescored)")
    r.set_defaults(func=cmd_report_coach_agreement)
    r = rsub.add_parser("compare", help="the leaderboard of benchmark result files (mappa eval --protocol)")
    r.add_argument("results", nargs="+", help="result.json files of one protocol version and track")
    r.add_argument("--out", default=None, help="folder for leaderboard.md and leaderboard.html")
    r.set_defaults(func=cmd_report_compare)
    r = rsub.add_parser("run", help="a training report (Markdown + PNG, and HTML) of one or more runs")
    r.add_argument("runs", nargs="+", help="`mappa train` output folders (several: overlaid for comparison)")
    r.add_argument("--label", action="append", default=None, help="a name per run, in order")
    r.add_argument("--eval", action="append", default=None, help="a `mappa eval` eval.json to include")
    r.add_argument("--out", default=None, help="output folder (default: <first run>/report)")
    r.set_defaults(func=cmd_report_run)
    r = rsub.add_parser(
        "ablation", help="arms x seeds of `mappa ablate`: pooled accuracy, paired differences (Holm), curves"
    )
    r.add_argument("ablation", help="the ablation folder (ablation.json, <arm>/seed-<s>/ runs)")
    r.add_argument("--out", default=None, help="output folder (default: <ablation>/report)")
    r.set_defaults(func=cmd_report_ablation)
    return p


def cmd_report_coach_bias(args: argparse.Namespace) -> int:
    records = [rec for path in args.trajectories for rec in read_jsonl(path)]
    groups, gaps = bias_report(records, min_gap=args.min_gap)
    if not groups:
        print("no coach evaluations in these trajectories (run with a CoachRewardWrapper)")
        return 1
    print(format_report(groups, gaps))
    if args.normalize:
        normalize_scores(records)
        groups, gaps = bias_report(records, min_gap=args.min_gap, score_key="normalized_score")
        print("\nafter per-group normalisation (role x task type):")
        print(format_report(groups, gaps))
    return 0


def cmd_report_coach_agreement(args: argparse.Namespace) -> int:
    def records(source: str) -> list:
        path = Path(source)
        path = path / "trajectories.jsonl" if (path / "trajectories.jsonl").is_file() else path
        return [rec for f in episode_files(path) for rec in read_jsonl(f)]

    table = agreement(records(args.a), args.key_a, args.key_b, other=records(args.b) if args.b else None)
    if not table:
        print(f"no action holds both evaluations ({args.key_a!r} and {args.key_b!r})")
        return 1
    print(format_agreement(table, args.key_a, args.key_b))
    for key, recs in ((args.key_a, records(args.a)), (args.key_b, records(args.b or args.a))):
        print("\n" + format_calibration(calibration(recs, key), key))
    return 0


def cmd_report_compare(args: argparse.Namespace) -> int:
    try:
        board = leaderboard([load_result(p) for p in args.results])
    except ValueError as e:
        raise SystemExit(f"mappa report compare: {e}") from None
    text = format_leaderboard(board)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "leaderboard.md").write_text(text + "\n")
        (out / "leaderboard.html").write_text(_html(text.splitlines(), out))
        print(f"leaderboard: {out / 'leaderboard.md'} and {out / 'leaderboard.html'}")
    return 0


def cmd_report_run(args: argparse.Namespace) -> int:
    labels = list(args.label or [])
    if labels and len(labels) != len(args.runs):
        raise SystemExit(f"--label given {len(labels)} times for {len(args.runs)} runs")
    runs = [Run(path, labels[i] if labels else None) for i, path in enumerate(args.runs)]
    out = Path(args.out or Path(args.runs[0]) / "report")
    md = write_report(runs, out, evals=args.eval or [])
    print(f"report: {md} and {out / 'report.html'} (figures: {', '.join(p.name for p in sorted(out.glob('*.png')))})")
    return 0


def cmd_report_ablation(args: argparse.Namespace) -> int:
    if not (Path(args.ablation) / "ablation.json").is_file():
        raise SystemExit(f"mappa report ablation: no ablation.json in {args.ablation}")
    try:
        from benchmarks.ablation_report import write_report
    except ImportError as e:
        raise SystemExit(
            f"mappa report ablation needs the report extra (pip install 'mappa-envs[report]'): {e}"
        ) from None
    out = Path(args.out or Path(args.ablation) / "report")
    md, summary = write_report(args.ablation, out)
    print(md)
    print(f"\nreport: {out / 'ablation.md'}, {out / 'ablation.json'}")
    return 0 if summary["finished_runs"] else 1
