"""One episode of a team in which the caller plays one role (the *seat*) and given policies play the others: the
part shared by the OpenEnv server (:mod:`.openenv_env`) and the TRL environment (:mod:`.trl_env`). It imports no
third-party library.

:class:`TeamPlay` builds the env (wrapped in ``CoachRewardWrapper(..., blocking=True)`` when a coach is given, so
each action's reward is its coach score / 10, given at once), steps the caller's actions, lets the other roles act
up to the seat's next turn, and adds up what every agent received (PettingZoo's ``env.rewards`` after each step):
``totals`` is the sum a PettingZoo loop over ``env.rewards`` gives. Without a seat the caller plays every agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import policy_for
from ..registry import make


def seat_agent(env: Any, seat: str | None) -> str | None:
    """The agent id of ``seat`` (a role name or an agent id) in ``env``; raises naming the roles when unknown."""
    if seat is None:
        return None
    u = env.unwrapped
    by_role = {r.name: r.agent for r in u.roles}
    if seat in by_role or seat in u.possible_agents:
        return by_role.get(seat, seat)
    raise ValueError(f"no role {seat!r} in {u.env_id}: roles are {sorted(by_role)}")


def check_seat(env_id: str, env_kwargs: Mapping[str, Any], seat: str | None, others: Any) -> None:
    """Raise ``ValueError`` with the reason when the seat is unknown, when a seat has no policies for the other
    roles, or when policies are given without a seat."""
    probe = make(env_id, **env_kwargs)
    try:
        agent = seat_agent(probe, seat)
        if agent is None:
            if others is not None:
                raise ValueError("policies for the other roles are given but no seat: pass seat=ROLE")
            return
        if others is None:
            raise ValueError(f"seat {seat!r}: give policies for the other roles (others=...)")
        missing = []
        for role in probe.unwrapped.roles:
            if role.agent == agent:
                continue
            try:
                policy_for(others, role.agent, role.name)
            except KeyError:
                missing.append(role.name)
        if missing:
            raise ValueError(f"seat {seat!r}: no policy for the roles {missing}")
    finally:
        probe.close()


COACH_KEYS = ("score", "reward", "backend", "parse", "fallback_used", "fallback_reason")


def episode_done(env: Any) -> bool:
    """Whether a PettingZoo AEC env's episode is over (no live agent, or every live one ended)."""
    return not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents)


def action_entry(act: Any) -> dict[str, Any]:
    """One action's essentials: who, which turn, its issues, its reward and, when scored, its coach evaluation's
    score, reward, backend, parse and whether (and why) it fell back."""
    entry = {"index": act.index, "agent": act.agent, "role": act.role, "turn": act.turn}
    entry |= {"issues": list(act.issues), "reward": float(act.reward)}
    if act.coach is not None:
        coach = act.coach.to_dict()
        entry["coach"] = {k: coach.get(k) for k in COACH_KEYS}
    return entry


class TeamPlay:
    """An env (``make(env_id, **env_kwargs)``, coach-wrapped when ``coach`` is given) played from one seat.

    ``seat``: a role name or agent id (None: the caller plays every agent); ``others``: one policy for every
    other role, or a mapping from role name or agent id to policy.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: Mapping[str, Any] | None = None,
        seat: str | None = None,
        others: Any = None,
        coach: Any = None,
    ):
        env = make(env_id, **dict(env_kwargs or {}))
        if coach is not None:
            from ..coach import CoachRewardWrapper

            env = CoachRewardWrapper(env, coach, blocking=True)
        self.env = env
        self.env_id = env_id
        self.seat = seat_agent(env, seat)
        self.others = others
        self.totals: dict[str, float] = {}

    @property
    def unwrapped(self) -> Any:
        return self.env.unwrapped

    @property
    def started(self) -> bool:
        return self.env.unwrapped.record is not None

    def done(self) -> bool:
        return episode_done(self.env)

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> dict[str, float]:
        """A new episode, played up to the seat's first turn; what each agent received meanwhile."""
        self.env.reset(seed=seed, options=dict(options) if options else None)
        self.totals = {a: 0.0 for a in self.env.unwrapped.possible_agents}
        return self.play_others()

    def act(self, value: Any) -> tuple[int, dict[str, float]]:
        """The acting agent's action ``value`` (in seat mode: the seat's), then the others' up to the seat's next
        turn. Returns the record index of the first action taken and what each agent received meanwhile."""
        first = len(self.env.unwrapped.record.actions)
        self.env.step(value)
        rewards = self.collect()
        for a, r in self.play_others().items():
            rewards[a] += r
        return first, rewards

    def collect(self) -> dict[str, float]:
        """Each agent's reward from the step just taken (PettingZoo's ``env.rewards``), added to the totals."""
        rewards = {a: float(self.env.rewards.get(a, 0.0)) for a in self.totals}
        for a, r in rewards.items():
            self.totals[a] += r
        return rewards

    def play_others(self) -> dict[str, float]:
        """Seat mode: the other roles act (their policies) until it is the seat's turn or the episode is over."""
        rewards = {a: 0.0 for a in self.totals}
        if self.seat is None:
            return rewards
        u = self.env.unwrapped
        while not self.done() and self.env.agent_selection != self.seat:
            agent = self.env.agent_selection
            policy = policy_for(self.others, agent, u.role(agent).name)
            self.env.step(policy.generate([u.messages(agent)])[0])
            for a, r in self.collect().items():
                rewards[a] += r
        return rewards

    def close(self) -> None:
        self.env.close()


__all__ = ["COACH_KEYS", "TeamPlay", "action_entry", "check_seat", "episode_done", "seat_agent"]
