"""The ``mappa`` command line.

mappa envs                                   list registered environments
mappa run --env mappa/MathChat-v0 -n 3       run episodes with local models, write trajectories, print stats
mappa train --preset demo                    train every role (REINFORCE++ / GRPO / outcome-only)
mappa eval -k 1                              evaluate a team on AIME-32, AMC-32 and DSBench eval, with intervals
mappa eval --run RUN --tasks F --compare     a run's team vs the bundled one on a task file: paired exact test
mappa report run RUN [RUN ...]               a report (Markdown + PNG, HTML) of training runs
mappa ablate --preset smoke                  coach vs outcome-only vs GRPO on one seed and budget, then a report
mappa bench                                  the performance suite (every figure against a reference)
mappa report coach-bias TRAJECTORIES         coach scores by role, task type and outcome
mappa sandbox build|reap|serve               the sandbox image and service
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _kv(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _parse_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _run_env_kwargs(run_dir: str | None, env_id: str = "mappa/MathChat-v0") -> dict[str, Any]:
    """The arguments of ``env_id`` a `mappa train` run trained with, but those that pick its tasks (MathChat: the
    prompt style, the code executor's turns; DSBench: the role prompts, the turns): what its roles were trained
    to see. Empty for a run of another env."""
    if not run_dir or not (Path(run_dir) / "config.json").exists():
        return {}
    cfg = json.loads((Path(run_dir) / "config.json").read_text())
    if cfg.get("env_id", "mappa/MathChat-v0") != env_id:
        return {}
    picks = ("split", "data_file", "tasks", "task_ids", "suite", "data_dir")
    return {k: v for k, v in (cfg.get("env_kwargs") or {}).items() if k not in picks}


def cmd_eval(args: argparse.Namespace) -> int:
    from baselines.evaluate import (
        EvalConfig,
        build_policies,
        evaluate,
        format_comparison,
        format_tables,
        paired_comparison,
        suite_env,
        team_from_args,
    )
    from mappa_envs import make

    suites = list(args.suites or ([] if args.tasks else ["aime", "amc", "dsbench"]))
    suites += [f"tasks:{path}" for path in args.tasks]
    # the trained team's MathChat arguments (or, comparing a run with the bundled team, that run's), then --env-arg
    compared = args.compare if args.compare and args.compare != "bundled" else None
    mathchat_kwargs = _run_env_kwargs(args.run) if args.run else _run_env_kwargs(compared)
    mathchat_kwargs.update({k: _parse_value(v) for k, v in _kv(args.env_arg, "--env-arg").items()})
    dsbench_kwargs = _run_env_kwargs(args.run or compared, "mappa/DSBench-v0")
    dsbench_kwargs.update({k: _parse_value(v) for k, v in _kv(args.dsbench_arg, "--dsbench-arg").items()})
    for run in (args.run, compared):
        trained = _run_env_kwargs(run)
        if run and any(mathchat_kwargs.get(k) != v for k, v in trained.items()):
            print(
                f"note: {run} trained with MathChat arguments {trained}; both teams see "
                f"{mathchat_kwargs or 'the defaults'}"
            )
    cfg = EvalConfig(
        suites=tuple(suites),
        k=args.k,
        seed=args.seed,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        limit=args.limit,
        concurrency=args.concurrency,
        engine=args.engine,
        dsbench_data_dir=args.dsbench_data_dir,
        sandbox=args.sandbox,
        mathchat_kwargs=mathchat_kwargs,
        dsbench_kwargs=dsbench_kwargs,
    )
    roles: list[str] = []
    for suite in cfg.suites:
        env_id, kwargs = suite_env(suite, cfg)
        probe = make(env_id, **kwargs)
        roles += [r.name for r in probe.unwrapped.roles if r.name not in roles]
        probe.close()
    if mathchat_kwargs:
        print(f"MathChat arguments: {mathchat_kwargs}")
    if dsbench_kwargs:
        print(f"DSBench arguments: {dsbench_kwargs}")
    team = team_from_args(
        roles,
        model=args.model,
        role_models=_kv(args.role_model, "--role-model"),
        run_dir=args.run,
        role_endpoints=_kv(args.role_endpoint, "--role-endpoint"),
        endpoint_model=args.endpoint_model,
    )
    teams = {"team": team}
    if args.compare:  # the baseline: the bundled model in every role, or another run's exported models
        teams["baseline"] = team_from_args(roles, run_dir=None if args.compare == "bundled" else args.compare)
    for name, members in teams.items():
        for role, who in members.items():
            print(f"{name + ' ' if args.compare else ''}{role:<16}{who}", flush=True)
    out = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    policies = build_policies(team, cfg)
    result = evaluate(policies, cfg, out_dir=out, team=team)
    print()
    print(format_tables(result))
    if args.compare:
        import gc

        del policies  # the team's engines go before the baseline's start (memory; on a GPU, its share of it)
        gc.collect()
        base = evaluate(build_policies(teams["baseline"], cfg), cfg, out_dir=out / "baseline", team=teams["baseline"])
        print(f"\nbaseline ({args.compare}):")
        print(format_tables(base))
        result["baseline"] = {"compare": args.compare, "team": base["team"], "suites": base["suites"]}
        result["paired"] = paired_comparison(result, base)
        print("\n" + format_comparison(result["paired"], "team", "baseline"))
        (out / "eval.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nresults: {out / 'eval.json'} (trajectories beside it)")
    return 0


def cmd_envs(_args: argparse.Namespace) -> int:
    from mappa_envs import list_envs

    for spec in list_envs():
        print(f"{spec.id:<28}{spec.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from baselines import GenerationConfig, TransformersPolicy, run_episodes
    from baselines.models import DEFAULT_MODEL
    from mappa_envs import make
    from mappa_envs.core import write_jsonl
    from mappa_envs.metrics import summary_table

    env_kwargs: dict[str, Any] = {k: _parse_value(v) for k, v in _kv(args.env_arg, "--env-arg").items()}
    if args.split:
        env_kwargs["split"] = args.split
    if args.sandbox:
        env_kwargs["sandbox"] = args.sandbox
    probe = make(args.env, **env_kwargs)
    roles = [r.name for r in probe.unwrapped.roles]
    probe.close()

    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, batch_size=args.batch_size)
    per_role = _kv(args.role_model, "--role-model")
    unknown = set(per_role) - set(roles)
    if unknown:
        raise SystemExit(f"--role-model names unknown roles {sorted(unknown)}; roles: {roles}")
    loaded: dict[str, TransformersPolicy] = {}
    policies = {}
    t0 = time.monotonic()
    for role in roles:
        name = per_role.get(role, args.model or DEFAULT_MODEL)
        if name not in loaded:
            print(f"loading {name} ...", file=sys.stderr, flush=True)
            loaded[name] = TransformersPolicy(name, gen, seed=args.seed)
        policies[role] = loaded[name]
    print(f"models ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)

    out = Path(args.out or f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}/trajectories.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    done = 0

    def on_episode(_index, rec) -> None:
        nonlocal done
        done += 1
        write_jsonl(out, [rec], append=True)
        o = rec.outcome
        ran = sum(c.result.ok for a in rec.actions for c in a.tool_calls)
        calls = sum(len(a.tool_calls) for a in rec.actions)
        print(
            f"[{done}/{args.episodes}] {rec.task_id}: predicted={o.get('predicted')!r} answer={o.get('answer')!r} "
            f"correct={o.get('correct')} actions={len(rec.actions)} code runs ok={ran}/{calls}",
            flush=True,
        )

    t0 = time.monotonic()
    records = run_episodes(
        lambda: make(args.env, **env_kwargs),
        policies,
        args.episodes,
        seed=args.seed,
        concurrency=args.concurrency,
        on_episode=on_episode,
    )
    elapsed = time.monotonic() - t0
    if args.show_transcripts:
        for rec in records:
            print(_transcript(rec))
    tokens = sum(p.generated_tokens for p in loaded.values())
    print()
    print(summary_table(records))
    print(f"{len(records)} episodes in {elapsed:.1f}s, {tokens} generated tokens ({tokens / elapsed:.1f} tok/s)")
    print(f"trajectories: {out}")
    return 0


def _transcript(rec) -> str:
    lines = [f"=== {rec.task_id} ==="]
    for act in rec.actions:
        lines.append(f"--- {act.agent} (turn {act.turn}) ---\n{act.output.strip()}")
        for call in act.tool_calls:
            lines.append(f"[{call.tool}] {call.feedback}")
    lines.append(f"=== outcome: {rec.outcome} ===\n")
    return "\n".join(lines)


def _trainer(cfg):
    if cfg.trainer == "ray":
        from baselines.ray_trainer import RayTrainer

        return RayTrainer(cfg)
    if cfg.trainer == "local":
        from baselines.local_trainer import LocalTrainer

        return LocalTrainer(cfg)
    raise ValueError(f"trainer must be 'ray' or 'local', not {cfg.trainer!r}")


def _fmt_eval(e: dict) -> str:
    from mappa_envs.metrics import wilson_interval

    lo, hi = wilson_interval(e["correct"], e["episodes"])
    return (
        f"accuracy {e['accuracy']:.1%} [{lo:.0%}, {hi:.0%}] ({e['correct']}/{e['episodes']}), code-executor "
        f"code rate {e['code_rate']:.1%}, tool success {e['tool_success_rate']:.1%}"
    )


BEHAVIOUR = (
    ("boxed_rate", "boxed answer"),
    ("right_answer_rate", "right answer"),
    ("code_rate", "code"),
    ("tool_success_rate", "tool success"),
    ("right_number_rate", "right number printed"),
)


def _fmt_behaviour(before: dict, after: dict) -> list[str]:
    """Per role, each behaviour figure that is not 0 before and after: ``before -> after``."""
    lines = []
    for role, b in (before.get("behaviour") or {}).items():
        a = (after.get("behaviour") or {}).get(role, {})
        parts = [
            f"{label} {b.get(key, 0):.0%} -> {a.get(key, 0):.0%}"
            for key, label in BEHAVIOUR
            if b.get(key, 0) or a.get(key, 0)
        ]
        if parts:
            lines.append(f"  {role}: " + ", ".join(parts))
    return lines


def paired_change(before: dict, after: dict) -> dict | None:
    """The exact McNemar test between two evaluations of the same held-out episodes (``outcomes`` in the same
    task order), or None when they are not the same episodes."""
    from mappa_envs.metrics import paired_test, wilson_interval

    if before.get("task_ids") != after.get("task_ids") or "outcomes" not in before or "outcomes" not in after:
        return None
    test = paired_test(before["task_ids"], before["outcomes"], after["outcomes"])
    return {
        **test,
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "ci95_before": list(wilson_interval(before["correct"], before["episodes"])),
        "ci95_after": list(wilson_interval(after["correct"], after["episodes"])),
    }


def _fmt_paired(p: dict) -> str:
    from baselines.evaluate import test_name

    return (
        f"accuracy {p['accuracy_before']:.1%} [{p['ci95_before'][0]:.0%}, {p['ci95_before'][1]:.0%}] -> "
        f"{p['accuracy_after']:.1%} [{p['ci95_after'][0]:.0%}, {p['ci95_after'][1]:.0%}]; paired ("
        f"{test_name(p)}, "
        f"{p['pairs']} {p.get('unit', 'episode')}s): {p['gained']} gained, {p['lost']} lost, "
        f"p = {p['p_value']:.3g} two-sided ({p['p_value_gain']:.3g} for a gain)"
    )


def _config_table(cfg) -> str:
    """The configuration's fields, two to a line."""
    import dataclasses

    names = [f.name for f in dataclasses.fields(cfg)]
    key = max(len(n) for n in names) + 2
    cells = [f"{n:<{key}}{json.dumps(getattr(cfg, n))}" for n in names]
    width = max(len(c) for c in cells) + 2
    if width > 60:
        return "\n".join(cells)
    return "\n".join("".join(c.ljust(width) for c in cells[i : i + 2]).rstrip() for i in range(0, len(cells), 2))


def _dry_run(cfg, preset_name: str) -> int:
    """``mappa train --dry-run``: the configuration and every pre-flight check; 0 if it can run here, else 1."""
    from baselines.checks import check_config, failed, format_checks

    print(f"\nconfiguration (preset {preset_name}):")
    print(_config_table(cfg))
    checks = check_config(cfg)
    print("\nchecks:")
    print(format_checks(checks))
    bad = failed(checks)
    if not bad:
        print("\ndry run: every check passed; this configuration can run here")
        return 0
    print(f"\ndry run: cannot run here ({len(bad)} failed check{'s' if len(bad) > 1 else ''}):")
    for c in bad:
        print(f"- {c.name}: {c.detail.splitlines()[0]}")
    return 1


def _train_config(args: argparse.Namespace):
    """The ``TrainConfig`` of ``mappa train``'s arguments: the preset, with each flag given replacing its field."""
    import dataclasses

    from baselines.presets import preset

    base = preset(args.preset)
    env_kwargs = None
    if args.env and args.env != base.env_id:
        env_kwargs = {}  # the preset's arguments belong to its own env
    if args.env_arg:
        parsed = {k: _parse_value(v) for k, v in _kv(args.env_arg, "--env-arg").items()}
        env_kwargs = {**(base.env_kwargs if env_kwargs is None else env_kwargs), **parsed}
    cfg = preset(
        args.preset,
        env_id=args.env,
        env_kwargs=env_kwargs,
        trainer=args.trainer,
        iterations=args.iterations,
        model=args.model,
        estimator=args.estimator,
        coach=args.coach,
        out_dir=args.out,
        seed=args.seed,
        world_size=args.world_size,
        prompts_per_iteration=args.prompts_per_iteration,
        samples_per_prompt=args.samples_per_prompt,
        concurrency=args.concurrency,
        train_batch=args.train_batch,
        eval_split=args.eval_split,
        eval_extra_splits=tuple(args.eval_extra_split) if args.eval_extra_split else None,
        eval_samples=args.eval_samples,
        eval_episodes=args.eval_episodes,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_ratio=args.warmup_ratio,
        lr_schedule=args.lr_schedule,
        advantage_scope=args.advantage_scope,
        mask_coach_fallbacks=False if args.keep_coach_fallbacks else None,
        truncated=args.truncated,
        max_new_tokens=args.max_new_tokens,
        micro_batch=args.micro_batch,
        pack_tokens=args.pack_tokens,
        zero_stage=args.zero_stage,
        gradient_checkpointing=True if args.gradient_checkpointing else None,
        rollout_logprobs=False if args.no_rollout_logprobs else None,
        concurrent_generation=True if args.concurrent_generation else None,
        checkpoint_every=args.checkpoint_every,
        temperature=args.temperature,
        engine_kv_cache_gb=args.engine_kv_cache_gb,
        memory_check=False if args.no_memory_check else None,
        resume=False if args.no_resume else None,
        progress=False if args.no_progress else None,
    )
    if args.env and args.env != base.env_id and args.eval_split is None:
        cfg = dataclasses.replace(cfg, eval_split=None)  # the preset's held-out split belongs to its own env
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    cfg = _train_config(args)
    if args.dry_run:
        print(json.dumps(dataclasses.asdict(cfg)), flush=True)  # machine-readable, first line
        return _dry_run(cfg, args.preset)
    from baselines.console import setup_run_logging

    out = Path(cfg.out_dir)
    print(f"configuration (preset {args.preset}):")
    print(_config_table(cfg))
    print(f"(saved to {out / 'config.json'} when training starts)")
    log_dir = setup_run_logging(out, args.verbose)
    if args.verbose:
        print(f"library logs: on this console (--verbose), and the driver's in {log_dir / 'driver.log'}", flush=True)
    else:
        print(f"library logs (Ray, vLLM, DeepSpeed, transformers): {log_dir}/ (--verbose shows them here)", flush=True)
    # the Ray trainer's actors write their output to files there (baselines.console.redirect_actor_output)
    previous = os.environ.pop("MAPPA_ACTOR_LOG_DIR", None)
    if not args.verbose:
        os.environ["MAPPA_ACTOR_LOG_DIR"] = str(log_dir.resolve())
    try:
        return _train(cfg, out, log_dir)
    except Exception:
        if not args.verbose:
            print(f"mappa train: failed; the libraries' logs are in {log_dir}/", file=sys.stderr, flush=True)
        raise
    finally:
        os.environ.pop("MAPPA_ACTOR_LOG_DIR", None)
        if previous is not None:
            os.environ["MAPPA_ACTOR_LOG_DIR"] = previous


def _train(cfg, out: Path, log_dir: Path) -> int:
    """``mappa train`` after the configuration is shown and the logs are set up: build, evaluate, train, evaluate."""
    import dataclasses

    from baselines.loop import check_resumable

    t0 = time.monotonic()
    try:
        saved = check_resumable(cfg)
    except ValueError as e:
        print(f"mappa train: {e}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))  # before anything is stored
    try:
        trainer = _trainer(cfg)
    except ValueError as e:  # a configuration the checks refuse (baselines.checks): the reasons, no traceback
        if not str(e).startswith("the training configuration cannot run here"):
            raise
        print(f"mappa train: {e}", file=sys.stderr)
        return 1
    print(f"[{cfg.trainer} trainer ready in {time.monotonic() - t0:.0f}s]", flush=True)
    trainer.on_phase = lambda line: print(line, flush=True)
    eval_path = out / "eval.json"
    evals = json.loads(eval_path.read_text()) if cfg.resume and eval_path.exists() else {}
    if saved is not None and saved["iterations"] != cfg.iterations and "after" in evals:
        # an extended (or shortened) run: its "after" evaluation was of the other length
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

    def evaluate(when: str) -> None:
        """The held-out evaluation of ``eval_split`` (``evals[when]``) and of each extra split
        (``evals["splits"][split][when]``)."""
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

    try:
        evaluate("before")

        def report(m: dict) -> None:
            for r in trainer.roles:
                if r in m and m[r].get("samples", 0) > 1 and m[r].get("coach_score_std", 1.0) == 0.0:
                    print(
                        f"warning: every {r} action of iteration {m['iteration'] + 1} got the same coach score "
                        f"({m[r].get('mean_coach_score', 0):.1f}): equal rewards give no advantage, it learns nothing",
                        flush=True,
                    )
            keys = ("mean_coach_score", "coach_score_std", "tool_success_rate", "loss", "kl")
            roles = {r: {k: round(m[r][k], 3) for k in keys if k in m[r]} for r in trainer.roles if r in m}
            faults = ", ".join(
                f"{r} {m[r].get('coach_fallbacks', 0)}/{m[r].get('coach_evaluations', 0)} fallbacks, "
                f"{m[r].get('masked_actions', 0)} masked"
                for r in trainer.roles
                if r in m
            )
            print(
                f"[iteration {m['iteration'] + 1}/{cfg.iterations}] train accuracy {m['accuracy']:.2f} "
                f"(re-used {m['reused_episodes']} stored episodes) {roles} coach: {faults}; rollout "
                f"{m['rollout_s']:.0f}s update {m['train_s']:.0f}s sync {m['sync_s']:.1f}s checkpoint "
                f"{m.get('checkpoint_s', 0.0):.1f}s: {m['iteration_s']:.0f}s ({time.monotonic() - t0:.0f}s in all)",
                flush=True,
            )

        trainer.train(on_iteration=report)
        evaluate("after")
        if cfg.eval_episodes:
            pairs = [(evals, evals["before"], evals["after"])] + [
                (evals["splits"][s], evals["splits"][s]["before"], evals["splits"][s]["after"])
                for s in cfg.eval_extra_splits
            ]
            for holder, b, a in pairs:
                paired = paired_change(b, a)
                if paired is not None:
                    holder["paired"] = paired
                    print(f"change on {a['episodes']} held-out episodes of {a['split']}: {_fmt_paired(paired)}")
                else:
                    print(
                        f"change on {a['episodes']} held-out episodes of {a['split']}: accuracy "
                        f"{a['accuracy'] - b['accuracy']:+.1%} (not the same episodes: no paired test)"
                    )
                for line in _fmt_behaviour(b, a):
                    print(line)
            eval_path.write_text(json.dumps(evals, indent=2))
    finally:
        trainer.close()
    print(f"done in {time.monotonic() - t0:.0f}s; outputs in {cfg.out_dir} (library logs in {log_dir})")
    return 0


def cmd_report_coach_bias(args: argparse.Namespace) -> int:
    from mappa_envs.coach.bias import bias_report, format_report, normalize_scores
    from mappa_envs.core import read_jsonl

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


def cmd_report_run(args: argparse.Namespace) -> int:
    from benchmarks.report import Run, write_report

    labels = list(args.label or [])
    if labels and len(labels) != len(args.runs):
        raise SystemExit(f"--label given {len(labels)} times for {len(args.runs)} runs")
    runs = [Run(path, labels[i] if labels else None) for i, path in enumerate(args.runs)]
    out = Path(args.out or Path(args.runs[0]) / "report")
    md = write_report(runs, out, evals=args.eval or [])
    print(f"report: {md} and {out / 'report.html'} (figures: {', '.join(p.name for p in sorted(out.glob('*.png')))})")
    return 0


ABLATION = (
    ("coach", {"estimator": "reinforce_pp"}),
    ("outcome", {"estimator": "outcome", "coach": "none"}),
    ("grpo", {"estimator": "grpo"}),
)


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
    arms = []
    for name, change in ABLATION:
        argv = ["train", "--preset", args.preset, "--out", str(out / name), "--seed", str(args.seed)]
        argv += ["--estimator", change["estimator"], *(["--coach", change["coach"]] if "coach" in change else [])]
        for flag, value in (
            ("--iterations", args.iterations),
            ("--samples-per-prompt", args.samples_per_prompt),
            ("--prompts-per-iteration", args.prompts_per_iteration),
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
        for c in failed(check_config(_train_config(build_parser().parse_args(argv)))):
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
    return cmd_report_run(
        argparse.Namespace(runs=runs, label=[n for n, _ in ABLATION], out=str(out / "report"), eval=[])
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mappa", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("envs", help="list registered environments")
    p.set_defaults(func=cmd_envs)

    from baselines.presets import PRESETS

    p = sub.add_parser("train", help="train every role with REINFORCE++ / GRPO / outcome-only")
    p.add_argument("--preset", default="demo", choices=list(PRESETS), help=" | ".join(PRESETS))
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the configuration and the pre-flight checks (model on disk, tasks, memory estimate) and exit: "
        "0 if it can run here, 1 if not; starts nothing",
    )
    p.add_argument("--trainer", default=None, help="ray (vLLM + DeepSpeed ZeRO-3, default) | local (one process)")
    p.add_argument("--env", default=None, help="registered env id (default: the preset's)")
    p.add_argument(
        "--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env argument (JSON values), repeatable"
    )
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--model", default=None, help="smollm2-135m | tiny-random | a model folder")
    p.add_argument("--estimator", default=None, help="reinforce_pp | grpo | outcome")
    p.add_argument("--coach", default=None, help="rule | none | package.module:factory")
    p.add_argument("--world-size", type=int, default=None, help="DeepSpeed ranks per role (ray trainer)")
    p.add_argument("--prompts-per-iteration", type=int, default=None)
    p.add_argument("--samples-per-prompt", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=None, help="episodes stepped together")
    p.add_argument("--train-batch", type=int, default=None, help="samples per optimiser step (ray trainer)")
    p.add_argument("--eval-split", default=None, help="held-out split (tasks with named splits)")
    p.add_argument(
        "--eval-extra-split", action="append", default=None, metavar="SPLIT", help="another held-out split, repeatable"
    )
    p.add_argument("--eval-episodes", type=int, default=None, help="held-out problems before and after training")
    p.add_argument("--eval-samples", type=int, default=None, help="samples per held-out problem")
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    p.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay")
    p.add_argument("--warmup-ratio", type=float, default=None, help="fraction of iterations of linear lr warm-up")
    p.add_argument(
        "--lr-schedule", choices=("cosine", "constant"), default=None, help="after the warm-up (default cosine)"
    )
    p.add_argument("--advantage-scope", choices=("role", "team"), default=None, help="where advantages are normalised")
    p.add_argument(
        "--keep-coach-fallbacks",
        action="store_true",
        help="train on actions whose coach evaluation is a fallback (default: masked out of the loss)",
    )
    p.add_argument(
        "--truncated", choices=("mask", "keep"), default=None, help="responses cut at --max-new-tokens: mask | keep"
    )
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature of the rollouts")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per reply")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per forward/backward pass")
    p.add_argument(
        "--pack-tokens",
        type=int,
        default=None,
        help="forward/backward over prefix-shared packs of at most this many distinct tokens (0: padded micro-batches)",
    )
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None, help="DeepSpeed ZeRO stage")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward")
    p.add_argument(
        "--no-rollout-logprobs",
        action="store_true",
        help="recompute the policy's log-probs in the trainer instead of taking the engine's (distributed trainer)",
    )
    p.add_argument("--checkpoint-every", type=int, default=None, help="iterations between checkpoints (0: last only)")
    p.add_argument(
        "--concurrent-generation",
        action="store_true",
        help="let the roles' engines generate at the same time on CPU too (the GPU default; slower on a CPU)",
    )
    p.add_argument("--engine-kv-cache-gb", type=float, default=None, help="vLLM KV cache per engine on CPU (GiB)")
    p.add_argument(
        "--no-memory-check", action="store_true", help="start even if the estimated peak memory exceeds what is free"
    )
    p.add_argument("--out", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-resume", action="store_true", help="start afresh even if --out holds a checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' logs (Ray, vLLM, DeepSpeed, transformers) on the console too; by default they go "
        "only to <out>/logs/",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("report", help="reports over trajectories")
    rsub = p.add_subparsers(dest="report", required=True)
    r = rsub.add_parser("coach-bias", help="coach scores by role, task type and outcome, with flagged gaps")
    r.add_argument("trajectories", nargs="+", help="trajectory files (JSON lines)")
    r.add_argument("--min-gap", type=float, default=0.5, help="smallest gap (points) worth flagging")
    r.add_argument("--normalize", action="store_true", help="also show the effect of per-group normalisation")
    r.set_defaults(func=cmd_report_coach_bias)
    r = rsub.add_parser("run", help="a training report (Markdown + PNG, and HTML) of one or more runs")
    r.add_argument("runs", nargs="+", help="`mappa train` output folders (several: overlaid for comparison)")
    r.add_argument("--label", action="append", default=None, help="a name per run, in order")
    r.add_argument("--eval", action="append", default=None, help="a `mappa eval` eval.json to include")
    r.add_argument("--out", default=None, help="output folder (default: <first run>/report)")
    r.set_defaults(func=cmd_report_run)

    p = sub.add_parser("ablate", help="coach vs outcome-only vs GRPO on the same seeds and budget, then a report")
    p.add_argument("--preset", default="smoke")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--samples-per-prompt", type=int, default=None, help="for every arm (GRPO needs 2 or more)")
    p.add_argument("--prompts-per-iteration", type=int, default=None, help="for every arm")
    p.add_argument("--out", default=None, help="default runs/ablation-<preset>")
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--verbose", action="store_true", help="passed to every arm's `mappa train`")
    p.set_defaults(func=cmd_ablate)

    sub.add_parser("bench", help="the performance suite: every figure against a reference (mappa bench -h)")
    sub.add_parser("sandbox", help="build the Docker sandbox image offline, or reap leftovers (mappa sandbox -h)")

    p = sub.add_parser("eval", help="evaluate a team (AIME-32, AMC-32, DSBench eval, task files), with intervals")
    p.add_argument(
        "--suites",
        nargs="+",
        default=None,
        help="aime amc dsbench (the default, unless --tasks), mathchat:<split> (e.g. mathchat:arith1-eval), "
        "dsbench:<split> (DSBench-lite's train, eval or all)",
    )
    p.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="FILE",
        help="a MathChat task file (JSON list / JSON lines of prompt and answer, as make(..., data_file=))",
    )
    p.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an argument of every MathChat suite (default with --run: the run's prompt_style)",
    )
    p.add_argument(
        "--dsbench-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an argument of every DSBench suite, e.g. role_prompts=small (default with --run: the run's)",
    )
    p.add_argument(
        "--compare",
        nargs="?",
        const="bundled",
        default=None,
        metavar="RUN",
        help="also evaluate a baseline on the same episodes (the bundled team, or RUN's models) with a paired test",
    )
    p.add_argument("-k", type=int, default=1, help="samples per problem")
    p.add_argument("--model", default=None, help="model for every role (default: the bundled smollm2-135m)")
    p.add_argument("--role-model", action="append", default=[], metavar="ROLE=MODEL", help="model for one role")
    p.add_argument("--run", default=None, help="a `mappa train` output folder: its models/<role>/ play the roles")
    p.add_argument(
        "--role-endpoint",
        action="append",
        default=[],
        metavar="ROLE=[MODEL@]URL",
        help="an OpenAI-compatible endpoint for one role (API key from OPENAI_API_KEY)",
    )
    p.add_argument("--endpoint-model", default=None, help="served model name for endpoints given without MODEL@")
    p.add_argument("--engine", default="vllm", help="local models: vllm (in-process engine) | transformers")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-prompt-tokens", type=int, default=3072)
    p.add_argument("--limit", type=int, default=None, help="only the first N problems of each suite")
    p.add_argument("--concurrency", type=int, default=16, help="episodes in flight")
    p.add_argument("--dsbench-data-dir", default=None, help="original DSBench data (default: DSBench-lite eval)")
    p.add_argument("--sandbox", default=None, help="sandbox backend (default: each env's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (default runs/eval-<time>)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("run", help="run episodes with local models and write trajectories")
    p.add_argument("--env", default="mappa/MathChat-v0", help="registered env id")
    p.add_argument("-n", "--episodes", type=int, default=3)
    p.add_argument("--split", default=None, help="task split (env-specific, e.g. aime-eval-32, arith-eval)")
    p.add_argument("--sandbox", default=None, help="sandbox backend for tool calls (default: the env's)")
    p.add_argument(
        "--env-arg", action="append", default=[], metavar="KEY=VALUE", help="extra env argument (JSON value)"
    )
    p.add_argument(
        "--model",
        default=None,
        help="model for every role: 'smollm2-135m' (bundled), a folder, or an HF id on disk",
    )
    p.add_argument("--role-model", action="append", default=[], metavar="ROLE=MODEL", help="model for one role")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--batch-size", type=int, default=16, help="conversations per generate() batch")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", default=None, help="trajectory file (JSON lines); default runs/run-<time>/trajectories.jsonl"
    )
    p.add_argument("--show-transcripts", action="store_true")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the benchmark suite's own parser
        from benchmarks.suite import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["sandbox"]:  # its own parser, so that `mappa sandbox -h` shows its help
        from sandboxes.__main__ import main as sandboxes_main

        return sandboxes_main(argv[1:], prog="mappa sandbox")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
