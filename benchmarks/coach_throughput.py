"""Coach throughput: scoring overlapped with rollouts versus blocking calls, and resilience to a failing server.

    python -m benchmarks.coach_throughput [--latency 1.0] [--episodes 8] [--flaky-episodes 50]

Part 1 runs ``--episodes`` MathChat episodes at once (scripted agents, so the coach is the only cost) against a
local OpenAI-compatible coach server that answers every call after ``--latency`` seconds, first with blocking coach
calls, then with calls sent to a shared pool while the rollout goes on, and prints both wall times.
Part 2 runs ``--flaky-episodes`` episodes against a server that fails 30% of calls (HTTP 500, replies slower than
the client's timeout, replies without a score) and prints how every action ended: scored, or flagged fallback, with
the counts of retries, re-prompts and fallbacks.
"""

from __future__ import annotations

import argparse
import time

import mappa_envs
from baselines import ScriptedPolicy, run_episodes
from benchmarks.flaky_coach_server import FlakyCoachServer
from mappa_envs.coach import CoachPool, CoachRewardWrapper, LLMCoach, OpenAIChatBackend

REPLIES = {
    "problem_solver": ScriptedPolicy(["Adding up: \\boxed{12}"]),
    "code_executor": ScriptedPolicy(["```python\nprint(5 + 7)\n```", "It printed 12."]),
    "verifier": ScriptedPolicy(["The code agrees: \\boxed{12}"]),
}


def coach_for(server: FlakyCoachServer, timeout_s: float, retries: int = 3) -> LLMCoach:
    backend = OpenAIChatBackend("local-coach", base_url=server.url, timeout_s=timeout_s, max_tokens=64)
    return LLMCoach(backend, max_retries=retries, backoff_s=0.05, max_backoff_s=0.5)


def rollout(coach, episodes: int, blocking: bool, concurrency: int) -> tuple[float, list]:
    pool = None if blocking else CoachPool(coach, max_concurrency=concurrency)

    def env_fn():
        env = mappa_envs.make("mappa/MathChat-v0", split="arith-eval")
        return CoachRewardWrapper(env, coach, blocking=blocking, pool=pool)

    t = time.perf_counter()
    records = run_episodes(env_fn, REPLIES, episodes, seed=0, concurrency=concurrency)
    elapsed = time.perf_counter() - t
    if pool is not None:
        pool.close()
    return elapsed, records


def overlap(latency: float, episodes: int) -> tuple[float, float]:
    server = FlakyCoachServer(latency_s=latency)
    try:
        blocking, _ = rollout(coach_for(server, timeout_s=latency + 10), episodes, True, episodes)
        overlapped, records = rollout(coach_for(server, timeout_s=latency + 10), episodes, False, episodes)
    finally:
        server.close()
    assert all(a.coach is not None for r in records for a in r.actions)
    return blocking, overlapped


def flaky(episodes: int, failure_rate: float = 0.3, timeout_s: float = 0.5) -> dict[str, int]:
    server = FlakyCoachServer(failure_rate=failure_rate, hang_s=timeout_s + 1.0, seed=1)
    try:
        coach = coach_for(server, timeout_s=timeout_s, retries=2)
        _, records = rollout(coach, episodes, False, 8)
    finally:
        server.close()
    actions = [a for r in records for a in r.actions]
    evs = [a.coach for a in actions]
    return {
        "episodes": len(records),
        "actions": len(actions),
        "scored": sum(1 for e in evs if e and not e.fallback_used),
        "flagged fallback": sum(1 for e in evs if e and e.fallback_used),
        "missing": sum(1 for e in evs if e is None),
        **{f"server {k}": v for k, v in sorted(server.outcomes.items())},
        **{f"coach {k}": v for k, v in coach.stats.counts.items()},
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--flaky-episodes", type=int, default=50)
    args = ap.parse_args(argv)
    blocking, overlapped = overlap(args.latency, args.episodes)
    print(f"coach latency {args.latency:g} s, {args.episodes} episodes in flight:")
    print(f"  blocking coach calls   {blocking:7.2f} s")
    print(f"  overlapped (pool of {args.episodes}) {overlapped:7.2f} s   ratio {overlapped / blocking:.0%}")
    counts = flaky(args.flaky_episodes)
    print(f"flaky coach server (30% failures), {args.flaky_episodes} episodes:")
    for k, v in counts.items():
        print(f"  {k:<22}{v:>6}")


if __name__ == "__main__":
    main()
