"""Rollouts: many env instances stepped together, generation batched per policy.

Each slot holds one env. At every round the slots are grouped by the policy of their current agent, each group's
conversations go to that policy in one ``generate`` call, and each reply is stepped into its env. Finished
episodes are collected and the slot starts the next episode until ``n_episodes`` are done.

When a policy returns :class:`mappa_envs.core.Generation` replies, the token ids it sampled, its finish
reason and (when the engine gives them) the sampled tokens' log-probabilities are kept in the action's
``generation`` (what training trains on).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from baselines.weights.policies import Generation, Policy
from mappa_envs.core import EpisodeRecord, GenerationInfo
from mappa_envs.core.policy import SubmitsBatches, policy_for


def run_episodes(
    env_fn: Callable[[], Any],
    policies: Policy | Mapping[str, Policy],
    episodes: int | Sequence[int],
    *,
    seed: int = 0,
    concurrency: int = 8,
    on_episode: Callable[[int, EpisodeRecord], None] | None = None,
    reset_options: Callable[[int], dict[str, Any]] | None = None,
    timings: dict[str, float] | None = None,
) -> list[EpisodeRecord]:
    """Run episodes ``0..episodes-1`` (or the given episode indices) and return their records in that order.

    Episode ``i`` is reset with ``seed + i`` and ``reset_options(i)`` (e.g. ``{"task_index": ...}`` to roll out
    several samples of the same task), so any subset of indices can be re-run identically (a resumed run rolls
    out only the missing ones). ``env_fn`` builds one env (wrappers allowed); up to ``concurrency`` envs are
    stepped together. ``on_episode(i, record)`` is called as each episode finishes (its coach scores included).

    A policy with a ``submit(batch)`` method (returning a zero-argument callable that yields the replies) gets
    every role's batch submitted before any is awaited, so engines of different roles generate at the same time.

    ``timings``, when given, is filled with where the time went: ``generate_s`` (submitting and awaiting the
    policies), ``env_s`` (stepping the envs: tools, the coach's hand-off, closing episodes), ``rounds`` and
    ``requests`` (so ``requests / rounds`` is the mean batch per round).
    """
    order = list(range(episodes)) if isinstance(episodes, int) else [int(i) for i in episodes]
    run = _Rollout(env_fn, policies, order, seed, concurrency, on_episode, reset_options)
    try:
        while run.active:
            run.step_round()
            run.close_finished()
    finally:
        run.close()
        if timings is not None:
            timings.update(run.clock)
    return [run.results[i] for i in order]


def _deferred(policy: Policy, batch: list[Any]) -> Callable[[], Sequence[str]]:
    """A policy without :class:`SubmitsBatches`: its batch generated when the result is asked for."""
    return lambda: policy.generate(batch)


class _Rollout:
    """The envs in flight of :func:`run_episodes`: which episode each slot plays, the finished records, the clock."""

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policies: Policy | Mapping[str, Policy],
        order: Sequence[int],
        seed: int,
        concurrency: int,
        on_episode: Callable[[int, EpisodeRecord], None] | None,
        reset_options: Callable[[int], dict[str, Any]] | None,
    ):
        self.policies, self.seed, self.on_episode, self.reset_options = policies, seed, on_episode, reset_options
        self.clock = {"generate_s": 0.0, "env_s": 0.0, "rounds": 0, "requests": 0}
        self.envs = [env_fn() for _ in range(min(concurrency, len(order)))]
        self.results: dict[int, EpisodeRecord] = {}
        self.episode_of: dict[int, int] = {}
        self.queue = iter(order)
        self.remaining = len(order)
        self.finished: list[int] = []
        for slot in range(len(self.envs)):
            self.start(slot)
        self.active = set(range(len(self.envs)))

    def start(self, slot: int) -> None:
        """Reset the env of ``slot`` for the next episode of the queue (seed ``seed + index``)."""
        index = next(self.queue)
        self.remaining -= 1
        options = self.reset_options(index) if self.reset_options is not None else None
        self.envs[slot].reset(seed=self.seed + index, options=options)
        self.episode_of[slot] = index

    def step_round(self) -> None:
        """One action of every active env: each policy's batch submitted before any is awaited, then stepped."""
        groups: dict[int, list[int]] = defaultdict(list)
        by_id: dict[int, Policy] = {}
        for slot in sorted(self.active):
            env = self.envs[slot]
            policy = policy_for(self.policies, env.agent_selection, env.unwrapped.role(env.agent_selection).name)
            by_id[id(policy)] = policy
            groups[id(policy)].append(slot)
        t_gen = time.perf_counter()
        self.clock["rounds"] += 1
        self.clock["requests"] += len(self.active)
        pending: dict[int, Callable[[], Sequence[str]]] = {}
        for pid, slots in groups.items():
            batch = [self.envs[s].unwrapped.messages(self.envs[s].agent_selection) for s in slots]
            policy = by_id[pid]
            if isinstance(policy, SubmitsBatches):  # an engine: every role's batch starts before any is awaited
                pending[pid] = policy.submit(batch)
            else:
                pending[pid] = _deferred(policy, batch)
        for pid, slots in groups.items():
            t = t_gen or time.perf_counter()  # the first group's wait counts the submissions too
            replies = pending[pid]()
            self.clock["generate_s"] += time.perf_counter() - t
            t_gen = 0.0
            if len(replies) != len(slots):
                raise RuntimeError(f"policy returned {len(replies)} replies for {len(slots)} conversations")
            t_env = time.perf_counter()
            for slot, reply in zip(slots, replies, strict=True):
                self._step(slot, reply)
            self.clock["env_s"] += time.perf_counter() - t_env

    def _step(self, slot: int, reply: Any) -> None:
        """Step the env of ``slot`` with ``reply``; a :class:`Generation`'s tokens (and log-probs) go with the
        action it made, in its ``generation``."""
        env = self.envs[slot]
        actions = env.unwrapped.record.actions
        before = len(actions)
        env.step(reply)
        if isinstance(reply, Generation) and len(actions) > before:
            logprobs = list(reply.logprobs) if reply.logprobs is not None else None
            # a Generation's finish_reason is one of GenerationInfo's FinishReason values ("stop", "length")
            actions[-1].generation = GenerationInfo(list(reply.token_ids), reply.finish_reason, logprobs)  # type: ignore[arg-type]
        if env.terminations[env.agent_selection] or env.truncations[env.agent_selection]:
            self.finished.append(slot)

    def close_finished(self) -> None:
        """Close the episodes that ended this round, only now: a wrapper that scores asynchronously (the coach)
        then waits once for all of them instead of once per episode. Their slots take the next episodes."""
        t_env = time.perf_counter()
        for slot in self.finished:
            env = self.envs[slot]
            while env.agents:  # the dead steps of PettingZoo's AEC protocol
                env.step(None)
            record = env.unwrapped.record
            self.results[self.episode_of[slot]] = record
            if self.on_episode is not None:
                self.on_episode(self.episode_of[slot], record)
            if self.remaining:
                self.start(slot)
            else:
                self.active.discard(slot)
        self.finished.clear()
        self.clock["env_s"] += time.perf_counter() - t_env

    def close(self) -> None:
        for env in self.envs:
            env.close()
