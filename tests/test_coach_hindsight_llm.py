"""The LLM hindsight coach (issue 20): one call per finished episode, one `PROCESS_SCORE[i]` per action, with the
per-action coach's rules per index (re-prompt, lenient reading, flagged fallback), through `mappa rescore`."""

import threading

import pytest

from mappa_envs.coach import CoachCache, LLMHindsightCoach, coach_from_spec, rescore
from mappa_envs.core import read_jsonl


class _Scripted:
    """A chat backend replying from a list (an exception in the list is raised), recording every request."""

    name = "scripted"

    def __init__(self, replies):
        self.replies, self.requests, self.lock = list(replies), [], threading.Lock()

    def complete(self, messages):
        with self.lock:
            self.requests.append(messages)
            reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        return reply


def _episode(stored_episodes, tmp_path):
    from mappa_envs.coach.rescore import _EnvMeta

    (record,) = stored_episodes(tmp_path / "one.jsonl", n=1)
    return _EnvMeta({}).inputs(record), record


def test_every_action_scored_from_one_call(stored_episodes, tmp_path):
    inputs, record = _episode(stored_episodes, tmp_path)
    n = len(inputs)
    reply = "The code printed the answer.\n" + "\n".join(f"PROCESS_SCORE[{i}]: {i + 5}" for i in range(n))
    backend = _Scripted([reply])
    evals = LLMHindsightCoach(backend).evaluate_episode(inputs, record)
    assert [e.score for e in evals] == [float(i + 5) for i in range(n)]
    assert all(e.parse == "strict" and not e.fallback_used and e.backend == "hindsight:scripted" for e in evals)
    (messages,) = backend.requests  # one call for the whole episode
    prompt = messages[1]["content"]
    assert "PROCESS_SCORE[i]" in prompt and f"from 0 to {n - 1}" in prompt
    assert all(f"## Action {i}:" in prompt for i in range(n)) and "the right answer:" in prompt
    assert "print(" in prompt  # the code executor's output, with its tool feedback
    assert "PROCESS_SCORE[<index>]" in messages[0]["content"]


def test_missing_indices_reprompted_then_read_leniently_then_flagged_per_action(stored_episodes, tmp_path):
    inputs, record = _episode(stored_episodes, tmp_path)
    assert len(inputs) >= 3
    # index 0 strict; index 1 only in the re-prompt's reply; index 2 written another way; the rest nowhere
    # ("3) 7" in the first reply's reasoning is a list item, not read as a score)
    first = "1) ok\n3) 7\nPROCESS_SCORE[0]: 9\nPROCESS_SCORE[99]: 1"
    backend = _Scripted([first, "PROCESS_SCORE[1]: 6\nAction 2: 4/10"])
    coach = LLMHindsightCoach(backend)
    evals = coach.evaluate_episode(inputs, record)
    assert [(e.score, e.parse) for e in evals[:3]] == [(9.0, "strict"), (6.0, "reprompt"), (4.0, "lenient")]
    for e in evals[3:]:
        assert e.fallback_used and e.parse == "fallback" and e.score == 5.0
        assert "no score for this action" in e.fallback_reason
    assert not any(e.fallback_used for e in evals[:3]) and all(e.reprompted for e in evals)
    assert "action(s) 1, 2" in backend.requests[1][-1]["content"]  # the re-prompt names the indices it lacks
    counts = coach.stats.counts
    assert counts["calls"] == 1 and counts["reprompts"] == 1 and counts["lenient"] == 1
    assert counts["fallbacks"] == len(evals) - 3


def test_an_unreachable_coach_flags_every_action_and_a_cache_saves_the_second_call(stored_episodes, tmp_path):
    inputs, record = _episode(stored_episodes, tmp_path)
    down = LLMHindsightCoach(_Scripted([ConnectionError("refused")]), max_retries=1, backoff_s=0.0)
    evals = down.evaluate_episode(inputs, record)
    assert all(e.fallback_used and "unreachable after 1 retries" in e.fallback_reason for e in evals)
    assert down.stats.counts["retries"] == 1
    backend = _Scripted(["\n".join(f"PROCESS_SCORE[{i}]: 7" for i in range(len(inputs)))])
    cache = CoachCache(str(tmp_path / "cache.jsonl"))
    first = LLMHindsightCoach(backend, cache=cache).evaluate_episode(inputs, record)
    again = LLMHindsightCoach(backend, cache=CoachCache(str(tmp_path / "cache.jsonl")))
    assert [e.score for e in again.evaluate_episode(inputs, record)] == [e.score for e in first]
    assert len(backend.requests) == 1 and again.stats.counts["cache_hits"] == len(inputs)


def test_rescore_with_an_llm_hindsight_coach_asks_once_per_episode(stored_episodes, tmp_path):
    records = stored_episodes(tmp_path / "episodes.jsonl", n=4)
    n = max(len(r.actions) for r in records)
    backend = _Scripted(["\n".join(f"PROCESS_SCORE[{i}]: 8" for i in range(n))])
    stats = rescore(tmp_path / "episodes.jsonl", LLMHindsightCoach(backend), tmp_path / "out", log=lambda _: None)
    assert len(backend.requests) == 4 == stats.requests and stats.calls == sum(len(r.actions) for r in records)
    for rec in read_jsonl(tmp_path / "out" / "trajectories.jsonl"):
        assert all(a.info["rescored"]["score"] == 8.0 and a.coach is not None for a in rec.actions)
    again = rescore(tmp_path / "episodes.jsonl", LLMHindsightCoach(backend), tmp_path / "out", log=lambda _: None)
    assert len(backend.requests) == 4 and again.calls == 0  # all re-used


def test_llm_coach_specs():
    pytest.importorskip("openai")
    coach = coach_from_spec("llm-hindsight:smol@http://127.0.0.1:9/v1")
    assert isinstance(coach, LLMHindsightCoach) and coach.name == "hindsight:openai:smol@http://127.0.0.1:9/v1"
    assert coach_from_spec("llm:smol@http://127.0.0.1:9/v1").name == "openai:smol@http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match="needs a model name"):
        coach_from_spec("llm:@http://x")
