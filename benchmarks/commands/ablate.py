"""``mappa ablate``: REINFORCE++ with the coach, outcome-only REINFORCE++ and GRPO (or the estimators named by
``--estimators``, plug-ins included) on one preset, seed and budget (each arm a ``mappa train`` process, checked
before the first starts), then the comparison report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import train
from .report import cmd_report_run
from .train import train_config


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("ablate", help="coach vs outcome-only vs GRPO on the same seeds and budget, then a report")
    p.add_argument("--preset", default="smoke")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--samples-per-prompt", type=int, default=None, help="for every arm (GRPO needs 2 or more)")
    p.add_argument("--prompts-per-iteration", type=int, default=None, help="for every arm")
    p.add_argument(
        "--estimators",
        default="coach,outcome,grpo",
        help="the arms, comma-separated: coach (REINFORCE++ with the coach), outcome (outcome-only, no coach), grpo, "
        "or any registered estimator (built-in or plug-in, trained with the preset's coach); default %(default)s",
    )
    p.add_argument("--trainer", default=None, choices=("ray", "local"), help="for every arm (default: the preset's)")
    p.add_argument("--out", default=None, help="default runs/ablation-<preset>")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--verbose", action="store_true", help="passed to every arm's `mappa train`")
    p.set_defaults(func=cmd_ablate)
    return p


def _train_parser() -> argparse.ArgumentParser:
    """A parser of ``mappa train``'s arguments (an arm's command line)."""
    parser = argparse.ArgumentParser(prog="mappa")
    train.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


ABLATION = (
    ("coach", {"estimator": "reinforce_pp"}),
    ("outcome", {"estimator": "outcome", "coach": "none"}),
    ("grpo", {"estimator": "grpo"}),
)
"""The default arms; ``--estimators`` picks others by these names or by a registered estimator's name."""


def ablation_arms(names: str) -> list[tuple[str, dict[str, str]]]:
    """``--estimators coach,outcome,rloo`` as arms: the named default arms, any other name an estimator trained
    with the preset's coach (an unknown one is refused by the arms' checks, with the registered names)."""
    defaults = dict(ABLATION)
    arms = [(n, defaults.get(n, {"estimator": n})) for n in (x.strip() for x in names.split(",")) if n]
    if len({n for n, _ in arms}) != len(arms) or not arms:
        raise SystemExit(f"mappa ablate: --estimators takes distinct names, not {names!r}")
    return arms


def _wait_for_memory_release(timeout_s: float = 120.0, settle_mb: float = 64.0) -> None:
    """Wait until the host's available memory stops rising (at most ``timeout_s``): the previous arm's Ray workers
    and engines take seconds to exit after its driver does, and the next arm's memory check would count them."""

    def available_mb() -> float | None:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    last = available_mb()
    if last is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = available_mb() or last
        if now - last < settle_mb:
            return
        last = now


def _share_before_evaluation(first: Path, others: list[Path]) -> None:
    """Give every later arm the first arm's before-training evaluation: the arms start from the same weights and
    differ only in the estimator and the coach, which the held-out evaluation does not use, so it is the same
    evaluation (and the arms' changes are then measured from the very same episodes). Arms that already hold an
    evaluation keep theirs."""
    path = first / "eval.json"
    if not path.exists():
        return
    done = json.loads(path.read_text())
    before: dict[str, Any] = {k: done[k] for k in ("before",) if k in done}
    splits = {s: {"before": e["before"]} for s, e in (done.get("splits") or {}).items() if "before" in e}
    if splits:
        before["splits"] = splits
    if not before:
        return
    for other in others:
        if not (other / "eval.json").exists():
            other.mkdir(parents=True, exist_ok=True)
            (other / "eval.json").write_text(json.dumps({**before, "shared_from": str(first)}, indent=2))
            print(f"[ablation] {other.name} re-uses {first.name}'s before-training evaluation", flush=True)


def cmd_ablate(args: argparse.Namespace) -> int:
    """REINFORCE++ with the coach, outcome-only REINFORCE++ and GRPO on the same preset, seed and budget, then the
    comparison report."""
    import subprocess

    from baselines.checks import check_config, failed

    out = Path(args.out or f"runs/ablation-{args.preset}")
    chosen = ablation_arms(args.estimators)
    arms = []
    for name, change in chosen:
        argv = ["train", "--preset", args.preset, "--out", str(out / name), "--seed", str(args.seed)]
        argv += ["--estimator", change["estimator"], *(["--coach", change["coach"]] if "coach" in change else [])]
        for flag, value in (
            ("--iterations", args.iterations),
            ("--samples-per-prompt", args.samples_per_prompt),
            ("--prompts-per-iteration", args.prompts_per_iteration),
            ("--trainer", args.trainer),
        ):
            if value is not None:
                argv += [flag, str(value)]
        argv += ["--no-progress", *(["--no-resume"] if args.no_resume else [])]
        argv += ["--verbose"] if args.verbose else []
        arms.append((name, argv))
    # every arm's configuration is checked before the first one starts (the GRPO arm of a preset with one sample
    # per prompt would otherwise fail after two full runs)
    refused = []
    for name, argv in arms:
        for c in failed(check_config(train_config(_train_parser().parse_args(argv)))):
            refused.append(f"- {name}: {c.name}: {c.detail.splitlines()[0]}")
    if refused:
        print("[ablation] refused before any run:\n" + "\n".join(refused), file=sys.stderr)
        if any("samples_per_prompt" in line for line in refused):
            print("[ablation] every arm runs the same budget: pass --samples-per-prompt 2", file=sys.stderr)
        return 1
    runs = []
    for i, (name, argv) in enumerate(arms):
        cmd = [sys.executable, "-m", "benchmarks.cli", *argv]
        if i:
            _wait_for_memory_release()
        print(f"[ablation] {name}: {' '.join(argv)}", flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            print(f"[ablation] {name} failed with exit status {rc}", file=sys.stderr)
            return rc
        runs.append(str(out / name))
        if i == 0 and not args.no_resume:
            _share_before_evaluation(out / name, [out / n for n, _ in arms[1:]])
    return cmd_report_run(argparse.Namespace(runs=runs, label=[n for n, _ in chosen], out=str(out / "report"), eval=[]))
