"""``mappa train``: its parser (generated from the configuration's fields: :mod:`.options`), the configuration,
the run (evaluate, train, evaluate, the paired change) and its console lines."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from baselines.config import SANDBOX_RECORD_VAR, TrainConfig, config_record
from baselines.evaluation.evaluate import test_name
from baselines.planning.gpu_plan import Hardware, plan_report
from baselines.planning.presets import HARDWARE, preset_lines
from baselines.ray_learner.ray_connect import RayConnectError, join
from baselines.runs.console import setup_run_logging
from baselines.runs.store import FinishedRun, check_resumable, drop_finished_checkpoints
from mappa_envs.metrics import BEHAVIOUR_LABELS, paired_change, wilson_interval

from .common import add_ray_address
from .configuration import add_configuration_options, announce_sandbox, base_config, no_configuration, source
from .options import add_options, given

# The trainers (torch, transformers, Ray) are imported inside the functions that use them: the CLI's other commands, and
# --help, load none of them; check_config and the GPU memory probe are looked up when called (tests replace them).


def add_parser(sub: Any, config: type | None = None) -> argparse.ArgumentParser:
    """``mappa train``'s parser: a flag for every field of the configuration (``config``, default
    :class:`~baselines.config.TrainConfig`; :mod:`.options`), besides ``--preset``, ``--dry-run`` and ``--verbose``."""
    p = sub.add_parser(
        "train",
        help="train every role with REINFORCE++ / GRPO / outcome-only",
        description="Train every role of a team. A preset (--preset) or a configuration file (--config) sets every "
        "field of the configuration; each option given replaces one (--dry-run shows them all). Another --env than "
        "the preset's drops the preset's --env-arg values and --eval-split.",
    )
    add_configuration_options(p, "the run's")
    p.add_argument("--list-presets", action="store_true", help="list the presets, one line each, and exit")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the configuration and the pre-flight checks (model on disk, tasks, memory estimate) and exit: "
        "0 if it can run here, 1 if not; starts nothing",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' logs (Ray, vLLM, DeepSpeed, transformers) on the console too; by default they go "
        "only to <out>/logs/",
    )
    add_ray_address(p)
    add_options(
        p.add_argument_group("training options (each sets one field; default: the preset's)"), config or TrainConfig
    )
    p.set_defaults(func=cmd_train)
    return p


def train_config(args: argparse.Namespace):
    """The ``TrainConfig`` of ``mappa train``'s arguments: the preset and the configuration file
    (:func:`base_config`), with each option given replacing its field (a repeatable ``KEY=VALUE`` option adding to
    the mapping)."""
    try:
        base = base_config(args.preset, getattr(args, "config", None))
    except ValueError as e:
        raise SystemExit(f"mappa train: --config: {e}") from None
    if args.env_id is not None and args.env_id != base.env_id:  # the preset's arguments and held-out split: its env's
        base = dataclasses.replace(base, env_kwargs={}, eval_split=None)
    return dataclasses.replace(base, **given(args, TrainConfig, base=base, prog="mappa train"))


def cmd_train(args: argparse.Namespace, pool=None) -> int:
    """``mappa train``; ``pool``: a :class:`~baselines.training.pool.ActorPool` the Ray trainer takes its actors from
    and gives them back to (``mappa ablate``'s runs in one process)."""
    if args.list_presets:
        print(preset_lines())
        return 0
    if args.preset is None and args.config is None:
        return no_configuration("mappa train")
    cfg = train_config(args)
    if args.dry_run:
        print(json.dumps(dataclasses.asdict(cfg)), flush=True)  # machine-readable, first line
        return _dry_run(cfg, args.preset, source(args))

    out = Path(cfg.out_dir)
    sandbox = announce_sandbox(cfg)
    print(f"configuration ({source(args)}):")
    print(_config_table(cfg))
    print(f"(saved to {out / 'config.json'} when training starts)")
    log_dir = setup_run_logging(out, args.verbose)
    if args.verbose:
        print(f"library logs: on this console (--verbose), and the driver's in {log_dir / 'driver.log'}", flush=True)
    else:
        print(f"library logs (Ray, vLLM, DeepSpeed, transformers): {log_dir}/ (--verbose shows them here)", flush=True)
    # the Ray trainer's actors write their output to files there (baselines.runs.console.redirect_actor_output)
    changes = {"MAPPA_ACTOR_LOG_DIR": None if args.verbose else str(log_dir.resolve())}
    if sandbox["chosen_by"] == "auto":  # the backend picked once for the whole run: its envs, in this process and
        # the actors, use it without asking again (and without a warning per env: it was said once, above)
        changes.update({"MAPPA_SANDBOX": sandbox["backend"], SANDBOX_RECORD_VAR: json.dumps(sandbox)})
    with _environment(changes):
        try:
            return _train(cfg, out, log_dir, pool)
        except Exception:
            if not args.verbose:
                print(f"mappa train: failed; the libraries' logs are in {log_dir}/", file=sys.stderr, flush=True)
            raise


@contextlib.contextmanager
def _environment(changes: dict[str, str | None]):
    """The environment variables ``changes`` set (None: unset) while the block runs, then restored as they were."""

    def put(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    before = {name: os.environ.get(name) for name in changes}
    try:
        put(changes)
        yield
    finally:
        put(before)


def _trainer(cfg, pool=None):
    if cfg.trainer == "ray":
        from baselines.training.ray_trainer import RayTrainer

        return RayTrainer(cfg, pool=pool)
    if cfg.trainer == "local":
        from baselines.training.local_trainer import LocalTrainer

        return LocalTrainer(cfg)
    raise ValueError(f"trainer must be 'ray' or 'local', not {cfg.trainer!r}")


def _fmt_eval(e: dict) -> str:
    """An evaluation's line: accuracy (DSBench: valid submissions) with its Wilson interval, a scored task's mean
    quality, and the code figures of the team's first role with tools (every role's are in :func:`_fmt_behaviour`)."""
    lo, hi = wilson_interval(e["correct"], e["episodes"])
    line = f"accuracy {e['accuracy']:.1%} [{lo:.0%}, {hi:.0%}] ({e['correct']}/{e['episodes']})"
    if "mean_quality" in e:
        line += f", mean quality {e['mean_quality']:.3f}"
    role = e.get("tool_role", "code_executor" if "code_executor" in (e.get("behaviour") or {}) else None)
    if role:  # an eval.json written before tool_role was recorded: MathChat's code executor
        line += f", {role.replace('_', '-')} code rate {e['code_rate']:.1%}, tool success {e['tool_success_rate']:.1%}"
    return line


def _fmt_behaviour(before: dict, after: dict) -> list[str]:
    """Per role, each behaviour figure that is not 0 before and after: ``before -> after``."""
    lines = []
    for role, b in (before.get("behaviour") or {}).items():
        a = (after.get("behaviour") or {}).get(role, {})
        parts = [
            f"{label} {b.get(key, 0):.0%} -> {a.get(key, 0):.0%}"
            for key, label in BEHAVIOUR_LABELS
            if b.get(key, 0) or a.get(key, 0)
        ]
        if parts:
            lines.append(f"  {role}: " + ", ".join(parts))
    return lines


def _fmt_categories(before: dict, after: dict) -> list[str]:
    """Per problem category (a MathChat arithmetic problem's operations), ``correct before -> after`` with the
    problems gained and lost: the lines under a held-out change (none for a split of one category)."""
    cats, b_out, a_out = before.get("categories"), before.get("outcomes"), after.get("outcomes")
    if not cats or after.get("categories") != cats or len(set(cats)) < 2 or len(b_out) != len(a_out):
        return []
    lines = ["  per category: correct before -> after (gained, lost)"]
    for cat in dict.fromkeys(cats):
        pairs = [(bool(b), bool(a)) for c, b, a in zip(cats, b_out, a_out, strict=True) if c == cat]
        gained, lost = sum(a and not b for b, a in pairs), sum(b and not a for b, a in pairs)
        n_b, n_a = sum(b for b, _ in pairs), sum(a for _, a in pairs)
        lines.append(f"    {cat:<9} {n_b:>3}/{len(pairs)} -> {n_a:>3}/{len(pairs)}  (+{gained}, -{lost})")
    return lines


def _fmt_paired(p: dict) -> str:
    return (
        f"accuracy {p['accuracy_before']:.1%} [{p['ci95_before'][0]:.0%}, {p['ci95_before'][1]:.0%}] -> "
        f"{p['accuracy_after']:.1%} [{p['ci95_after'][0]:.0%}, {p['ci95_after'][1]:.0%}]; paired ("
        f"{test_name(p)}, "
        f"{p['pairs']} {p.get('unit', 'episode')}s): {p['gained']} gained, {p['lost']} lost, "
        f"p = {p['p_value']:.3g} two-sided ({p['p_value_gain']:.3g} for a gain)"
    )


def _config_table(cfg) -> str:
    """The configuration's fields, two to a line."""
    names = [f.name for f in dataclasses.fields(cfg)]
    key = max(len(n) for n in names) + 2
    cells = [f"{n:<{key}}{json.dumps(getattr(cfg, n))}" for n in names]
    width = max(len(c) for c in cells) + 2
    if width > 60:
        return "\n".join(cells)
    return "\n".join("".join(c.ljust(width) for c in cells[i : i + 2]).rstrip() for i in range(0, len(cells), 2))


def _dry_run(cfg, preset_name: str | None, source: str) -> int:
    """``mappa train --dry-run``: the configuration and every pre-flight check; 0 if it can run here, else 1."""
    from baselines.planning.checks import check_config, failed, format_checks

    print(f"\nconfiguration ({source}):")
    print(_config_table(cfg))
    checks = check_config(cfg)
    print("\nchecks:")
    print(format_checks(checks))
    if cfg.trainer == "ray":
        _print_gpu_plan(cfg, preset_name)
    bad = failed(checks)
    if not bad:
        print("\ndry run: every check passed; this configuration can run here")
        return 0
    print(f"\ndry run: cannot run here ({len(bad)} failed check{'s' if len(bad) > 1 else ''}):")
    for c in bad:
        print(f"- {c.name}: {c.detail.splitlines()[0]}")
    return 1


def _print_gpu_plan(cfg, preset_name: str | None) -> None:
    """The GPU plan (:mod:`baselines.planning.gpu_plan`): on this machine's GPUs, or, on a machine without one, on the
    preset's declared hardware (:data:`baselines.planning.presets.HARDWARE`); nothing for a CPU preset on a CPU
    machine."""
    from baselines.planning.memory import _gpu_memory

    gpus = _gpu_memory()
    if gpus:
        hw, where = Hardware(1, len(gpus), min(gpus), source="this machine, nvidia-smi"), "on this machine's GPUs"
    elif preset_name is not None and preset_name in HARDWARE and cfg.device != "cpu":
        hw, where = HARDWARE[preset_name], "on the preset's declared hardware"
        print("\nthis machine has no GPU (no nvidia-smi): the checks above are for this machine's CPU; the run's")
        print("GPU plan below is for the preset's declared hardware")
    else:
        return
    print(f"\nGPU plan {where}:")
    print(plan_report(cfg, hw))


def _train(cfg, out: Path, log_dir: Path, pool=None) -> int:
    """``mappa train`` after the configuration is shown and the logs are set up: build, evaluate, train, evaluate."""
    t0 = time.monotonic()
    try:
        saved = check_resumable(cfg)
    except FinishedRun as e:
        print(f"mappa train: {e}")
        return 0
    except ValueError as e:
        print(f"mappa train: {e}", file=sys.stderr)
        return 1
    if cfg.trainer == "ray" and not cluster_joinable("mappa train"):
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_record(cfg), indent=2))  # before anything is stored
    try:
        trainer = _trainer(cfg, pool)
    except ValueError as e:  # a configuration the checks refuse (baselines.planning.checks): the reasons, no traceback
        if not str(e).startswith("the training configuration cannot run here"):
            raise
        print(f"mappa train: {e}", file=sys.stderr)
        return 1
    weights = f"trainer {cfg.resolved_dtype()}"
    if cfg.resolved_autocast():
        weights += f" (matmuls in {cfg.resolved_autocast()} autocast)"
    if cfg.trainer == "ray":
        weights += f", engines {cfg.resolved_engine_dtype()}"
    print(
        f"[{cfg.trainer} trainer ready in {time.monotonic() - t0:.0f}s; {weights} on {cfg.resolved_device()}"
        + (f"; actors: {trainer.start.reused} from the pool, {trainer.start.started} started" if pool else "")
        + "]",
        flush=True,
    )
    trainer.on_phase = lambda line: print(line, flush=True)
    eval_path = out / "eval.json"
    evals = _stored_evaluations(cfg, eval_path, saved)
    try:
        _evaluate(trainer, cfg, evals, eval_path, "before")
        trainer.train(on_iteration=lambda m: _print_iteration(trainer, cfg, m, t0))
        _evaluate(trainer, cfg, evals, eval_path, "after")
        if cfg.eval_episodes:
            _print_changes(cfg, evals)
            eval_path.write_text(json.dumps(evals, indent=2))
    finally:
        trainer.close()
    if not cfg.keep_finished_checkpoints:
        drop_finished_checkpoints(out, list(trainer.roles), log=lambda line: print(line, flush=True))
    print(f"done in {time.monotonic() - t0:.0f}s; outputs in {cfg.out_dir} (library logs in {log_dir})")
    return 0


def cluster_joinable(prog: str) -> bool:
    """Whether the Ray cluster named by ``RAY_ADDRESS`` (``--ray-address``) accepts this process, asked before the
    models load (a few seconds: :func:`baselines.ray_learner.ray_connect.join`); its paragraph on stderr when it does
    not. True without an address (a local cluster of our own)."""
    try:
        join()
    except RayConnectError as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        return False
    return True


def _stored_evaluations(cfg, eval_path: Path, saved: dict | None) -> dict[str, Any]:
    """The evaluations a resumed run already made (none afresh); an extended (or shortened) run drops its "after"
    evaluation, which was of the other length."""
    evals = json.loads(eval_path.read_text()) if cfg.resume and eval_path.exists() else {}
    if saved is not None and saved["iterations"] != cfg.iterations and "after" in evals:
        print(
            f"[resume] {saved['iterations']} iterations then, {cfg.iterations} now: the learning-rate schedule follows "
            "the new length from here, and the after-training evaluation is made again",
            flush=True,
        )
        evals.pop("after", None)
        evals.pop("paired", None)
        for per in (evals.get("splits") or {}).values():
            per.pop("after", None)
            per.pop("paired", None)
    return evals


def _evaluate(trainer, cfg, evals: dict[str, Any], eval_path: Path, when: str) -> None:
    """The held-out evaluation of ``eval_split`` (``evals[when]``) and of each extra split
    (``evals["splits"][split][when]``), unless a resumed run holds it already."""
    if not cfg.eval_episodes:
        return
    if when not in evals:
        evals[when] = trainer.evaluate(cfg.eval_split, cfg.eval_episodes)
    for split in cfg.eval_extra_splits:
        per = evals.setdefault("splits", {}).setdefault(split, {})
        if when not in per:
            per[when] = trainer.evaluate(split, cfg.eval_episodes)
    eval_path.write_text(json.dumps(evals, indent=2))
    results = [evals[when], *(evals["splits"][s][when] for s in cfg.eval_extra_splits)]
    for e in results:
        print(f"{when} training, held-out {e['split']}: {_fmt_eval(e)}", flush=True)


def _role_figures(role: str, r: dict) -> str:
    """``verifier coach 4.2 (sd 2.6), tool ok 45%, loss -0.012, kl 0.0003, 0/16 coach fallbacks, 0 masked``."""
    parts = [f"{role} coach {r.get('mean_coach_score', 0):.1f} (sd {r.get('coach_score_std', 0):.1f})"]
    if r.get("tool_success_rate"):
        parts.append(f"tool ok {r['tool_success_rate']:.0%}")
    parts.append("frozen" if r.get("frozen") else f"loss {r.get('loss', 0):.3g}, kl {r.get('kl', 0):.2g}")
    parts.append(f"{r.get('coach_fallbacks', 0)}/{r.get('coach_evaluations', 0)} coach fallbacks")
    if r.get("coach_calls"):  # a coach model was asked: how long its calls took and waited
        parts.append(
            f"{r['coach_calls']} coach calls ({r.get('coach_latency_s', 0):.1f}s each, "
            f"{r.get('coach_queue_s', 0):.1f}s queued)"
        )
    if r.get("coach_directed_text"):
        parts.append(f"{r['coach_directed_text']} addressed the coach ({r.get('coach_score_echoed', 0)} echoed)")
    parts.append(f"{r.get('masked_actions', 0)} masked")
    return ", ".join(parts)


def _print_iteration(trainer, cfg, m: dict, t0: float) -> None:
    """An iteration's line (per role: coach score and its spread, tool success, loss, KL; coach fallbacks; the
    phases' times), after a warning for each role whose coach scores were all equal."""
    for r in trainer.roles:
        if cfg.coach != "none" and r in m and m[r].get("samples", 0) > 1 and m[r].get("coach_score_std", 1.0) == 0.0:
            print(
                f"warning: every {r} action of iteration {m['iteration'] + 1} got the same coach score "
                f"({m[r].get('mean_coach_score', 0):.1f}): equal rewards give no advantage, it learns nothing",
                flush=True,
            )
    roles = "; ".join(_role_figures(r, m[r]) for r in trainer.roles if r in m)
    print(
        f"[iteration {m['iteration'] + 1}/{cfg.iterations}] train accuracy {m['accuracy']:.2f} "
        f"(re-used {m['reused_episodes']} stored episodes); {roles}; rollout "
        f"{m['rollout_s']:.0f}s update {m['train_s']:.0f}s sync {m['sync_s']:.1f}s checkpoint "
        f"{m.get('checkpoint_s', 0.0):.1f}s: {m['iteration_s']:.0f}s ({time.monotonic() - t0:.0f}s in all)",
        flush=True,
    )


def _print_changes(cfg, evals: dict[str, Any]) -> None:
    """Each held-out split's change with its paired test (stored as its ``paired``) and the per-role behaviour."""
    pairs = [(evals, evals["before"], evals["after"])] + [
        (evals["splits"][s], evals["splits"][s]["before"], evals["splits"][s]["after"]) for s in cfg.eval_extra_splits
    ]
    for holder, b, a in pairs:
        paired = paired_change(b, a)
        if paired is not None:
            holder["paired"] = paired
            print(f"change on {a['episodes']} held-out episodes of {a['split']}: {_fmt_paired(paired)}")
            for line in _fmt_categories(b, a):
                print(line)
        else:
            print(
                f"change on {a['episodes']} held-out episodes of {a['split']}: accuracy "
                f"{a['accuracy'] - b['accuracy']:+.1%} (not the same episodes: no paired test)"
            )
        for line in _fmt_behaviour(b, a):
            print(line)
