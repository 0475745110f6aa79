"""Reward wrappers: the coach's per-action process reward, the outcome-only reward, and a mix of both.

>>> import mappa_envs
>>> from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
>>> env = CoachRewardWrapper(mappa_envs.make("mappa/MathChat-v0", split="arith-eval"), RuleBasedCoach(), blocking=True)
>>> env.reset(seed=0)
>>> env.step("6 * 7 = \\\\boxed{42}")
>>> env.unwrapped.record.actions[0].coach.score
6.0
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pettingzoo.utils import BaseWrapper

from ..core import ActionRecord
from .coaches import Coach
from .hindsight import HindsightCoach
from .protocol import CoachEvaluation, inputs_for_episode


class CoachPool:
    """A bounded pool of coach calls shared by many environments (``max_concurrency`` calls at once)."""

    def __init__(self, coach: Coach, max_concurrency: int = 8):
        self.coach = coach
        self.max_concurrency = max_concurrency
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="coach")
        self._lock = threading.Lock()
        self.submitted = 0

    def submit(self, inp) -> Future:
        with self._lock:
            self.submitted += 1
        return self._executor.submit(self._timed, time.perf_counter(), self.coach.evaluate, inp)

    def submit_episode(self, inputs: list, record: Any) -> Future:
        """A hindsight coach's one call for a finished episode (its evaluations, one per input)."""
        with self._lock:
            self.submitted += 1
        return self._executor.submit(self._timed, time.perf_counter(), self.coach.evaluate_episode, inputs, record)

    @staticmethod
    def _timed(submitted: float, evaluate: Any, *args: Any) -> Any:
        """``evaluate(*args)``, its evaluations stamped with how long the call waited for a free slot (``queue_s``)."""
        waited = time.perf_counter() - submitted
        result = evaluate(*args)
        for ev in result if isinstance(result, list) else [result]:
            ev.queue_s = waited
        return result

    def close(self, cancel: bool = False) -> None:
        """Wait for the calls in flight; ``cancel``: drop those not started yet (an interrupted re-score)."""
        self._executor.shutdown(wait=True, cancel_futures=cancel)


class EpisodePart:
    """The evaluation of action ``i`` out of a hindsight coach's whole-episode call (a future's interface)."""

    def __init__(self, whole: Future, i: int):
        self.whole, self.i = whole, i

    def result(self) -> CoachEvaluation:
        return self.whole.result()[self.i]

    def cancel(self) -> bool:
        return self.whole.cancel()


class _RewardWrapper(BaseWrapper):
    """Shows the wrapper's rewards in place of the env's own (outcome) ones, through PettingZoo's public surface.

    The wrapper keeps its own ``rewards`` (each agent's reward from the last step) and what each agent accumulated
    since it last acted (the reward :meth:`last` returns), following the env's steps the way PettingZoo's ``AECEnv``
    accumulates: a live step of an agent starts its accumulation over and adds every agent's step reward; a dead
    step drops the agent and clears the step rewards. The env's own reward dicts are read, never written
    (``env.unwrapped.rewards`` keeps the env's outcome rewards).
    """

    def __init__(self, env: Any):
        super().__init__(env)
        self.rewards: dict[str, float] = dict(getattr(env, "rewards", None) or {})
        self._returns: dict[str, float] = dict.fromkeys(self.rewards, 0.0)

    @property
    def _cumulative_rewards(self) -> dict[str, float]:
        """The name PettingZoo's ``AECEnv.last`` reads, and the one private name its wrappers forward: a wrapper
        around this one reports this wrapper's accumulated rewards (read-only)."""
        return self._returns

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self.rewards = dict(self.env.rewards)
        self._returns = dict.fromkeys(self.rewards, 0.0)

    def last(self, observe: bool = True):
        agent = self.agent_selection
        observation = self.observe(agent) if observe else None
        return observation, self._returns[agent], self.terminations[agent], self.truncations[agent], self.infos[agent]

    def _env_step(self, action: Any) -> None:
        """The env's step, then this wrapper's rewards follow it (the env's step rewards, to be replaced or not)."""
        agent = self.env.agent_selection
        dead = self.env.terminations[agent] or self.env.truncations[agent]
        self.env.step(action)
        step = dict(self.env.rewards)
        if dead:  # PettingZoo's dead step: the agent leaves, the others keep what they accumulated
            self._returns = {a: self._returns.get(a, 0.0) for a in step}
        else:
            self._returns = {a: (0.0 if a == agent else self._returns.get(a, 0.0)) + r for a, r in step.items()}
        self.rewards = step

    def _take_env_rewards(self) -> None:
        """Take back the env's own rewards of the step just taken (the wrapper gives its own instead)."""
        for a in list(self.rewards):
            self._returns[a] -= self.rewards[a]
            self.rewards[a] = 0.0

    def _give(self, agent: str, reward: float) -> None:
        if agent in self.rewards:
            self.rewards[agent] += reward
            self._returns[agent] += reward


class CoachRewardWrapper(_RewardWrapper):
    """Each action's reward is the coach's score / 10 (optionally mixed with the outcome, see ``alpha``).

    The coach sees the action's role, full input, output, tool feedback, workspace files and who wrote them, and
    the ground truth for the final agent's last action. The whole evaluation (a :class:`CoachEvaluation`) is stored
    in the action's ``coach`` and in ``infos[agent]["coach"]`` (at step time when blocking, at the episode's end
    otherwise).

    ``blocking=True`` scores each action inside ``step`` and gives its reward at once. Otherwise (the default) the
    action is sent to a :class:`CoachPool` and the rollout goes on; the episode's last step waits for what is still
    pending (at the first ``last()`` or dead step after the end, or :meth:`finalize`), attaches every score to the
    trajectory, and gives each agent the sum of its process rewards then.

    A hindsight coach (:class:`~mappa_envs.coach.hindsight.HindsightCoach`, e.g. ``RuleHindsightCoach``) is asked
    once, when the episode ends, for every action's score knowing the outcome (``mappa train --coach
    rule-hindsight``); the rewards are given then, as in the non-blocking mode.
    """

    def __init__(
        self,
        env: Any,
        coach: Coach | HindsightCoach,
        *,
        pool: CoachPool | None = None,
        blocking: bool = False,
        alpha: float = 1.0,
        task_type: str | None = None,
        template: str | None = None,
    ):
        super().__init__(env)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha must be in [0, 1]")
        self.coach = coach
        self.hindsight = isinstance(coach, HindsightCoach)
        """A hindsight coach scores the whole episode in one call when it ends (every action's reward then)."""
        self._episode_inputs: list[tuple[ActionRecord, Any]] = []
        self.blocking = blocking
        self.alpha = alpha
        self._own_pool = pool is None and not blocking
        self.pool = pool if pool is not None else (None if blocking else CoachPool(coach))
        self._task_type = task_type
        self._template = template
        self._pending: list[tuple[ActionRecord, Future]] = []
        self._unfinished_outcome: float | None = None

    # -------------------------------------------------------------------------------------------------
    def _task_meta(self) -> tuple[str, str]:
        env = self.env.unwrapped
        task_type = self._task_type or str(env.task.metadata.get("task_type", env.task_type))
        template = self._template or env.coach_template
        return task_type, template

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self._drain()
        self._pending = []
        self._unfinished_outcome = None
        super().reset(seed=seed, options=options)

    def last(self, observe: bool = True):
        self.finalize()
        return super().last(observe)

    def step(self, action: Any) -> None:
        env = self.env.unwrapped
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self.finalize()
            self._env_step(action)
            return
        before = len(env.record.actions)
        self._env_step(action)
        if len(env.record.actions) == before:
            return
        act = env.record.actions[-1]
        finished = all(env.terminations.values())
        outcome_reward = float(env.rewards.get(agent, 0.0)) if finished else 0.0
        self._take_env_rewards()
        if finished:  # the env credited the outcome to each agent's last action: take it back (re-mixed below)
            for last in {a.agent: a for a in env.record.actions}.values():
                last.reward -= outcome_reward
        task_type, template = self._task_meta()
        env.record.metadata.setdefault("task_type", task_type)  # for bias diagnostics
        inp = inputs_for_episode(
            env.record,
            act,
            task_type=task_type,
            template=template,
            final_agent=env.roles[-1].agent,
            is_final=finished,
            artifacts=env.artifacts_for(env.record) or None,
            tools=env.role(agent).tools,
            answers=env.role(agent).answers,
            guidance=env.role(agent).coach_guidance,
        )
        if self.hindsight:
            self._episode_inputs.append((act, inp))
            if finished:
                self._score_episode(env.record)
        elif self.blocking:
            ev = self.coach.evaluate(inp)
            self._attach(act, ev)
            self._give(agent, act.reward)
            self.env.unwrapped.infos[agent]["coach"] = ev  # the full evaluation (a CoachEvaluation)
        else:
            self._pending.append((act, self.pool.submit(inp)))
        if finished:  # the scores are collected at the next last() or dead step (see finalize)
            self._unfinished_outcome = outcome_reward

    def _score_episode(self, record: Any) -> None:
        """Hindsight: one call for the finished episode; each action's evaluation is collected by ``finalize``."""
        acts, inputs = zip(*self._episode_inputs, strict=True) if self._episode_inputs else ((), ())
        self._episode_inputs = []
        if self.pool is None:  # blocking: score now, give the rewards at once
            for act, ev in zip(acts, self.coach.evaluate_episode(list(inputs), record), strict=True):
                self._attach(act, ev)
                self._give(act.agent, act.reward)
            return
        whole = self.pool.submit_episode(list(inputs), record)
        self._pending.extend((act, EpisodePart(whole, i)) for i, act in enumerate(acts))

    def _attach(self, act: ActionRecord, ev: CoachEvaluation) -> None:
        act.coach = dataclasses.replace(ev)  # the record's own copy: later changes (normalisation) stay on it
        act.reward = self.alpha * ev.reward

    def finalize(self) -> None:
        """Wait for the episode's pending scores and give the rewards (a no-op unless the episode just ended).

        Called by ``last()`` and the dead steps, so the terminal step itself never waits: a rollout over many
        envs can end all of them before the first wait.
        """
        if self._unfinished_outcome is None:
            return
        outcome_reward, self._unfinished_outcome = self._unfinished_outcome, None
        env = self.env.unwrapped
        for act, fut in self._pending:
            ev = fut.result()
            self._attach(act, ev)
            self._give(act.agent, act.reward)
            if act.agent in env.infos:
                env.infos[act.agent]["coach"] = ev
        self._pending = []
        if self.alpha < 1.0:
            share = (1.0 - self.alpha) * outcome_reward
            for agent, act in {a.agent: a for a in env.record.actions}.items():
                act.reward += share
                self._give(agent, share)

    def _drain(self) -> None:
        for _, fut in self._pending:
            fut.cancel()
        self._pending = []
        self._episode_inputs = []

    def close(self) -> None:
        self._drain()
        if self._own_pool and self.pool is not None:
            self.pool.close()
        self.env.close()


class OutcomeRewardWrapper(_RewardWrapper):
    """A single terminal reward from the task outcome (``key`` of the outcome: ``correct``, ``quality``...),
    given to every agent and credited to each agent's last action; every other action gets 0. The ablation
    baseline against the coach's process rewards."""

    def __init__(self, env: Any, key: str | None = None):
        super().__init__(env)
        self.key = key

    def step(self, action: Any) -> None:
        env = self.env.unwrapped
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._env_step(action)
            return
        self._env_step(action)
        if not all(env.terminations.values()) or self.key is None:
            return  # the env's own reward already is the outcome
        self._take_env_rewards()
        value = float(env.record.outcome[self.key])
        last = {a.agent: a for a in env.record.actions}
        for a in env.record.actions:
            a.reward = 0.0
        for agent_id, act in last.items():
            act.reward = value
            self._give(agent_id, value)


class MixedRewardWrapper(CoachRewardWrapper):
    """``alpha`` x process reward (each action) + ``(1 - alpha)`` x outcome (each agent's last action)."""

    def __init__(self, env: Any, coach: Coach, alpha: float = 0.5, **kwargs: Any):
        super().__init__(env, coach, alpha=alpha, **kwargs)
