"""``mappa env serve ENV_ID``: a registered env served over OpenEnv (needs the ``openenv`` extra).

mappa env serve mappa/MathChat-v0 --port 8000                        the client plays every agent in turn
mappa env serve mappa/MathChat-v0 --seat code_executor \\
    --policy problem_solver=smollm2@http://127.0.0.1:8001/v1 \\
    --policy verifier=scripted:'\\boxed{0}'                           the client plays one role (seat mode)
mappa env serve mappa/MathChat-v0 --seat code_executor \\
    --policy problem_solver=run:runs/demo --policy verifier=run:runs/demo   the others: a run's trained models
mappa env serve mappa/MathChat-v0 --coach rule                       per-action coach rewards

See docs/integrations.md and :mod:`mappa_envs.integrations.openenv_server`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from baselines.evaluation.evaluate import EvalConfig
from baselines.evaluation.teams import OpenAIPolicy
from mappa_envs.coach import coach_from_spec
from mappa_envs.core import ScriptedPolicy, SerialPolicy
from mappa_envs.integrations.seat import check_seat

from .common import OldSpelling, env_args, key_values

# teams.build_policies is looked up when the team is built (a test replaces it); the OpenEnv server (pandas) and the
# sibling command modules are imported where they are used.


def add_parser(sub: Any) -> None:
    from .run import cmd_envs

    env = sub.add_parser("env", help="list the registered envs, or serve one over OpenEnv (mappa env serve -h)")
    env_sub = env.add_subparsers(dest="env_command", required=True)
    env_sub.add_parser("list", help="the registered env ids, one line each").set_defaults(func=cmd_envs)
    p = env_sub.add_parser(
        "serve",
        help="serve ENV_ID over OpenEnv (WebSocket sessions)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("env_id", help="registered env id (mappa env list lists them)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seat", default=None, help="the role the client plays; the others need --policy")
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="ROLE=SPEC",
        help="who plays ROLE server-side in seat mode: MODEL@URL (an OpenAI-compatible endpoint), run:RUN_DIR "
        "(the role's model a training run exported to RUN_DIR/models/ROLE), model:NAME_OR_PATH (a local model: "
        "smollm2-135m, a folder) or scripted:REPLY",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "transformers"),
        default="vllm",
        help="local policies (run:, model:): an in-process vLLM engine per distinct model, or transformers",
    )
    p.add_argument("--coach", default=None, help="per-action rewards from a coach: rule, llm:MODEL@URL, ...")
    p.add_argument("--max-sessions", type=int, default=8, help="concurrent sessions; more are answered busy")
    p.add_argument("--idle-timeout", type=float, default=300.0, help="seconds before an idle session is closed")
    p.add_argument("--max-action-chars", type=int, default=1_000_000, help="longer replies are cut (and recorded)")
    p.add_argument("--split", default=None, help="task split (env-specific)")
    p.add_argument("--sandbox", default=None, help="sandbox backend for tool calls (default: the env's)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env argument (JSON value)")
    p.add_argument(
        "--max-new-tokens",
        dest="max_tokens",
        metavar="N",
        type=int,
        default=512,
        help="the other seats' policies: tokens per reply",
    )
    p.add_argument(  # the old spelling: `mappa train` and `mappa eval` say --max-new-tokens
        "--max-tokens", dest="max_tokens", type=int, action=OldSpelling, new="--max-new-tokens", help=argparse.SUPPRESS
    )
    p.add_argument("--temperature", type=float, default=0.6, help="endpoint policies: sampling temperature")
    p.set_defaults(func=cmd_serve)


def policies_from_args(
    items: list[str], max_tokens: int = 512, temperature: float = 0.6, engine: str = "vllm"
) -> dict[str, Any]:
    """Who plays each role named in ``--policy ROLE=SPEC`` items, by role:

    - ``MODEL@URL``: :class:`baselines.evaluation.teams.OpenAIPolicy` (an OpenAI-compatible endpoint; its calls run at
      once);
    - ``run:RUN_DIR``: the model a training run exported for ROLE (``RUN_DIR/models/ROLE``);
    - ``model:NAME_OR_PATH``: a local model (``smollm2-135m``, ``tiny-random``, a folder);
    - ``scripted:REPLY``: :class:`~mappa_envs.core.ScriptedPolicy` always giving REPLY.

    Local models (``engine``: vLLM or transformers; one per distinct model) and scripted policies are shared by the
    server's sessions, so each is wrapped in :class:`~mappa_envs.core.SerialPolicy` (one call at a time).
    """
    policies: dict[str, Any] = {}
    local: dict[str, dict[str, str]] = {}
    for role, value in key_values(items, "--policy").items():
        if value.startswith("scripted:"):
            policies[role] = SerialPolicy(ScriptedPolicy([value[len("scripted:") :]]))
        elif value.startswith("run:"):
            path = Path(value[len("run:") :]) / "models" / role
            if not (path / "config.json").exists():
                raise SystemExit(
                    f"--policy {role}={value}: {path} holds no exported model (`mappa train` writes "
                    "RUN_DIR/models/ROLE when a run finishes; ROLE is a role name such as problem_solver)"
                )
            local[role] = {"kind": "local", "model": str(path)}
        elif value.startswith("model:") and value[len("model:") :]:
            local[role] = {"kind": "local", "model": value[len("model:") :]}
        elif "@" in value and value.split("@", 1)[0]:
            model, url = value.split("@", 1)
            policies[role] = OpenAIPolicy(url, model, max_tokens=max_tokens, temperature=temperature)
        else:
            raise SystemExit(
                f"--policy {role}={value}: expected ROLE=MODEL@URL, ROLE=run:RUN_DIR, ROLE=model:NAME_OR_PATH "
                "or ROLE=scripted:REPLY"
            )
    if local:
        from baselines.evaluation.teams import build_policies

        cfg = EvalConfig(engine=engine, max_new_tokens=max_tokens, temperature=temperature)
        serial: dict[int, SerialPolicy] = {}  # roles sharing one model share one lock
        for role, policy in build_policies(local, cfg).items():
            policies[role] = serial.setdefault(id(policy), SerialPolicy(policy))
    return policies


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from mappa_envs.integrations.openenv_server import create_mappa_app, serve
    except ImportError as e:
        raise SystemExit(f"mappa env serve needs openenv-core: pip install 'mappa-envs[openenv]' ({e})") from e

    env_kwargs: dict[str, Any] = env_args(args.env_arg)
    if args.split:
        env_kwargs["split"] = args.split
    if args.sandbox:
        env_kwargs["sandbox"] = args.sandbox

    try:  # the seat and the roles --policy names, checked before any model is loaded for them
        named = key_values(args.policy, "--policy")
        check_seat(args.env_id, env_kwargs, args.seat, dict.fromkeys(named) or None)
    except ValueError as e:
        raise SystemExit(f"mappa env serve: {e}") from e
    others = policies_from_args(args.policy, args.max_tokens, args.temperature, args.engine) or None
    try:
        app = create_mappa_app(
            args.env_id,
            env_kwargs=env_kwargs,
            seat=args.seat,
            others=others,
            coach=coach_from_spec(args.coach) if args.coach else None,
            max_sessions=args.max_sessions,
            idle_timeout_s=args.idle_timeout or None,
            max_action_chars=args.max_action_chars,
        )
    except ValueError as e:
        raise SystemExit(f"mappa env serve: {e}") from e
    print(f"serving {args.env_id} over OpenEnv on ws://{args.host}:{args.port}/ws", flush=True)
    serve(app, host=args.host, port=args.port)
    return 0
