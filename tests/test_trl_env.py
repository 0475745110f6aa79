"""One MathChat role trained by TRL's GRPOTrainer through mappa_envs.integrations.trl_env: the seat's reward equals
what the same actions give through the PettingZoo API; bad configurations and mismatched rows are refused with the
reason; the ChatML template renders plain conversations as before and tool calls too; and two GRPOTrainer steps of
the bundled SmolLM2-135M on CPU (seat code_executor, the others scripted, weight decay 0) change the code
executor's weights through a non-zero reward signal.

Skipped, with the reason, only where TRL is missing and not under CI (``CI`` set: the module fails)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mappa_envs import make
from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
from mappa_envs.core import ScriptedPolicy
from mappa_envs.integrations.trl_env import (
    chatml_tool_template,
    close_environments,
    completion_text,
    seat_dataset,
    seat_environment,
    seat_reward,
)

try:
    import trl  # noqa: F401

    MISSING = None
except ImportError as e:  # pragma: no cover - depends on the extras installed
    MISSING = f"trl is not installed (pip install 'mappa-envs[trl]'): {e}"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        raise ImportError(f"required under CI: {MISSING}") from e

needs_trl = pytest.mark.skipif(bool(MISSING), reason=str(MISSING))

ENV = "mappa/MathChat-v0"
TASKS = [{"id": f"t{j}", "prompt": f"What is {20 + j} + {3 * j}?", "answer": 20 + 4 * j} for j in range(4)]
KWARGS = {"tasks": TASKS, "prompt_style": "small", "code_executor_turns": 1, "sandbox": "subprocess"}
SOLVER = "Add the two numbers; the code executor computes it."


def others() -> dict[str, ScriptedPolicy]:
    return {
        "problem_solver": ScriptedPolicy([SOLVER]),
        "verifier": ScriptedPolicy(["The code printed it. \\boxed{20}"]),
    }


@pytest.fixture(autouse=True)
def _closed():
    yield
    close_environments()


def pettingzoo_totals(task_index: int, executor_reply: str, coach) -> dict[str, float]:
    """Every agent's summed ``env.rewards`` for the same scripted actions through the PettingZoo API."""
    env = make(ENV, **KWARGS)
    env = CoachRewardWrapper(env, coach, blocking=True) if coach is not None else env
    replies = {
        "problem_solver_0": SOLVER,
        "code_executor_0": executor_reply,
        "verifier_0": "The code printed it. \\boxed{20}",
    }
    env.reset(options={"task_index": task_index})
    totals = dict.fromkeys(env.possible_agents, 0.0)
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else replies[agent])
        for a, r in env.rewards.items():
            totals[a] += r
    env.close()
    return totals


@pytest.mark.parametrize("reward", ["coach", "outcome"])
def test_the_seat_reward_is_what_the_pettingzoo_api_gives_for_the_same_actions(reward):
    coach = RuleBasedCoach() if reward == "coach" else None
    factory = seat_environment(ENV, "code_executor", others=others(), coach=coach, reward=reward, env_kwargs=KWARGS)
    rows = seat_dataset(ENV, "code_executor", env_kwargs=KWARGS)
    assert len(rows) == 4 and rows[0]["prompt"][-1] == {"role": "user", "content": ""}
    replies = [
        "```python\nprint(20 + 0)\n```",
        "no code at all",
        "```python\nprint(22 + 3)\n```",
        "```python\nprint(1/0)\n```",
    ]
    envs = [factory() for _ in rows]
    observations = [env.reset(**row) for env, row in zip(envs, rows, strict=True)]
    assert "What is 21 + 3?" in observations[1] and SOLVER in observations[1]
    metrics = {}
    got = seat_reward([[{"role": "assistant", "content": r}] for r in replies], envs, log_metric=metrics.__setitem__)
    want = [pettingzoo_totals(i, r, coach)["code_executor_0"] for i, r in enumerate(replies)]
    assert got == pytest.approx(want)
    assert len(set(got)) > 1  # the replies differ in what they earn: a signal to train on
    assert metrics["mappa/outcome"] == pytest.approx(sum(e.outcome["success"] for e in envs) / 4)
    assert metrics["mappa/coach_fallbacks"] == 0 and metrics["mappa/seat_skipped"] == 0
    assert [a.agent for a in envs[0].record.actions] == ["problem_solver_0", "code_executor_0", "verifier_0"]
    assert seat_reward(["ignored: already played"], envs[:1]) == got[:1]  # a rollout is played once


def test_bad_configurations_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="needs a coach"):
        seat_environment(ENV, "code_executor", others=others(), env_kwargs=KWARGS)
    with pytest.raises(ValueError, match="would replace the outcome"):
        seat_environment(
            ENV, "code_executor", others=others(), coach=RuleBasedCoach(), reward="outcome", env_kwargs=KWARGS
        )
    with pytest.raises(ValueError, match="choose 'coach' or 'outcome'"):
        seat_environment(ENV, "code_executor", others=others(), reward="score", env_kwargs=KWARGS)
    with pytest.raises(ValueError, match="no role 'coder'"):
        seat_environment(ENV, "coder", others=others(), coach=RuleBasedCoach(), env_kwargs=KWARGS)
    with pytest.raises(ValueError, match=r"no policy for the roles \['verifier'\]"):
        seat_environment(
            ENV,
            "code_executor",
            others={"problem_solver": ScriptedPolicy(["x"])},
            coach=RuleBasedCoach(),
            env_kwargs=KWARGS,
        )
    two_turns = {**KWARGS, "code_executor_turns": 2}
    with pytest.raises(ValueError, match="later_turns=POLICY"):
        seat_environment(ENV, "code_executor", others=others(), coach=RuleBasedCoach(), env_kwargs=two_turns)
    later = ScriptedPolicy(["```python\nprint(0)\n```"])
    factory = seat_environment(
        ENV, "code_executor", others=others(), coach=RuleBasedCoach(), env_kwargs=two_turns, later_turns=later
    )
    env = factory()
    env.reset(task_index=0)
    env._play("```python\nprint(20)\n```")
    assert [a.agent for a in env.record.actions].count("code_executor_0") in (1, 2)
    assert env.record.outcome  # the episode ran to its end


def test_a_row_built_for_another_seat_is_refused_and_completions_are_read_in_every_form():
    factory = seat_environment(ENV, "code_executor", others=others(), coach=RuleBasedCoach(), env_kwargs=KWARGS)
    solver_rows = seat_dataset(ENV, "problem_solver", env_kwargs=KWARGS)
    with pytest.raises(ValueError, match="is not 'code_executor''s input"):
        factory().reset(**solver_rows[0])
    assert completion_text("plain") == "plain"
    assert (
        completion_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
        )
        == "ab"
    )
    assert completion_text([{"role": "assistant", "content": None}]) == ""  # recorded by the env as malformed
    env = factory()
    env.reset(task_index=0)
    env._play(completion_text([{"role": "assistant", "content": None}]))
    assert env.record.actions[1].issues, env.record.actions[1]
    env = factory()
    with pytest.raises(RuntimeError, match="reset"):
        env._play("x")


def _bundled_tokenizer():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from baselines.weights.models import bundled_model_dir

    return AutoTokenizer.from_pretrained(bundled_model_dir())


@needs_trl
def test_the_chatml_template_renders_tool_calls_and_plain_conversations_as_before():
    from trl.chat_template_utils import supports_tool_calling

    tok = _bundled_tokenizer()
    assert not supports_tool_calling(tok)
    rows = seat_dataset(ENV, "code_executor", env_kwargs=KWARGS)
    messages = [*rows[0]["prompt"][:-1], {"role": "user", "content": "What is 2 + 2?"}]
    before = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chatml_tool_template(tok)
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == before
    assert supports_tool_calling(tok)
    tok.chat_template = "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="not a plain ChatML"):
        chatml_tool_template(tok)


@needs_trl
@pytest.mark.slow  # the bundled model's two GRPO steps: minutes on 2 cores, make test's, not make test-fast's
def test_two_grpo_steps_of_the_bundled_model_train_the_seat_on_its_reward(tmp_path, monkeypatch):
    """docs/integrations.md's TRL recipe, run as written: its asserts are the acceptance (a group's rewards differ,
    and with weight decay 0 the weights move, so through the reward's gradient: Adam takes no step on a zero one)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"^```python \{run by tests/test_trl_env.py\}\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    namespace: dict = {"__name__": "docs_integrations_trl"}
    exec(compile(blocks[0], "docs/integrations.md[TRL]", "exec"), namespace)
    logs = namespace["logs"]
    assert len(logs) == 2 and all(0 <= row["reward"] <= 1 for row in logs), logs
    assert all(row["mappa/coach_fallbacks"] == 0 and row["mappa/seat_skipped"] == 0 for row in logs), logs
