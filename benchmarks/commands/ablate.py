"""``mappa ablate``: REINFORCE++ with the coach, outcome-only REINFORCE++ and GRPO (or the arms named by
``--arms``, plug-ins included) on one preset and budget, for every seed of ``--seeds`` (each arm and seed a
``mappa train`` run, every one checked before the first starts; finished ones are skipped on a re-run), then the
reports: ``OUT/report/report.md`` (the runs side by side) and ``OUT/report/ablation.md`` (pooled over seeds and
problems, ``mappa report ablation``).

The runs of the Ray trainer share this process and one :class:`~baselines.training.pool.ActorPool`: the first run
starts the engines and ranks, every later one takes them and resets them (weights, optimiser, generators), so it
starts in seconds; ``--fresh-actors`` runs each as its own ``mappa train`` process instead.

Layout: ``OUT/ablation.json`` (arms with what each reward sees, seeds, commands), ``OUT/<arm>/seed-<s>/`` (a
``mappa train`` run folder), ``OUT/startup.json`` (each run's start-up, on a pool)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baselines.config import TrainConfig, config_record
from baselines.runs.store import drop_finished_checkpoints
from baselines.training.pool import ActorPool

from . import train
from .common import OldSpelling, add_ray_address
from .configuration import add_configuration_options, no_configuration
from .options import add_options, as_argv, given
from .report import cmd_report_run
from .train import train_config

# check_config is looked up when an arm is checked (a test replaces it); the sibling command modules are imported where
# they are used.

ARM_FIELDS = ("estimator", "coach", "seed", "out_dir", "resume", "progress", "keep_finished_checkpoints")
"""The fields each arm's command sets itself (its estimator and coach, ``--seeds``, its folder under ``--out``,
``--no-resume``, no progress bar); every other field of :class:`~baselines.config.TrainConfig` is an option of
``mappa ablate`` passed on to every arm."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("ablate", help="coach vs outcome-only vs GRPO on the same seeds and budget, then a report")
    add_configuration_options(p, "every arm's")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (every arm runs each); default 0")
    p.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds N)")
    p.add_argument(
        "--arms",
        default="coach,outcome,grpo",
        help="the arms, comma-separated: "
        + "; ".join(f"{name}: {ARM_HELP[name]}" for name, _ in ABLATION)
        + "; or any registered estimator (built-in or plug-in), trained with the preset's coach; default %(default)s",
    )
    p.add_argument("--estimators", dest="arms", action=OldSpelling, new="--arms", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="default runs/ablation-<preset>")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--verbose", action="store_true", help="passed to every arm's `mappa train`")
    p.add_argument(
        "--fresh-actors",
        action="store_true",
        help="run each arm and seed as its own `mappa train` process, starting its own Ray cluster, engines and "
        "ranks (by default the runs share one process and one set of warm actors, each reset for its run)",
    )
    add_ray_address(p)
    p.add_argument(
        "--keep-finished-checkpoints",
        action="store_true",
        help="keep each finished run's checkpoints/ (by default removed when the run has finished: its models/, "
        "metrics, episodes and evaluation stay; the bundled model's checkpoints take about 4.6 GB each)",
    )
    group = p.add_argument_group("every arm's training options (mappa train's; default: the preset's)")
    add_options(group, TrainConfig, exclude=ARM_FIELDS)
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
    ("rule", {"estimator": "reinforce_pp", "coach": "rule"}),
    ("hindsight", {"estimator": "reinforce_pp", "coach": "rule-hindsight-outcome"}),
    ("hindsight-key", {"estimator": "reinforce_pp", "coach": "rule-hindsight-key"}),
)
"""The named arms: ``coach`` (REINFORCE++ with the preset's coach), ``outcome`` (outcome-only REINFORCE++, no coach),
``grpo`` (with the preset's coach), ``rule`` (REINFORCE++ with the method's rule coach: the ground truth for the
final agent only), ``hindsight`` (the rule hindsight coach: blame moved by the outcome, no per-action answer key),
``hindsight-key`` (the answer-key hindsight coach: every printout checked against the ground truth). Any other name
of ``--arms`` is an estimator trained with the preset's coach. The default arms: the first three."""

ARM_HELP = {
    "coach": "REINFORCE++ with the preset's coach",
    "outcome": "outcome-only REINFORCE++, no coach",
    "grpo": "GRPO with the preset's coach",
    "rule": "REINFORCE++ with the rule coach (the ground truth for the final agent only)",
    "hindsight": "REINFORCE++ with the rule hindsight coach, blame moved by the outcome (rule-hindsight-outcome)",
    "hindsight-key": "REINFORCE++ with the answer-key hindsight coach (rule-hindsight-key)",
}
"""What each named arm of :data:`ABLATION` is: the ``--arms`` help."""


def ablation_arms(names: str) -> list[tuple[str, dict[str, str]]]:
    """``--arms coach,outcome,rloo`` as arms: the named default arms, any other name an estimator trained
    with the preset's coach (an unknown one is refused by the arms' checks, with the registered names)."""
    defaults = dict(ABLATION)
    arms = [(n, defaults.get(n, {"estimator": n})) for n in (x.strip() for x in names.split(",")) if n]
    if len({n for n, _ in arms}) != len(arms) or not arms:
        raise SystemExit(f"mappa ablate: --arms takes distinct names, not {names!r}")
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
    """Give every later run the first run's before-training evaluation: the arms and seeds start from the same
    weights and the evaluation (its own seed, no coach) does not depend on the estimator, the coach or the training
    seed, so it is the same evaluation (and every run's change is measured from the very same episodes). Runs that
    already hold an evaluation keep theirs."""
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
            print(f"[ablation] {other} re-uses {first}'s before-training evaluation", flush=True)


def _seeds(args: argparse.Namespace) -> list[int]:
    text = str(args.seed) if args.seed is not None else args.seeds
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"mappa ablate: --seeds takes comma-separated integers, not {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"mappa ablate: --seeds takes distinct integers, not {text!r}")
    return seeds


def _arm_argv(args: argparse.Namespace, change: dict[str, str], run: Path, seed: int) -> list[str]:
    """The ``mappa train`` command line of one arm and seed."""
    argv = ["train", *(["--preset", args.preset] if args.preset else [])]
    argv += [*(["--config", args.config] if args.config else []), "--out", str(run), "--seed", str(seed)]
    argv += ["--estimator", change["estimator"], *(["--coach", change["coach"]] if "coach" in change else [])]
    argv += as_argv(TrainConfig, given(args, TrainConfig, exclude=ARM_FIELDS, prog="mappa ablate"))
    argv += ["--no-progress", *(["--no-resume"] if args.no_resume else [])]
    argv += ["--keep-finished-checkpoints"] if args.keep_finished_checkpoints else []
    return argv + (["--verbose"] if args.verbose else [])


def _finished(run: Path) -> bool:
    """A run that trained every iteration it was configured for and, if it evaluates, evaluated after training."""
    try:
        cfg = json.loads((run / "config.json").read_text())
        rows = [ln for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        evals = json.loads((run / "eval.json").read_text()) if cfg.get("eval_episodes") else {"after": True}
    except (OSError, ValueError):
        return False
    return len(rows) >= int(cfg["iterations"]) and "after" in evals


@dataclass
class _Run:
    """One arm trained with one seed."""

    arm: str
    seed: int
    path: Path
    argv: list[str]
    information: str = ""
    """What its reward sees (:mod:`mappa_envs.coach.information`)."""
    trainer: str = "ray"
    """Its trainer: only a Ray run leaves workers and engines that take seconds to exit after it."""


def _plan(args: argparse.Namespace, out: Path) -> tuple[list[_Run], list[str]]:
    """Every (arm, seed) run, seed by seed (a stopped ablation has as many seeds of every arm), and the checks each
    failed (``- arm seed s: check: detail`` lines)."""
    from baselines.planning.checks import check_config, failed

    plan, refused = [], []
    for seed in _seeds(args):
        for name, change in ablation_arms(args.arms):
            run = _Run(name, seed, out / name / f"seed-{seed}", [])
            run.argv = _arm_argv(args, change, run.path, seed)
            cfg = train_config(_train_parser().parse_args(run.argv))
            problems = failed(check_config(cfg))
            refused += [f"- {name} seed {seed}: {c.name}: {c.detail.splitlines()[0]}" for c in problems]
            run.information = "" if problems else config_record(cfg)["reward_information"]
            run.trainer = cfg.trainer
            plan.append(run)
    return plan, refused


def _write_manifest(args: argparse.Namespace, out: Path, plan: list[_Run]) -> None:
    arms: dict[str, dict[str, Any]] = {}
    for run in plan:
        arms.setdefault(run.arm, {"name": run.arm, "information": run.information, "commands": {}})
        arms[run.arm]["commands"][str(run.seed)] = "mappa " + " ".join(run.argv)
    manifest = {
        "preset": args.preset,
        "config": args.config,
        "seeds": sorted({run.seed for run in plan}),
        "arms": list(arms.values()),
        "unseal_test": bool(args.unseal_test),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(manifest, indent=2))


def cmd_ablate(args: argparse.Namespace) -> int:
    """Every arm for every seed on the same preset and budget (finished runs skipped), then the reports."""
    if args.preset is None and args.config is None:
        return no_configuration("mappa ablate")
    out = Path(args.out or f"runs/ablation-{args.preset or Path(args.config).stem}")
    plan, refused = _plan(args, out)
    if refused:  # every run's configuration is checked before the first starts
        print("[ablation] refused before any run:\n" + "\n".join(refused), file=sys.stderr)
        if any("samples_per_prompt" in line for line in refused):
            print("[ablation] every arm runs the same budget: pass --samples-per-prompt 2", file=sys.stderr)
        return 1
    if not train.cluster_joinable("mappa ablate"):  # RAY_ADDRESS's cluster (--ray-address), before the first arm
        return 1
    _write_manifest(args, out, plan)
    pool = None if args.fresh_actors or any(r.trainer != "ray" for r in plan) else ActorPool()
    try:
        rc = _run_plan(args, plan, pool)
    finally:
        _close_pool(pool, out)
    if rc:
        return rc
    runs, labels = [str(r.path) for r in plan], [f"{r.arm}/seed-{r.seed}" for r in plan]
    rc = cmd_report_run(argparse.Namespace(runs=runs, label=labels, out=str(out / "report"), eval=[]))
    return rc or _report_ablation(out)


def _run_plan(args: argparse.Namespace, plan: list[_Run], pool: ActorPool | None) -> int:
    """Every run of the plan not finished already, in order: in this process on ``pool``'s actors, or (no pool) each
    as its own ``mappa train`` process. Returns the first failure's exit status, or 0."""
    previous: _Run | None = None  # the last run started here
    for i, run in enumerate(plan):
        if not args.no_resume and _finished(run.path):
            print(f"[ablation] {run.arm} seed {run.seed}: finished already ({run.path})", flush=True)
        else:
            if pool is None and previous is not None and previous.trainer == "ray":
                _wait_for_memory_release()
            previous = run
            print(f"[ablation] {run.arm} seed {run.seed} ({run.information}): mappa {' '.join(run.argv)}", flush=True)
            t0 = time.monotonic()
            rc = (
                _train_here(run, pool)
                if pool is not None
                else subprocess.call([sys.executable, "-m", "benchmarks.cli", *run.argv])
            )
            if rc != 0:
                print(f"[ablation] {run.arm} seed {run.seed} failed with exit status {rc}", file=sys.stderr)
                return rc
            start = f"start-up {pool.starts[-1].seconds:.0f}s, " if pool is not None and pool.starts else ""
            print(f"[ablation] {run.arm} seed {run.seed}: {start}{time.monotonic() - t0:.0f}s in all", flush=True)
        if not args.keep_finished_checkpoints:
            _drop_checkpoints(run.path)
        if i == 0 and not args.no_resume:
            _share_before_evaluation(run.path, [r.path for r in plan[1:]])
    return 0


def _train_here(run: _Run, pool: ActorPool) -> int:
    """One run's ``mappa train`` in this process, on the pool's actors; its exit status (a crash: its traceback, 1)."""
    try:
        return train.cmd_train(_train_parser().parse_args(run.argv), pool=pool)
    except SystemExit as e:  # the command's own refusals
        return e.code if isinstance(e.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1


def _close_pool(pool: ActorPool | None, out: Path) -> None:
    """Stop the pool's actors and this process's Ray; each run's start-up to the console and ``OUT/startup.json``."""
    if pool is None:
        return
    pool.close()
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if pool.starts:
        figures = ", ".join(
            f"{Path(s.out_dir).parent.name}/{Path(s.out_dir).name} {s.seconds:.0f}s" for s in pool.starts
        )
        print(f"[ablation] start-up per run: {figures}", flush=True)
        (out / "startup.json").write_text(json.dumps([dataclasses.asdict(s) for s in pool.starts], indent=1))


def _drop_checkpoints(run: Path) -> None:
    """Remove a finished run's checkpoints (:func:`baselines.runs.store.drop_finished_checkpoints`; its ``mappa train``
    has done so already unless it was stopped between training and the clean-up)."""
    if not _finished(run):
        return
    roles = sorted(p.name for p in (run / "models").iterdir() if p.is_dir()) if (run / "models").is_dir() else []
    drop_finished_checkpoints(run, roles, log=lambda line: print(f"[ablation] {run}: {line}", flush=True))


def _report_ablation(out: Path) -> int:
    """``mappa report ablation OUT`` (pooled over seeds and problems), where the runs evaluated held-out tasks."""
    if not any((Path(r) / "eval.json").exists() for r in out.glob("*/seed-*")):
        return 0
    from .report import cmd_report_ablation

    return cmd_report_ablation(argparse.Namespace(ablation=str(out), out=None))
