"""The OpenAI-compatible coach over real HTTP (the real ``openai`` client): overlap and failure handling."""

import pytest

from benchmarks.coach_throughput import flaky, overlap

pytestmark = pytest.mark.slow


def test_coach_calls_overlap_with_rollouts():
    blocking, overlapped = overlap(latency=0.3, episodes=8)
    print(f"blocking {blocking:.2f}s, overlapped {overlapped:.2f}s")
    assert overlapped <= 0.4 * blocking


def test_failing_coach_server_loses_nothing():
    counts = flaky(episodes=50, failure_rate=0.3, timeout_s=0.3)
    print(counts)
    assert counts["episodes"] == 50 and counts["missing"] == 0
    assert counts["scored"] + counts["flagged fallback"] == counts["actions"]
    assert counts["coach fallbacks"] == counts["flagged fallback"]
    # failures really happened and were handled: retries for 500s and timeouts, re-prompts for garbage
    assert counts["server http500"] > 0 and counts["server hang"] > 0 and counts["server garbage"] > 0
    assert counts["coach retries"] > 0 and counts["coach reprompts"] > 0
