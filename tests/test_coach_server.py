"""The OpenAI-compatible coach over real HTTP (the real ``openai`` client): overlap and failure handling."""

import time

import pytest

from benchmarks.coach_throughput import coach_for, flaky

pytestmark = pytest.mark.slow


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


def _play(coach, blocking: bool):
    """One MathChat episode of scripted replies, stepped without ``last()`` (which waits for the scores once the
    episode has ended): the wrapper, and the number of steps taken."""
    import mappa_envs
    from mappa_envs.coach import CoachRewardWrapper

    replies = {
        "problem_solver": iter(["Adding up: \\boxed{12}"]),
        "code_executor": iter(["```python\nprint(5 + 7)\n```", "It printed 12."]),
        "verifier": iter(["The code agrees: \\boxed{12}"]),
    }
    env = CoachRewardWrapper(mappa_envs.make("mappa/MathChat-v0", split="arith-eval"), coach, blocking=blocking)
    env.reset(seed=0)
    steps = 0
    for agent in env.agent_iter():
        if env.terminations[agent] or env.truncations[agent]:
            break
        env.step(next(replies[agent.rsplit("_", 1)[0]]))  # agent ids are role_N
        steps += 1
    return env, steps


def test_coach_calls_overlap_with_rollouts():
    """With the coach's pool (the default), an episode's steps go on while its actions' calls wait at the server: a
    server holding every reply sees all of the episode's calls in flight at once, before it has answered any, and
    their scores reach the records once it answers. Blocking calls go one at a time. (The wall-time gain is a
    benchmark: ``mappa bench``'s coach section.)"""
    from benchmarks.flaky_coach_server import FlakyCoachServer

    server = FlakyCoachServer()
    try:
        server.hold()
        env, steps = _play(coach_for(server, timeout_s=120), blocking=False)
        actions = env.unwrapped.record.actions
        _wait_for(lambda: server.in_flight == len(actions), f"{len(actions)} calls in flight")
        assert steps == len(actions) == 4 and all(a.coach is None for a in actions) and server.outcomes.total() == 0
        server.release()
        env.finalize()
        assert all(a.coach is not None and not a.coach.fallback_used for a in actions)
        assert server.max_in_flight == 4
        env.close()

        server.max_in_flight = 0
        env, steps = _play(coach_for(server, timeout_s=120), blocking=True)
        assert steps == 4 and all(a.coach is not None for a in env.unwrapped.record.actions)
        assert server.max_in_flight == 1
        env.close()
    finally:
        server.close()


def test_failing_coach_server_loses_nothing():
    counts = flaky(episodes=50, failure_rate=0.3, timeout_s=0.3)
    print(counts)
    assert counts["episodes"] == 50 and counts["missing"] == 0
    assert counts["scored"] + counts["flagged fallback"] == counts["actions"]
    assert counts["coach fallbacks"] == counts["flagged fallback"]
    # failures really happened and were handled: retries for 500s and timeouts, re-prompts for garbage
    assert counts["server http500"] > 0 and counts["server hang"] > 0 and counts["server garbage"] > 0
    assert counts["coach retries"] > 0 and counts["coach reprompts"] > 0
