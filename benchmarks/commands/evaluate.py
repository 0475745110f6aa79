"""``mappa eval``: a team (the bundled model, a run's models, endpoints) on suites of any registered task
(:mod:`mappa_envs.suites`) and task files, with intervals, and with ``--compare`` a baseline team on the same
episodes and the exact paired test."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from baselines.evaluation.evaluate import (
    EvalConfig,
    evaluate,
    format_comparison,
    format_tables,
    paired_comparison,
    suite_env,
)
from baselines.evaluation.protocol import result_record, track, validate_result
from baselines.evaluation.swap import format_swap_matrix, swap_matrix
from baselines.evaluation.teams import team_from_args
from mappa_envs import make
from mappa_envs.coach import coach_from_spec
from mappa_envs.coach.information import reward_information
from mappa_envs.suites import resolve_suite, task_names

from .common import OldSpelling, env_args, key_values
from .options import add_options, given

# teams.build_policies is looked up when the team is built (a test replaces it).

EVAL_OWN = ("suites", "env_kwargs", "mathchat_kwargs", "dsbench_kwargs")
"""The fields of :class:`~baselines.evaluation.evaluate.EvalConfig` made by :func:`_eval_config` (from ``--suites`` and
``--tasks``, the runs' arguments and ``--env-arg``); every other field is an option of its own."""


class _OldEnvArg(OldSpelling):
    """``--dsbench-arg KEY=VALUE`` (``--env-arg dsbench:KEY=VALUE``) and ``--task-arg TASK:KEY=VALUE``
    (``--env-arg TASK:KEY=VALUE``), appended to ``--env-arg`` with a warning."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs):
        super().__init__(option_strings, dest, new="--env-arg TASK:KEY=VALUE", **kwargs)

    def __call__(self, parser, namespace, values, option_string: str | None = None) -> None:
        item = f"dsbench:{values}" if option_string == "--dsbench-arg" else values
        print(
            f"{parser.prog}: {option_string} is an old spelling of --env-arg TASK:KEY=VALUE; use --env-arg {item}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), item])


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="evaluate a team on any registered task (AIME-32, AMC-32, ...), with intervals")
    p.add_argument(
        "--suites",
        nargs="+",
        default=None,
        help="aime amc dsbench (the default, unless --tasks), any registered task as <task> (its held-out split, "
        "e.g. sql) or <task>:<split> (sql:eval, mathchat:arith1-eval, dsbench:train), or <env id>[:<split>]; "
        "an unknown name lists them (mappa_envs.suites)",
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
        metavar="[TASK:]KEY=VALUE",
        help="an argument of every suite of TASK (a task: mathchat, dsbench, sql, ..., or an env id), e.g. "
        "mathchat:prompt_style=small, dsbench:role_prompts=small, sql:query_turns=1; without TASK, of the one task "
        "the suites are of (several: say which). Default with --run: the arguments the run trained with",
    )
    for old in ("--dsbench-arg", "--task-arg"):  # the old spellings: --env-arg takes TASK: now
        p.add_argument(old, dest="env_arg", action=_OldEnvArg, help=argparse.SUPPRESS)
    p.add_argument(
        "--compare",
        nargs="?",
        const="bundled",
        default=None,
        metavar="RUN",
        help="also evaluate a baseline on the same episodes (the bundled team, or RUN's models) with a paired test",
    )
    _add_comparison_options(p)
    _add_team_options(p)
    add_options(
        p.add_argument_group("evaluation options (each sets one field of baselines.evaluation.evaluate.EvalConfig)"),
        EvalConfig,
        exclude=EVAL_OWN,
        defaults="field",
    )
    p.add_argument("--out", default=None, help="output folder (default runs/eval-<time>)")
    p.set_defaults(func=cmd_eval)
    return p


def _add_comparison_options(p: argparse.ArgumentParser) -> None:
    """Which role's training mattered (--swap, --swap-matrix) and evaluation under a benchmark protocol."""
    p.add_argument(
        "--swap",
        action="append",
        default=[],
        metavar="ROLE=base|RUN2",
        help="with --run: that role plays with the base model (--model, default the bundled one) or RUN2's weights",
    )
    p.add_argument(
        "--swap-matrix",
        action="store_true",
        help="with --run: every combination of trained and base weights per role, on the same episodes, as a table "
        "with intervals and paired tests against the base and the trained team (--compare RUN2: RUN2 is the base)",
    )
    p.add_argument(
        "--protocol",
        default=None,
        help="evaluate under a benchmark protocol (e.g. mappa-bench-v1; docs/benchmarking.md): the track's suites, "
        "samples and sampling settings, and a result file with provenance (result.json)",
    )
    p.add_argument("--track", default=None, help="the protocol's track (mathchat-cpu, mathchat-paper, dsbench-lite...)")
    p.add_argument("--method", default=None, help="the method's name in the result file (default: the run's folder)")


def _add_team_options(p: argparse.ArgumentParser) -> None:
    """Who plays the roles: one model, a model per role, a run's exported models, endpoints."""
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
    from baselines.evaluation.teams import build_policies

    if args.protocol:
        _apply_protocol(args)
    cfg = _eval_config(args)
    roles = _roles(cfg)
    teams = _teams(args, roles)
    team = teams["team"]
    out = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.swap_matrix:
        return _swap_matrix(args, roles, teams, cfg, out)
    policies = build_policies(team, cfg)
    result = evaluate(policies, cfg, out_dir=out, team=team)
    print()
    print(format_tables(result))
    if args.compare:
        del policies  # the team's engines go before the baseline's start (memory; on a GPU, its share of it)
        gc.collect()
        base = evaluate(build_policies(teams["baseline"], cfg), cfg, out_dir=out / "baseline", team=teams["baseline"])
        print(f"\nbaseline ({args.compare}):")
        print(format_tables(base))
        result["baseline"] = {"compare": args.compare, "team": base["team"], "suites": base["suites"]}
        result["paired"] = paired_comparison(result, base)
        print("\n" + format_comparison(result["paired"], "team", "baseline"))
        (out / "eval.json").write_text(json.dumps(result, indent=1, default=str))
    if args.protocol:
        _write_protocol_result(args, result, out)
    print(f"\nresults: {out / 'eval.json'} (trajectories beside it)")
    return 0


def _apply_protocol(args: argparse.Namespace) -> None:
    """The track's fixed settings in place of the options (a differing option is refused, not overridden)."""
    if not args.track:
        raise SystemExit("mappa eval: --protocol needs --track")
    t = track(args.protocol, args.track)
    if args.limit is not None or args.tasks:
        raise SystemExit("mappa eval: a protocol evaluates its suites in full (no --limit, no --tasks)")
    args.suites, args.k, args.temperature = list(t.suites), t.k, t.temperature
    args.max_new_tokens, args.max_prompt_tokens = t.max_new_tokens, t.max_prompt_tokens
    args.env_arg = [f"{k}={json.dumps(v)}" for k, v in t.env_kwargs.items()] + list(args.env_arg)


def _write_protocol_result(args: argparse.Namespace, result: dict, out: Path) -> None:
    run_cfg = json.loads((Path(args.run) / "config.json").read_text()) if args.run else {}
    method = {
        "name": args.method or (Path(args.run).name if args.run else "bundled"),
        "information": _information(args, run_cfg),
        "config": run_cfg,
    }
    record = result_record(args.protocol, args.track, result, method, run_dir=args.run, seeds=[run_cfg.get("seed", 0)])
    problems = validate_result(record)
    if problems:  # a bug here, not the user's: never write an invalid file
        raise RuntimeError("the result file would be invalid: " + "; ".join(problems))
    (out / "result.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"result file ({args.protocol}, track {args.track}): {out / 'result.json'}")


def _information(args: argparse.Namespace, run_cfg: dict) -> str:
    """What the evaluated team's training reward saw (:mod:`mappa_envs.coach.information`): from its run's
    ``config.json``; ``none`` for the untrained bundled team; ``undeclared`` for other models."""
    if run_cfg.get("reward_information"):
        return run_cfg["reward_information"]
    if run_cfg:  # a run from before the label was stored: derived from its coach and estimator
        coach, process = run_cfg.get("coach", "rule"), run_cfg.get("estimator") != "outcome"
        return reward_information(coach_from_spec(coach) if coach != "none" and process else None, process)
    return "none" if not (args.model or args.role_model) else "undeclared"


def _swap_matrix(args: argparse.Namespace, roles: list[str], teams: dict[str, Any], cfg, out: Path) -> int:
    if not args.run:
        raise SystemExit("mappa eval: --swap-matrix needs --run RUN (the trained team)")
    base = teams.get("baseline") or team_from_args(roles, model=args.model)
    matrix = swap_matrix(roles, teams["team"], base, cfg, out)
    print("\n" + format_swap_matrix(matrix))
    print(f"results: {out / 'swap_matrix.json'} (each combination's eval.json and trajectories beside it)")
    return 0


def _swapped(args: argparse.Namespace) -> dict[str, str]:
    """``--swap ROLE=base|RUN2`` as ``--role-model`` entries: the base model, or RUN2's exported model of ROLE."""
    out = {}
    for role, who in key_values(args.swap, "--swap").items():
        if not args.run:
            raise SystemExit("mappa eval: --swap replaces a role of --run RUN's team; give --run")
        out[role] = (args.model or "smollm2-135m") if who == "base" else str(Path(who) / "models" / role)
    return out


def _eval_config(args: argparse.Namespace):
    """The :class:`~baselines.evaluation.evaluate.EvalConfig` of the arguments: the suites, the env arguments the
    trained team (or, comparing a run with the bundled team, that run's) trained with, then ``--env-arg
    [TASK:]KEY=VALUE``."""
    suites = list(args.suites or ([] if args.tasks else ["aime", "amc", "dsbench"]))
    suites += [f"tasks:{path}" for path in args.tasks]
    compared = args.compare if args.compare and args.compare != "bundled" else None
    mathchat_kwargs = _run_env_kwargs(args.run) if args.run else _run_env_kwargs(compared)
    dsbench_kwargs = _run_env_kwargs(args.run or compared, "mappa/DSBench-v0")
    given_args = _given_env_args(args.env_arg, suites)
    mathchat_kwargs.update(given_args.pop("mathchat", {}))
    dsbench_kwargs.update(given_args.pop("dsbench", {}))
    for run in (args.run, compared):
        trained = _run_env_kwargs(run)
        if run and any(mathchat_kwargs.get(k) != v for k, v in trained.items()):
            print(
                f"note: {run} trained with MathChat arguments {trained}; both teams see "
                f"{mathchat_kwargs or 'the defaults'}"
            )
    task_kwargs = _run_task_args(args, suites, compared)
    for task, kwargs in given_args.items():
        task_kwargs.setdefault(task, {}).update(kwargs)
    if mathchat_kwargs:
        print(f"MathChat arguments: {mathchat_kwargs}")
    if dsbench_kwargs:
        print(f"DSBench arguments: {dsbench_kwargs}")
    for task, kwargs in task_kwargs.items():
        if kwargs:
            print(f"{task} arguments: {kwargs}")
    return EvalConfig(
        suites=tuple(suites),
        mathchat_kwargs=mathchat_kwargs,
        dsbench_kwargs=dsbench_kwargs,
        env_kwargs=task_kwargs,
        **given(args, EvalConfig, exclude=EVAL_OWN, prog="mappa eval"),
    )


def _suite_tasks(suites: list[str]) -> dict[str, str]:
    """The task of each suite's env, ``{task name: env id}`` (a task file is MathChat's)."""
    out = {"mathchat": "mappa/MathChat-v0"} if any(name.startswith("tasks:") for name in suites) else {}
    for name in suites:
        if not name.startswith("tasks:"):
            suite = resolve_suite(name)
            out[suite.task] = suite.env_id
    return out


def _given_env_args(items: list[str], suites: list[str]) -> dict[str, dict[str, Any]]:
    """``--env-arg [TASK:]KEY=VALUE`` by task name (``mathchat``, ``dsbench``, ``sql``; an env id given as TASK is
    named by its task). TASK is one of the suites' tasks; without it, the suites must all be of one task. A value
    may hold ``:``; a key never does."""
    tasks = _suite_tasks(suites)
    by_id = {env_id: task for task, env_id in tasks.items()}  # an env id, or another name of a task, as the task
    by_id.update({name: task for task, env_id in tasks.items() for name in task_names(env_id)})
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        left, eq, _ = item.partition("=")
        task, colon, key = left.rpartition(":")
        if not eq:
            raise SystemExit(f"mappa eval: --env-arg takes [TASK:]KEY=VALUE, not {item!r}")
        if not colon:
            if len(tasks) != 1:
                raise SystemExit(
                    f"mappa eval: --env-arg {item}: the suites {suites} are of the tasks {sorted(tasks)}; say which, "
                    f"e.g. --env-arg {sorted(tasks)[0]}:{item}"
                )
            task = next(iter(tasks))
        task = by_id.get(task, task)
        if task not in tasks:
            raise SystemExit(
                f"mappa eval: --env-arg {item}: no suite is of the task {task!r} (the suites' tasks: {sorted(tasks)})"
            )
        out.setdefault(task, {}).update(env_args([item[len(left) - len(key) :]], "--env-arg"))
    return out


def _run_task_args(args: argparse.Namespace, suites: list[str], compared: str | None) -> dict[str, dict[str, Any]]:
    """``EvalConfig.env_kwargs`` by task: the arguments a run of a task other than MathChat and DSBench trained with
    (the config's own fields carry those two), where one of the suites is of that task."""
    tasks = set(_suite_tasks(suites).values())
    out: dict[str, dict[str, Any]] = {}
    run = args.run or compared
    saved = Path(run) / "config.json" if run else None
    trained = json.loads(saved.read_text()) if saved is not None and saved.exists() else {}
    env_id = trained.get("env_id", "mappa/MathChat-v0")
    if env_id not in ("mappa/MathChat-v0", "mappa/DSBench-v0") and env_id in tasks:
        out[env_id] = _run_env_kwargs(run, env_id)
    return out


def _roles(cfg) -> list[str]:
    """Every role of the suites' envs, in order of appearance."""
    roles: list[str] = []
    for suite in cfg.suites:
        env_id, kwargs = suite_env(suite, cfg)
        probe = make(env_id, **kwargs)
        roles += [r.name for r in probe.unwrapped.roles if r.name not in roles]
        probe.close()
    return roles


def _teams(args: argparse.Namespace, roles: list[str]) -> dict[str, dict[str, Any]]:
    """The team evaluated and, with ``--compare``, the baseline: the bundled model in every role, or another run's
    exported models."""
    teams = {
        "team": team_from_args(
            roles,
            model=args.model,
            role_models={**key_values(args.role_model, "--role-model"), **_swapped(args)},
            run_dir=args.run,
            role_endpoints=key_values(args.role_endpoint, "--role-endpoint"),
            endpoint_model=args.endpoint_model,
        )
    }
    if args.compare:
        teams["baseline"] = team_from_args(roles, run_dir=None if args.compare == "bundled" else args.compare)
    for name, members in teams.items():
        for role, who in members.items():
            print(f"{name + ' ' if args.compare else ''}{role:<16}{who}", flush=True)
    return teams
