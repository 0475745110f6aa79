"""Every registered mappa env served over OpenEnv (``mappa env serve ENV_ID``, or :func:`create_mappa_app` and
:func:`serve` from Python).

Built on ``openenv-core`` 0.3.0's ``create_app(env_factory, action_cls, observation_cls, env_name,
concurrency_config=ConcurrencyConfig(max_concurrent_envs, session_timeout))``: a FastAPI app whose ``/ws``
endpoint holds one stateful session per WebSocket connection (messages ``{"type": "reset"|"step"|"state"|"close",
"data": ...}``, answers ``{"type": "observation"|"state"|"error", "data": ...}``), created when the client
connects and destroyed (its environment closed: env, sandbox session, workspace) when the connection ends, however
it ends. What that gives, and what this module adds:

- **Busy**: past ``max_sessions`` open sessions a new connection is answered ``{"type": "error", "data":
  {"code": "CAPACITY_REACHED", "message": "Server at capacity: 8/8 sessions active. ..."}}`` and closed, never
  queued (``EnvClient`` raises it as ``RuntimeError`` on its first call).
- **Faults**: an unreadable message (not JSON, an unknown type, a ``data`` that is not an object) is answered with
  an error (``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``) and the session goes on. A malformed action
  (see :class:`~.openenv_env.MappaEnvironment`) is given to the env as such and recorded; the response's ``error``
  says what was wrong. A client that disconnects or dies ends its session at once (the server's next read of the
  socket fails), or at the end of the step it is running (bounded by the sandbox's time limit); a silent peer is
  dropped by uvicorn's WebSocket pings (20 s + 20 s), and a session left idle longer than ``idle_timeout_s`` is
  closed by OpenEnv's reaper (checked every ``max(idle_timeout_s / 4, 5)`` s).
- **Size**: uvicorn's WebSocket message limit is raised to ``ws_max_size`` (64 MiB) so that an enormous reply
  reaches the env (cut to ``max_action_chars`` and recorded) instead of closing the connection.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.types import ConcurrencyConfig

from .openenv_env import MappaEnvironment, ServeConfig
from .openenv_models import MappaAction, MappaObservation
from .seat import check_seat

WS_MAX_SIZE = 64 * 2**20


def create_mappa_app(
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    seat: str | None = None,
    others: Any = None,
    coach: Any = None,
    max_sessions: int = 8,
    idle_timeout_s: float | None = 300.0,
    max_action_chars: int = 1_000_000,
) -> Any:
    """The FastAPI app serving ``env_id`` (built with ``env_kwargs``) over OpenEnv.

    ``seat``: the role the client plays (seat mode), the others played by ``others`` (one policy, or a mapping
    from role name or agent id to policy); ``coach``: per-action coach rewards; ``max_sessions``: concurrent
    sessions before new ones are refused as busy; ``idle_timeout_s``: a session idle that long is closed (None:
    never). The env is built once here to check the arguments, the seat and that every other role has a policy.
    """
    config = ServeConfig(
        env_id=env_id,
        env_kwargs=dict(env_kwargs or {}),
        seat=seat,
        others=others,
        coach=coach,
        max_action_chars=max_action_chars,
    )
    check_config(config)
    factory = functools.partial(MappaEnvironment, config)
    concurrency = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s)
    return create_app(factory, MappaAction, MappaObservation, env_name=env_id, concurrency_config=concurrency)


def check_config(config: ServeConfig) -> None:
    """Raise ``ValueError`` with the reason when ``config`` cannot serve: an unknown seat, a seat without policies
    for the other roles (or policies without a seat)."""
    check_seat(config.env_id, config.env_kwargs, config.seat, config.others)


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run ``app`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, ws_max_size=WS_MAX_SIZE, log_level=log_level)


class RunningServer:
    """``app`` served by uvicorn in a background thread (tests, notebooks); ``port=0`` takes a free port::

    with RunningServer(create_mappa_app("mappa/MathChat-v0")) as server:
        client = MappaEnvClient(base_url=server.url)
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, ws_max_size=WS_MAX_SIZE, log_level=log_level)
        self.server = uvicorn.Server(config)
        self.host = host
        self._thread = threading.Thread(target=self.server.run, name="openenv-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the OpenEnv server did not start on {host}:{port}")
            time.sleep(0.05)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = ["WS_MAX_SIZE", "RunningServer", "check_config", "create_mappa_app", "serve"]
