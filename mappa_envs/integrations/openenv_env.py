"""A mappa env as an OpenEnv ``Environment``: one instance per WebSocket session, each with its own env (hence its
own sandbox session and workspace).

Follows ``openenv-core`` 0.3.0's ``openenv.core.env_server.interfaces.Environment``: ``reset(seed, episode_id,
**kwargs)`` and ``step(action, timeout_s, **kwargs)`` return an observation, ``state`` is a property, ``close``
releases the instance, and ``SUPPORTS_CONCURRENT_SESSIONS = True`` lets ``create_app`` run several sessions at
once (its ``HTTPEnvServer`` checks that flag on the factory's class and calls the factory once per session).

**Full team** (no seat): the client plays every agent in turn; each step is the action of the agent named by the
previous observation's ``agent``. **Seat mode** (``seat=ROLE``): the client plays one role; the others are played
here by :class:`~mappa_envs.core.Policy` objects (one for all, or one per role name or agent id), so a single-agent
trainer trains one specialist inside the team. ``reset`` accepts ``task_index`` or ``task_id`` beside ``seed``.

The observation (:class:`~.openenv_models.MappaObservation`) carries the agent to act and its input; ``info`` (also
in ``metadata``) carries ``rewards`` (what each agent received during this request), ``episode_rewards`` (each
agent's total so far: the sum PettingZoo's ``env.rewards`` gives over the live steps), ``acted`` (the actions this
request took: agent, role, turn, issues, reward and, with a coach, its score, reward and whether it fell back),
``outcome`` and ``record`` (every action's final reward and coach score) at the end, and the episode's task id.
With a coach the env is wrapped in ``CoachRewardWrapper(..., blocking=True)``: each action's reward is its coach
score / 10, given at once (a hindsight coach scores every action when the episode ends).
"""

from __future__ import annotations

import base64
import binascii
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from ..core import sanitize
from ..registry import spec
from .openenv_models import MappaAction, MappaObservation, MappaState
from .seat import TeamPlay, action_entry, seat_agent

SHAPE = 'an action is {"text": "<reply>"} (or {"text_b64": "<base64 of raw bytes>"})'


@dataclass
class ServeConfig:
    """What every session of a server builds and who plays the roles the client does not."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    seat: str | None = None
    """The role (or agent id) the client plays; None: the client plays every agent."""
    others: Any = None
    """Seat mode: a policy for every other role, or a mapping from role name (or agent id) to policy. Shared by all
    sessions: it is called from several sessions' threads at once."""
    coach: Any = None
    """A coach (:func:`mappa_envs.coach.coach_from_spec`): per-action rewards instead of the outcome alone."""
    max_action_chars: int = 1_000_000
    """Longer replies are cut to this many characters before the env sees them (an error says so)."""


_OPEN: set[MappaEnvironment] = set()
_OPEN_LOCK = threading.Lock()


def open_environments() -> list[MappaEnvironment]:
    """The sessions' environments not closed yet (in this process)."""
    with _OPEN_LOCK:
        return list(_OPEN)


class MappaEnvironment(Environment[MappaAction, MappaObservation, MappaState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServeConfig):
        super().__init__()
        self.config = config
        self.team = TeamPlay(config.env_id, config.env_kwargs, config.seat, config.others, config.coach)
        self.env = self.team.env
        self.seat = self.team.seat
        self._closed = False
        self._steps = 0
        self._episode_id: str | None = None
        with _OPEN_LOCK:
            _OPEN.add(self)

    # ----------------------------------------------------------------- OpenEnv's interface
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MappaObservation:
        if self._closed:
            return self._refusal("this session was closed (idle too long): open a new one")
        unknown = sorted(set(kwargs) - {"task_index", "task_id"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}: reset takes seed, episode_id, task_index, task_id")
        rewards = self.team.reset(seed=seed, options=kwargs)
        self._episode_id = episode_id or self.env.unwrapped.record.episode_id
        self._steps = 0
        return self._observation(0, rewards, reward=None)

    def step(self, action: MappaAction, timeout_s: float | None = None, **kwargs: Any) -> MappaObservation:
        if self._closed:
            return self._refusal("this session was closed (idle too long): open a new one")
        u = self.env.unwrapped
        if u.record is None:
            return self._refusal("no episode: reset first (the HTTP /step endpoint keeps no session: use /ws)")
        if self.team.done():
            return self._refusal("the episode is over: reset for a new one")
        value, problems = self._read(action)
        agent = self.env.agent_selection
        first, rewards = self.team.act(value)
        self._steps += 1
        if problems and len(u.record.actions) > first:
            u.record.actions[first].issues.extend(f"openenv: {p}" for p in problems)
        error = "malformed action, recorded as such (the episode goes on): " + "; ".join(problems) if problems else None
        return self._observation(first, rewards, reward=rewards[self.seat or agent], error=error)

    @property
    def state(self) -> MappaState:
        u = self.env.unwrapped
        done = u.record is not None and self.team.done()
        return MappaState(
            episode_id=self._episode_id,
            step_count=self._steps,
            env_id=self.config.env_id,
            task_id=None if u.record is None else u.record.task_id,
            agent="" if u.record is None or done else self.env.agent_selection,
            seat=None if self.seat is None else u.role(self.seat).name,
            actions=0 if u.record is None else len(u.record.actions),
            done=done,
            outcome=_plain(dict(u.record.outcome)) if done else None,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        from .. import __version__

        u = self.env.unwrapped
        return EnvironmentMetadata(
            name=self.config.env_id,
            description=spec(self.config.env_id).description or self.config.env_id,
            readme_content=sys.modules[type(u).__module__].__doc__ or type(u).__doc__,
            version=__version__,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _OPEN_LOCK:
            _OPEN.discard(self)
        self.team.close()

    def _read(self, action: Any) -> tuple[Any, list[str]]:
        """What the env is given for ``action``, and what was wrong with its form (empty when nothing)."""
        problems = []
        extra = sorted(getattr(action, "model_extra", None) or {})
        if not isinstance(action, MappaAction):
            return action, [f"an action of type {type(action).__name__}: {SHAPE}"]
        if extra:
            problems.append(f"unknown fields {extra}: {SHAPE}")
        if action.text_b64 is not None:
            if action.text is not None:
                problems.append("both 'text' and 'text_b64' given: 'text_b64' is used")
            try:
                value: Any = base64.b64decode(action.text_b64, validate=True)
                problems.append(f"the reply came as {len(value)} bytes: decoded as UTF-8 with replacement")
            except (binascii.Error, ValueError):
                value = action.text_b64
                problems.append("'text_b64' is not valid base64: its characters are taken as the reply")
        elif action.text is None:
            value = None
            problems.append(f"no 'text': {SHAPE}")
        else:
            value = action.text
            if not isinstance(value, str):
                problems.append(f"'text' is a {type(value).__name__}, not a string: {SHAPE}")
        limit = self.config.max_action_chars
        if isinstance(value, str | bytes) and len(value) > limit:
            problems.append(f"a reply of {len(value)} characters is cut to {limit} (the server's max_action_chars)")
            value = value[:limit]
        return value, problems

    # ----------------------------------------------------------------- observations
    def _refusal(self, error: str) -> MappaObservation:
        done = self._closed or self.env.unwrapped.record is None or self.team.done()
        return MappaObservation(done=done, reward=None, error=error, info=self._essentials())

    def _essentials(self) -> dict[str, Any]:
        u = self.env.unwrapped
        rec = u.record
        return {
            "env_id": self.config.env_id,
            "episode_id": self._episode_id,
            "task_id": None if rec is None else rec.task_id,
            "seat": None if self.seat is None else u.role(self.seat).name,
            "actions_so_far": 0 if rec is None else len(rec.actions),
            "episode_rewards": dict(self.team.totals),
        }

    def _observation(
        self, first: int, rewards: Mapping[str, float], reward: float | None, error: str | None = None
    ) -> MappaObservation:
        """The observation after the actions from index ``first`` on; ``rewards``: what each agent got meanwhile."""
        u = self.env.unwrapped
        done = self.team.done()
        info = {
            **self._essentials(),
            "rewards": dict(rewards),
            "acted": [action_entry(a) for a in u.record.actions[first:]],
            "outcome": dict(u.record.outcome) if done else None,
            "record": [action_entry(a) for a in u.record.actions] if done else None,
        }
        info = _plain(info)
        agent = "" if done else self.env.agent_selection
        return MappaObservation(
            done=done,
            reward=reward,
            agent=agent,
            role=u.role(agent).name if agent else "",
            text=str(self.env.observe(agent)) if agent else "",
            messages=u.messages(agent) if agent else [],
            error=error,
            info=info,
            metadata=info,
        )


def _plain(value: Any) -> Any:
    """``value`` as JSON-safe data: strings sanitised (no lone surrogates), numbers as floats, the rest as text."""
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return value
    if isinstance(value, Mapping):
        return {sanitize(str(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return sanitize(str(value))


__all__ = ["MappaEnvironment", "ServeConfig", "open_environments", "seat_agent"]
