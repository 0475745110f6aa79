"""Environment overhead per step with a scripted policy, without and with code execution.

    python -m benchmarks.env_overhead [--episodes 200]

Prints the median and p95 time of one ``env.step`` (and of building the next agent's messages), for text-only
actions and for actions whose code block runs in the subprocess sandbox, beside a bare ``python -c`` start.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import mappa_envs


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def time_steps(episodes: int, with_code: bool) -> tuple[list[float], list[float]]:
    env = mappa_envs.make("mappa/MathChat-v0", split="arith-eval")
    code = "```python\nprint(6 * 7)\n```" if with_code else "I will not run code."
    replies = {"problem_solver_0": "6 * 7 = \\boxed{42}", "code_executor_0": code, "verifier_0": "\\boxed{42}"}
    steps, obs = [], []
    for ep in range(episodes):
        env.reset(seed=ep)
        for agent in env.agent_iter():
            t = time.perf_counter()
            env.unwrapped.messages(agent)
            obs.append(time.perf_counter() - t)
            if env.terminations[agent]:
                env.step(None)
                continue
            t = time.perf_counter()
            env.step(replies[agent])
            steps.append(time.perf_counter() - t)
    env.close()
    return steps, obs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    args = ap.parse_args(argv)
    bare = []
    for _ in range(20):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-c", "print(1)"], capture_output=True, check=True)
        bare.append(time.perf_counter() - t)

    def row(label: str, xs: list[float]) -> None:
        print(f"{label:<44}{statistics.median(xs) * 1e3:>10.3f}{_pct(xs, 0.95) * 1e3:>10.3f}{len(xs):>8}")

    print(f"{'what':<44}{'p50 ms':>10}{'p95 ms':>10}{'n':>8}")
    steps, obs = time_steps(args.episodes, with_code=False)
    row("step, text-only actions", steps)
    row("messages(agent)", obs)
    steps, _ = time_steps(max(10, args.episodes // 10), with_code=True)
    row("step, code executed (subprocess sandbox)", steps)
    row("reference: bare `python -I -c print(1)`", bare)


if __name__ == "__main__":
    main()
