"""The single-agent Gymnasium view of one role (the others played by given policies)."""

import warnings

import pytest
from gymnasium.utils.env_checker import check_env

import mappa_envs
from baselines.weights.policies import ScriptedPolicy
from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
from mappa_envs.core.single_agent import SingleAgentView


def _view(**kw):
    env = mappa_envs.make("mappa/MathChat-v0", split="arith-eval")
    return SingleAgentView(env, "code_executor", others=ScriptedPolicy(lambda conv: "The answer is \\boxed{42}"), **kw)


def test_check_env_passes_on_the_code_executor_view():
    env = _view()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not a numpy array": text spaces by design
        check_env(env, skip_render_check=True)
    env.close()


def test_an_episode_through_the_view_gets_the_outcome():
    env = _view()
    obs, info = env.reset(seed=0)
    assert info["role"] == "code_executor" and "Problem solver" in obs
    task = env.env.unwrapped.task
    obs, reward, terminated, truncated, info = env.step(f"```python\nprint({task.answer})\n```")
    assert not terminated and "Execution status: ok" in obs  # its second turn, with its own tool feedback
    obs, reward, terminated, truncated, info = env.step(f"The answer is {task.answer}.")
    assert terminated and not truncated
    assert reward == float(info["outcome"]["correct"])  # the verifier's scripted answer decides
    with pytest.raises(RuntimeError, match="reset"):
        env.step("more")
    env.close()


def test_coach_rewards_reach_the_single_agent():
    env = mappa_envs.make("mappa/MathChat-v0", tasks=[{"id": "q", "prompt": "What is 6 times 7?", "answer": "42"}])
    coached = CoachRewardWrapper(env, RuleBasedCoach(), blocking=True)
    view = SingleAgentView(coached, "code_executor", others=ScriptedPolicy(["\\boxed{42}"]))
    view.reset(seed=1)
    _, reward, _, _, _ = view.step("```python\nprint(6 * 7)\n```")
    assert reward == pytest.approx(0.9)  # rule coach: 5 + 3 (ran) + 1 (printed) = 9 -> 0.9
    view.reset(seed=1)
    _, reward, _, _, _ = view.step("```python\nprint(1)\n```")
    assert reward == pytest.approx(0.4)  # code using none of the problem's numbers: 5 - 1, no credit for running
    view.close()


def test_unknown_role():
    with pytest.raises(KeyError, match="coder"):
        SingleAgentView(mappa_envs.make("mappa/MathChat-v0"), "coder", others=ScriptedPolicy(["x"]))
