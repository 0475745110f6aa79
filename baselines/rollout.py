"""Rollouts: many env instances stepped together, generation batched per policy.

Each slot holds one env. At every round the slots are grouped by the policy of their current agent, each group's
conversations go to that policy in one ``generate`` call, and each reply is stepped into its env. Finished
episodes are collected and the slot starts the next episode until ``n_episodes`` are done.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from mappa_envs.core import EpisodeRecord

from .policies import Policy


def policy_for(policies: Policy | Mapping[str, Policy], agent: str, role: str) -> Policy:
    """Look a policy up by agent id, then by role name; a single policy serves every role."""
    if not isinstance(policies, Mapping):
        return policies
    for key in (agent, role):
        if key in policies:
            return policies[key]
    raise KeyError(f"no policy for agent {agent!r} (role {role!r}); given: {sorted(policies)}")


def run_episodes(
    env_fn: Callable[[], Any],
    policies: Policy | Mapping[str, Policy],
    n_episodes: int,
    *,
    seed: int = 0,
    concurrency: int = 8,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    reset_options: Callable[[int], dict[str, Any]] | None = None,
) -> list[EpisodeRecord]:
    """Run ``n_episodes`` episodes (episode ``i`` is reset with ``seed + i``) and return their records in order.

    ``env_fn`` builds one env (wrappers allowed); up to ``concurrency`` envs are stepped together.
    ``reset_options(i)`` gives episode ``i``'s reset options (e.g. ``{"task_index": ...}`` to roll out several
    samples of the same task).
    """
    envs = [env_fn() for _ in range(min(concurrency, n_episodes))]
    results: dict[int, EpisodeRecord] = {}
    episode_of: dict[int, int] = {}
    next_episode = 0

    def start(slot: int) -> None:
        nonlocal next_episode
        options = reset_options(next_episode) if reset_options is not None else None
        envs[slot].reset(seed=seed + next_episode, options=options)
        episode_of[slot] = next_episode
        next_episode += 1

    for slot in range(len(envs)):
        start(slot)
    active = set(range(len(envs)))
    finished: list[int] = []
    try:
        while active:
            groups: dict[int, list[int]] = defaultdict(list)
            by_id: dict[int, Policy] = {}
            for slot in sorted(active):
                env = envs[slot]
                agent = env.agent_selection
                policy = policy_for(policies, agent, env.unwrapped.role(agent).name)
                by_id[id(policy)] = policy
                groups[id(policy)].append(slot)
            for pid, slots in groups.items():
                batch = [envs[s].unwrapped.messages(envs[s].agent_selection) for s in slots]
                replies = by_id[pid].generate(batch)
                if len(replies) != len(slots):
                    raise RuntimeError(f"policy returned {len(replies)} replies for {len(slots)} conversations")
                for slot, reply in zip(slots, replies, strict=True):
                    env = envs[slot]
                    env.step(reply)
                    if env.terminations[env.agent_selection] or env.truncations[env.agent_selection]:
                        finished.append(slot)
            # Episodes that ended this round are closed only now: a wrapper that scores asynchronously (the
            # coach) then waits once for all of them instead of once per episode.
            for slot in finished:
                env = envs[slot]
                while env.agents:  # the dead steps of PettingZoo's AEC protocol
                    env.step(None)
                record = env.unwrapped.record
                results[episode_of[slot]] = record
                if on_episode is not None:
                    on_episode(record)
                if next_episode < n_episodes:
                    start(slot)
                else:
                    active.discard(slot)
            finished.clear()
    finally:
        for env in envs:
            env.close()
    return [results[i] for i in range(n_episodes)]
