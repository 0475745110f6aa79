"""``mappa run`` (episodes with local transformers models, trajectories written as they end) and ``mappa env list``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from baselines import GenerationConfig, TransformersPolicy, run_episodes
from baselines.weights.models import DEFAULT_MODEL
from mappa_envs import list_envs, make
from mappa_envs.core import write_jsonl
from mappa_envs.metrics import summary_table

from .common import env_args, key_values


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("envs")  # the old spelling of `mappa env list`: no help, so the help leaves it out
    p.set_defaults(func=_cmd_old_envs)

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


def _cmd_old_envs(args: argparse.Namespace) -> int:
    print("mappa: envs is an old spelling of env list; use mappa env list", file=sys.stderr)
    return cmd_envs(args)


def cmd_envs(_args: argparse.Namespace) -> int:
    for spec in list_envs():
        print(f"{spec.id:<28}{spec.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    env_kwargs: dict[str, Any] = env_args(args.env_arg)
    if args.split:
        env_kwargs["split"] = args.split
    if args.sandbox:
        env_kwargs["sandbox"] = args.sandbox
    probe = make(args.env, **env_kwargs)
    roles = [r.name for r in probe.unwrapped.roles]
    probe.close()

    loaded, policies = _load_policies(args, roles)

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


def _load_policies(args: argparse.Namespace, roles: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The transformers policies of ``--model`` / ``--role-model``: (each distinct model once, the policy per role)."""
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, batch_size=args.batch_size)
    per_role = key_values(args.role_model, "--role-model")
    unknown = set(per_role) - set(roles)
    if unknown:
        raise SystemExit(f"--role-model names unknown roles {sorted(unknown)}; roles: {roles}")
    loaded: dict[str, Any] = {}
    policies = {}
    t0 = time.monotonic()
    for role in roles:
        name = per_role.get(role, args.model or DEFAULT_MODEL)
        if name not in loaded:
            print(f"loading {name} ...", file=sys.stderr, flush=True)
            loaded[name] = TransformersPolicy(name, gen, seed=args.seed)
        policies[role] = loaded[name]
    print(f"models ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return loaded, policies


def _transcript(rec) -> str:
    lines = [f"=== {rec.task_id} ==="]
    for act in rec.actions:
        lines.append(f"--- {act.agent} (turn {act.turn}) ---\n{act.output.strip()}")
        for call in act.tool_calls:
            lines.append(f"[{call.tool}] {call.feedback}")
    lines.append(f"=== outcome: {dict(rec.outcome or {})} ===\n")
    return "\n".join(lines)
