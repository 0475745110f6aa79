"""The OpenEnv app of a mappa env, as ``openenv.yaml`` names it (``server.app:app``); ``main()`` serves it.

Configured by environment variables (the image's defaults in the Dockerfile): ``MAPPA_ENV_ID`` (default
``mappa/MathChat-v0``), ``MAPPA_SEAT`` (a role: seat mode, with ``MAPPA_POLICIES`` = ``ROLE=MODEL@URL`` or
``ROLE=scripted:REPLY`` items separated by ``;``), ``MAPPA_COACH`` (a coach spec: ``rule``, ``llm:MODEL@URL``),
``MAPPA_MAX_SESSIONS`` (8), ``HOST`` / ``PORT``. The same as ``mappa env serve``, which is the simpler way to run it
outside a container.
"""

from __future__ import annotations

import os

from benchmarks.commands.serve import policies_from_args
from mappa_envs.coach import coach_from_spec
from mappa_envs.integrations.openenv_server import create_mappa_app, serve

ENV_ID = os.environ.get("MAPPA_ENV_ID", "mappa/MathChat-v0")
POLICIES = [item for item in os.environ.get("MAPPA_POLICIES", "").split(";") if item.strip()]
COACH = os.environ.get("MAPPA_COACH")

app = create_mappa_app(
    ENV_ID,
    seat=os.environ.get("MAPPA_SEAT") or None,
    others=policies_from_args(POLICIES) or None,
    coach=coach_from_spec(COACH) if COACH else None,
    max_sessions=int(os.environ.get("MAPPA_MAX_SESSIONS", "8")),
)


def main() -> None:
    serve(app, host=os.environ.get("HOST", "0.0.0.0"), port=int(os.environ.get("PORT", "8000")))


if __name__ == "__main__":
    main()
