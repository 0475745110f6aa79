"""The wire types of a mappa env served over OpenEnv, and the client that speaks them.

Follows ``openenv-core`` 0.3.0 (``openenv.core.env_server.types``, ``openenv.core.env_client``): an action is a
pydantic ``Action``, an observation an ``Observation`` (``done``, ``reward``, ``metadata``), the state a ``State``
(``episode_id``, ``step_count``); the client is an ``EnvClient`` subclass that turns an action into the ``data`` of
the WebSocket ``{"type": "step", "data": ...}`` message (``_step_payload``) and the server's
``{"observation": {...}, "reward": r, "done": d}`` back into a ``StepResult`` (``_parse_result``).

OpenEnv 0.3.0's server leaves ``Observation.metadata`` out of what it sends (``serialize_observation`` excludes
``reward``, ``done`` and ``metadata`` from the observation and sends the first two beside it). Everything a
multi-agent trainer needs beyond the one scalar reward therefore travels in the field :attr:`MappaObservation.info`;
the server also puts it in ``metadata`` (for in-process users and OpenEnv rubrics), and :class:`MappaEnvClient`
copies it back into ``metadata`` on the client side, so ``result.observation.metadata`` reads the same on both ends.

Example (a server started with ``mappa env serve mappa/MathChat-v0 --port 8000``)::

    from mappa_envs.integrations.openenv_models import MappaEnvClient

    with MappaEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)
        while not result.done:
            result = env.step(my_llm(result.observation.messages))
        print(result.observation.info["outcome"], result.observation.info["episode_rewards"])
"""

from __future__ import annotations

import base64
import json
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from pydantic import ConfigDict, Field


class MappaAction(Action):
    """The acting agent's reply: ``{"text": "..."}``, or raw bytes as ``{"text_b64": "..."}``.

    The model is lenient on purpose: any JSON object is accepted here, and the server passes what it cannot read as
    a reply (a missing or non-string ``text``, unknown fields, bad base64) to the env as a malformed action, which
    the env records with its issues like any other; the response's ``error`` says what was wrong.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, arbitrary_types_allowed=True)

    text: Any = Field(default=None, description="the agent's reply (a string)")
    text_b64: str | None = Field(default=None, description="the reply as base64-encoded bytes, instead of text")


class MappaObservation(Observation):
    """What the agent to act next sees, and what happened since the last response.

    ``reward``: the scalar an OpenEnv trainer reads: the rewards received by the agent that acted (seat mode: the
    seat's, from its action through the other roles' actions up to its next turn). Every agent's rewards, per
    action, are in :attr:`info`.
    """

    agent: str = Field(default="", description="the agent to act now (empty when the episode is over)")
    role: str = Field(default="", description="that agent's role")
    text: str = Field(default="", description="that agent's observation: its input rendered as text")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the same input as chat messages")
    error: str | None = Field(default=None, description="what was wrong with the request, if anything")
    info: dict[str, Any] = Field(
        default_factory=dict,
        description="per-agent rewards, the actions taken, coach scores, the episode's essentials (see docs)",
    )


class MappaState(State):
    """The session's episode: OpenEnv's ``episode_id`` and ``step_count`` (requests stepped), and the env's own."""

    env_id: str = ""
    task_id: str | None = None
    agent: str = ""
    seat: str | None = None
    actions: int = 0
    done: bool = False
    outcome: dict[str, Any] | None = None


class MappaEnvClient(EnvClient[MappaAction, MappaObservation, MappaState]):
    """The OpenEnv client of a served mappa env (async; ``.sync()`` for a blocking one). ``step`` takes a
    :class:`MappaAction`, a ``str`` (the reply) or ``bytes`` (sent base64-encoded)."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's, except when the server spoke first and closed: a full server answers a new connection
        ``CAPACITY_REACHED`` at once, and the request sent after it may find the socket closed. The buffered
        answer is then raised (``RuntimeError``, as ``EnvClient`` raises every error answer), not lost behind a
        ``ConnectionClosed``."""
        from websockets.exceptions import ConnectionClosed

        try:
            return await super()._send_and_receive(message)
        except ConnectionClosed:
            try:
                answer = json.loads(await self._ws.recv()) if self._ws is not None else {}
            except (ConnectionClosed, ValueError):
                answer = {}
            if answer.get("type") != "error":
                raise
            data = answer.get("data", {})
            raise RuntimeError(f"Server error: {data.get('message')} (code: {data.get('code')})") from None

    def _step_payload(self, action: MappaAction | str | bytes) -> dict[str, Any]:
        if isinstance(action, bytes | bytearray):
            return {"text_b64": base64.b64encode(bytes(action)).decode("ascii")}
        if isinstance(action, str):
            return {"text": action}
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MappaObservation]:
        fields = dict(payload.get("observation", {}))
        reward, done = payload.get("reward"), bool(payload.get("done", False))
        observation = MappaObservation(**fields, reward=reward, done=done, metadata=dict(fields.get("info", {})))
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> MappaState:
        return MappaState(**payload)


__all__ = ["MappaAction", "MappaEnvClient", "MappaObservation", "MappaState"]
