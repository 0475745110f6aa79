"""The scripted reference team on every DSBench-lite task, through the sandbox (Docker where an engine runs).

    python -m benchmarks.dsbench_reference [--sandbox auto|docker|bubblewrap|subprocess] [--split all]
                                           [--suite lite | --suite dsbench --data-dir PATH] [--json out.json]
                                           [--mode warm|fresh|both]

Prints one row per task: its type, metric, size, the reference team's score, the trivial baseline's score on
the same test rows, the normalised quality and the episode's wall time. ``--mode`` is how the sandbox runs blocks
(``warm``, the env's default: forked from a worker that imported the data libraries once; ``fresh``: a new
interpreter per block); ``both`` runs every task in each mode and prints the episode times side by side. Exits with
status 1 if any submission is invalid or fails to beat the baseline (the suite's solvability check).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import mappa_envs
from mappa_envs.tasks.dsbench.reference import run_reference
from mappa_envs.tasks.dsbench.scoring import answers


def _task_row(env: Any, tid: str, task: Any) -> dict[str, Any]:
    """Run the reference team on one task and print its line of the table."""
    t0 = time.perf_counter()
    o = run_reference(env, tid).outcome
    n = len(answers(task).ids)
    row = {
        "task": tid,
        "type": task.task_type,
        "metric": task.metric,
        "test_rows": n,
        "valid": o["valid"],
        "value": o["value"],
        "baseline": o["baseline"],
        "quality": o["quality"],
        "beats_baseline": o["beats_baseline"],
        "seconds": round(time.perf_counter() - t0, 2),
        "reason": o["reason"],
    }
    value = f"{o['value']:.4g}" if o["valid"] else "invalid"
    print(
        f"{tid:<22}{task.task_type:<15}{task.metric:<10}{n:>7}{value:>11}{o['baseline']:>11.4g}"
        f"{o['quality']:>9.3f}  {row['seconds']:>5.1f}" + (f"  {o['reason']}" if not o["valid"] else ""),
        flush=True,
    )
    return row


def _run_mode(args: argparse.Namespace, mode: str) -> tuple[list[dict[str, Any]], str]:
    """Every task of the split once, blocks run in ``mode``: the rows and the backend used."""
    env = mappa_envs.make(
        "mappa/DSBench-v0",
        suite=args.suite,
        split=args.split,
        data_dir=args.data_dir,
        task_ids=args.tasks,
        sandbox=args.sandbox,
        sandbox_kwargs={"mode": mode},
    )
    u = env.unwrapped
    print(f"DSBench reference team: suite {args.suite}, split {args.split}, sandbox {u.sandbox_backend}, {mode}")
    header = f"{'task':<22}{'type':<15}{'metric':<10}{'rows':>7}{'score':>11}{'baseline':>11}{'quality':>9}  {'s':>5}"
    print(header)
    print("-" * len(header))
    start = time.perf_counter()
    rows = [_task_row(env, tid, task) for tid, task in u.ds_tasks.items()]
    env.close()
    ok = sum(r["beats_baseline"] for r in rows)
    mean_q = sum(r["quality"] for r in rows) / len(rows)
    print("-" * len(header))
    print(
        f"{ok}/{len(rows)} tasks valid and above the trivial baseline; mean quality {mean_q:.3f}; "
        f"total {time.perf_counter() - start:.0f} s"
    )
    return rows, u.sandbox_backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sandbox", default="auto")
    p.add_argument("--suite", default="lite")
    p.add_argument("--split", default="all")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--tasks", nargs="*", default=None, help="task ids (default: all of the split)")
    p.add_argument("--mode", choices=("warm", "fresh", "both"), default="warm", help="how the sandbox runs blocks")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    modes = ("fresh", "warm") if args.mode == "both" else (args.mode,)
    runs = {mode: _run_mode(args, mode) for mode in modes}
    if len(runs) == 2:
        (fresh, _), (warm, _) = runs["fresh"], runs["warm"]
        f_s, w_s = sum(r["seconds"] for r in fresh), sum(r["seconds"] for r in warm)
        print(f"episode time, all tasks: fresh {f_s:.0f} s, warm {w_s:.0f} s ({f_s / w_s:.1f}x)")
    if args.json:
        out = {mode: {"sandbox": backend, "rows": rows} for mode, (rows, backend) in runs.items()}
        with open(args.json, "w") as f:
            json.dump({"suite": args.suite, "split": args.split, "modes": out}, f, indent=1)
    failed = sorted({r["task"] for rows, _ in runs.values() for r in rows if not r["beats_baseline"]})
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
