"""One role of a pipeline as a single-agent ``gymnasium.Env``; the other roles are played by given policies.

Single-agent RL code can then train one specialist inside the team::

    from mappa_envs.core import ScriptedPolicy
    env = SingleAgentView(
        mappa_envs.make("mappa/MathChat-v0", split="arith-eval"),
        "code_executor",
        others=ScriptedPolicy(["6 * 7 = \\\\boxed{42}"]),
    )
    obs, info = env.reset(seed=0)                 # the problem solver has already answered
    obs, reward, terminated, truncated, info = env.step("```python\\nprint(6 * 7)\\n```")

``step`` takes the role's action, then lets the other roles act (each through ``policy.generate([messages])``)
until it is the role's turn again or the episode ends. The reward is the sum of what the role received in between
(the env's outcome at the end, or a reward wrapper's per-action rewards: wrap the AEC env first, e.g. in a
``CoachRewardWrapper(..., blocking=True)``). Observation and action spaces are the role's text spaces.
Every role of a pipeline acts at least once per episode, so ``reset`` always returns the role's first
observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium

from .policy import policy_for


class SingleAgentView(gymnasium.Env):
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, env: Any, agent: str, others: Any | Mapping[str, Any], render_mode: str | None = None):
        """``env``: a pipeline AEC env (wrappers allowed); ``agent``: the agent id or role name played here;
        ``others``: one policy for every other role, or a mapping from role name (or agent id) to policy."""
        self.env = env
        u = env.unwrapped
        by_role = {r.name: r.agent for r in u.roles}
        if agent in by_role:
            agent = by_role[agent]
        if agent not in u.possible_agents:
            raise KeyError(f"no agent or role {agent!r} in {u.possible_agents}")
        self.agent, self.others = agent, others
        self.observation_space = env.observation_space(agent)
        self.action_space = env.action_space(agent)
        if render_mode not in (None, "ansi"):
            raise ValueError("render_mode must be None or 'ansi'")
        self.render_mode = render_mode

    def _policy(self, agent: str):
        return policy_for(self.others, agent, self.env.unwrapped.role(agent).name)

    def _over(self) -> bool:
        return not self.env.agents or (
            self.env.agent_selection == self.agent
            and (self.env.terminations.get(self.agent, True) or self.env.truncations.get(self.agent, False))
        )

    def _advance(self) -> float:
        """Let the other roles act until it is this role's turn or the episode is over; returns this role's
        rewards received meanwhile."""
        reward = 0.0
        while self.env.agents and self.env.agent_selection != self.agent:
            a = self.env.agent_selection
            if self.env.terminations[a] or self.env.truncations[a]:
                self.env.step(None)  # PettingZoo's dead step
            else:
                self.env.step(self._policy(a).generate([self.env.unwrapped.messages(a)])[0])
            reward += float(self.env.rewards.get(self.agent, 0.0))
        return reward

    def _obs(self):
        return self.env.observe(self.agent)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.env.reset(seed=seed, options=options)
        self._advance()
        if self._over():
            raise RuntimeError(f"the episode ended before {self.agent} acted")
        return self._obs(), {"role": self.env.unwrapped.role(self.agent).name}

    def step(self, action: Any):
        if self._over():
            raise RuntimeError("the episode is over: call reset()")
        self.env.step(action)
        reward = float(self.env.rewards.get(self.agent, 0.0)) + self._advance()
        terminated = bool(self.env.terminations.get(self.agent, True)) or not self.env.agents
        truncated = bool(self.env.truncations.get(self.agent, False)) and not terminated
        info = dict(self.env.infos.get(self.agent, {})) if self.env.agents else {}
        if terminated or truncated:
            info["outcome"] = dict(self.env.unwrapped.record.outcome)
        return self._obs(), reward, terminated, truncated, info

    def render(self):
        if self.render_mode == "ansi":
            return self.env.unwrapped.transcript()
        return None

    def close(self) -> None:
        self.env.close()


__all__ = ["SingleAgentView"]
