"""MathChat-v0 episodes with scripted actions: turn logic, tool feedback, records, malformed actions."""

import base64

import pytest

import mappa_envs
from mappa_envs.core import EpisodeRecord, read_jsonl, write_jsonl

SOLVER = "The product is 6 * 7 = 42, so the answer is \\boxed{42}."
CODE = "```python\nprint(6 * 7)\n```"
VERIFY = "Both agree. \\boxed{42}"


def make_env(**kw):
    return mappa_envs.make(
        "mappa/MathChat-v0", tasks=[{"id": "q", "prompt": "What is 6 times 7?", "answer": "42"}], **kw
    )


def play(env, actions):
    """Step the given actions for live agents, then the dead steps; returns the final rewards seen by last()."""
    actions = list(actions)
    final = {}
    for agent in env.agent_iter():
        _, reward, term, trunc, info = env.last()
        if term or trunc:
            final[agent] = (reward, info)
            env.step(None)
        else:
            env.step(actions.pop(0))
    assert not actions, f"unused actions: {actions}"
    return final


def test_full_episode_correct():
    env = make_env()
    env.reset(seed=0)
    final = play(env, [SOLVER, CODE, "The code printed 42.", VERIFY])
    rec = env.record
    assert [(a.agent, a.turn) for a in rec.actions] == [
        ("problem_solver_0", 1),
        ("code_executor_0", 1),
        ("code_executor_0", 2),
        ("verifier_0", 1),
    ]
    assert rec.outcome == {
        "predicted": "42",
        "answer": "42",
        "correct": True,
        "lenient_correct": True,
        "success": True,
        "score": 1.0,
        "kind": "answer",
    }
    assert all(r == 1.0 for r, _ in final.values()) and set(final) == set(env.possible_agents)
    assert all(info["correct"] is True for _, info in final.values())
    # the outcome is credited to each agent's last action
    assert [a.reward for a in rec.actions] == [1.0, 0.0, 1.0, 1.0]
    call = rec.actions[1].tool_calls[0]
    assert call.result.status == "ok" and call.result.stdout == "42\n"


def test_code_executor_turn_ends_without_code():
    env = make_env()
    env.reset(seed=0)
    play(env, [SOLVER, "I would compute 6*7 = 42 by hand.", VERIFY])
    assert [a.agent for a in env.record.actions] == ["problem_solver_0", "code_executor_0", "verifier_0"]


def test_code_executor_at_most_two_turns():
    env = make_env()
    env.reset(seed=0)
    play(env, [SOLVER, CODE, CODE, VERIFY])
    assert [a.agent for a in env.record.actions].count("code_executor_0") == 2


def test_wrong_and_missing_answers():
    env = make_env()
    env.reset(seed=0)
    final = play(env, [SOLVER, "no code", "\\boxed{41}"])
    assert env.record.outcome["correct"] is False and all(r == 0.0 for r, _ in final.values())
    env.reset(seed=0)
    play(env, [SOLVER, "no code", "I am not sure."])
    assert env.record.outcome["predicted"] is None and env.record.outcome["correct"] is False


def test_observations_carry_full_context():
    env = make_env()
    env.reset(seed=0)
    env.step(SOLVER)
    env.step("```python\nprint(6 * 7)\nprint('to stderr', file=__import__('sys').stderr)\n```")
    msgs = env.messages("code_executor_0")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert "What is 6 times 7?" in msgs[1]["content"] and SOLVER in msgs[1]["content"]
    assert "stdout:\n42" in msgs[3]["content"] and "to stderr" in msgs[3]["content"]
    env.step("It printed 42.")
    verifier_view = env.messages("verifier_0")[1]["content"]
    for piece in (SOLVER, "print(6 * 7)", "stdout:\n42", "It printed 42."):
        assert piece in verifier_view
    obs = env.observe("verifier_0")
    assert env.observation_space("verifier_0").contains(obs)
    env.step(VERIFY)
    # every recorded action has the exact input it was given
    rec = env.record
    assert rec.actions[-1].messages[1]["content"] == verifier_view


def test_tool_errors_are_fed_back():
    env = make_env()
    env.reset(seed=0)
    env.step(SOLVER)
    env.step("```python\nprint(1/0)\n```")
    feedback = env.messages("code_executor_0")[-1]["content"]
    assert "Execution status: error" in feedback and "ZeroDivisionError" in feedback
    assert env.infos["code_executor_0"]["tool_status"] == ["error"]


def test_workspace_persists_across_turns():
    env = make_env()
    env.reset(seed=0)
    env.step(SOLVER)
    env.step("```python\nopen('x.txt', 'w').write('42')\n```")
    env.step("```python\nprint(open('x.txt').read())\n```")
    assert env.record.actions[2].tool_calls[0].result.stdout == "42\n"


MALFORMED = {
    "empty": "",
    "whitespace": "   \n\t ",
    "enormous": "x" * 2_000_000 + "\n```python\nprint(1)\n```",
    "binary junk": bytes(range(256)) * 50,
    "unclosed fence": "Let me compute:\n```python\nprint(6 * 7)\n",
    "control characters": "a\x00b\x1bc\ud800d",
    "not a string": 12345,
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_actions_recorded_and_episode_goes_on(kind):
    env = make_env()
    env.reset(seed=0)
    bad = MALFORMED[kind]
    final = play(env, [SOLVER, bad, *(["ok"] if kind == "enormous" else []), VERIFY])
    rec = env.record
    act = rec.actions[1]
    assert act.agent == "code_executor_0"
    assert rec.outcome["correct"] is True and set(final) == set(env.possible_agents)
    if kind == "binary junk":
        assert base64.b64decode(act.raw_output_b64) == bad  # nothing lost
        assert any("bytes" in i for i in act.issues)
    elif kind == "not a string":
        assert act.output == "12345" and act.issues
    else:
        assert act.output == bad.replace("\r", "\n")  # the full text is kept
    if kind in ("empty", "whitespace"):
        assert "empty action" in act.issues
    if kind == "unclosed fence":
        assert not act.tool_calls and any("unclosed" in i for i in act.issues)
    if kind == "enormous":
        assert act.tool_calls and any("truncated" in i for i in act.issues)
        later = rec.actions[-1].messages[1]["content"]
        assert len(later) < 40_000 and "characters truncated" in later
    # observations stay inside the observation space
    for agent in env.possible_agents:
        assert env.observation_space(agent).contains(env.observe(agent))


def test_records_round_trip_jsonl(tmp_path):
    env = make_env()
    env.reset(seed=3)
    play(env, [SOLVER, bytes([0xFF, 0xFE]) + b"junk", VERIFY])
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [env.record, env.record])
    back = list(read_jsonl(path))
    assert len(back) == 2 and back[0].to_dict() == env.record.to_dict()
    assert isinstance(back[0], EpisodeRecord) and back[0].actions[1].raw_output_b64
    path.write_text('{"not": "a record"}\n')
    with pytest.raises(ValueError, match=":1: not a valid episode record"):
        list(read_jsonl(path))


def test_seeded_task_sampling_and_options():
    env = mappa_envs.make("mappa/MathChat-v0", split="amc-eval-32")
    ids = []
    for _ in range(2):
        env.reset(seed=123)
        ids.append(env.task.id)
    assert ids[0] == ids[1]
    seen = set()
    for s in range(20):
        env.reset(seed=s)
        seen.add(env.task.id)
    assert len(seen) > 5
    env.reset(options={"task_index": 3})
    assert env.task is env.tasks[3]
    env.reset(options={"task_id": env.tasks[5].id})
    assert env.task is env.tasks[5]
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "nope"})


def test_step_before_reset_is_an_error():
    env = make_env()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("hi")


def test_render_ansi_transcript():
    env = make_env(render_mode="ansi")
    env.reset(seed=0)
    play(env, [SOLVER, CODE, "42", VERIFY])
    text = env.render()
    assert "--- code_executor_0 (turn 1) ---" in text and "stdout:" in text and "correct=True" in text


def test_splits_and_leakage():
    from mappa_envs.tasks.mathchat import load_split

    train = {t.prompt for t in load_split("aime-train")}
    assert len(load_split("aime-1983-2024")) == 933
    assert not train & {t.prompt for t in load_split("aime-eval-32")}
    assert not {t.prompt for t in load_split("amc-train")} & {t.prompt for t in load_split("amc-eval-32")}
    a, b = load_split("arith-train"), load_split("arith-eval")
    assert len(a) == 512 and len(b) == 64 and not {t.prompt for t in a} & {t.prompt for t in b}


def test_broken_dataset_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"prompt": "q1", "answer": "1"}, {"prompt": "q2"}]')
    with pytest.raises(ValueError, match=r"row 1 lacks \['answer'\]"):
        mappa_envs.make("mappa/MathChat-v0", data_file=str(bad))
    bad.write_text('{"prompt": "q1", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.json:2"):
        mappa_envs.make("mappa/MathChat-v0", data_file=str(bad))
    with pytest.raises(ValueError, match="unknown MathChat split"):
        mappa_envs.make("mappa/MathChat-v0", split="nope")


@pytest.mark.parametrize("split", ["aime-eval-32", "amc-eval-32", "aime-train", "amc-train", "arith-eval"])
def test_task_ids_are_unique(split):
    env = mappa_envs.make("mappa/MathChat-v0", split=split)
    ids = [t.id for t in env.unwrapped.tasks]
    assert len(set(ids)) == len(ids)
    env.close()


def test_training_pools_hold_no_evaluation_problem_even_typeset_differently():
    import re

    def norm(p):
        return re.sub(r"[^a-z0-9]", "", p.lower())

    for train, held_out in (("aime-train", "aime-eval-32"), ("amc-train", "amc-eval-32")):
        ev = {norm(t.prompt) for t in mappa_envs.make("mappa/MathChat-v0", split=held_out).unwrapped.tasks}
        pool = mappa_envs.make("mappa/MathChat-v0", split=train).unwrapped.tasks
        assert not [t.id for t in pool if norm(t.prompt) in ev]


def test_the_small_model_splits_are_disjoint_by_computation():
    """``arith1-*`` (issue 16): one operation on operands 2-20; held-out and dev problems share no (operation,
    operands) with training or with each other, so a memorised training computation cannot pass for a held-out
    one; answers are what the operation gives."""
    from mappa_envs.tasks.mathchat.data import ONE_OPERATION_RANGE, load_split

    splits = {s: load_split(s) for s in ("arith1-train", "arith1-eval", "arith1-dev")}
    assert [len(v) for v in splits.values()] == [512, 128, 64]
    comp = {s: {(t.metadata["op"], t.metadata["a"], t.metadata["b"]) for t in v} for s, v in splits.items()}
    assert len(comp["arith1-eval"]) == 128 and len(comp["arith1-dev"]) == 64
    assert not comp["arith1-eval"] & comp["arith1-train"] and not comp["arith1-dev"] & comp["arith1-train"]
    assert not comp["arith1-dev"] & comp["arith1-eval"]
    lo, hi = ONE_OPERATION_RANGE
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: b}
    for tasks in splits.values():
        for t in tasks:
            m = t.metadata
            assert lo <= m["a"] <= hi and lo <= m["b"] <= hi and int(t.answer) == ops[m["op"]](m["a"], m["b"]) > 0
            assert str(m["a"]) in t.prompt or str(m["a"] * m["b"]) in t.prompt
    env = mappa_envs.make("mappa/MathChat-v0", split="arith1-train", prompt_style="small")
    solver = env.unwrapped.roles[0]
    assert "\\boxed{82}" in solver.examples[0][1] and "answer}" not in solver.system_prompt + solver.examples[0][0]
    env.reset(seed=0)
    msgs = env.unwrapped.messages(env.agent_selection)  # system, the example's two turns, the task
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert [m.get("name") for m in msgs] == [None, "example", "example", None] and "37" not in msgs[-1]["content"]
    with pytest.raises(ValueError, match="prompt_style"):
        mappa_envs.make("mappa/MathChat-v0", split="arith1-train", prompt_style="tiny")


def test_one_fence_parser_for_tools_metrics_and_the_coach():
    """``fenced_blocks`` is the parser of the python tool, the SQL tool, the code-rate metric and the rule coach's
    copy rule: closed blocks by language (case-insensitive), blank ones dropped, and the block left open."""
    from mappa_envs.core import extract_code_blocks, fenced_blocks
    from mappa_envs.core.text import PYTHON_FENCES

    text = "a\n```Python\nprint(1)\n```\n```sql\nSELECT 1\n```\n```py\n   \n```\n```\nx = 2\n```\n```python\nprint(3"
    assert fenced_blocks(text, *PYTHON_FENCES) == (["print(1)"], "print(3")
    assert fenced_blocks(text, "sql") == (["SELECT 1"], None)
    # untagged fences open blocks too (the coach's copy rule); the sql block is then not code of its language
    assert fenced_blocks(text, *PYTHON_FENCES, untagged=True) == (["print(1)", "x = 2"], "print(3")
    assert extract_code_blocks(text) == (["print(1)"], True)
    assert fenced_blocks("no code here", "python") == ([], None)
    assert fenced_blocks(
        "```python\nprint(1)\n```",
    ) == ([], None)  # no language named: nothing opens


def test_fences_of_every_tool_language_count_and_an_open_one_is_flagged():
    """An action's code is a block in any tool's language (``Tool.languages``): the per-role code rate counts a
    ```sql block as it counts a ```python one, and a block of any language left open is flagged, by language."""
    import mappa_envs.tasks.sql_query  # noqa: F401  (registers the sql tool)
    from mappa_envs.core import ActionRecord, EpisodeRecord, normalize_action, tool_languages
    from mappa_envs.core.text import prose, unclosed_fence
    from mappa_envs.metrics import role_stats

    assert {"python", "sql"} <= set(tool_languages())
    assert unclosed_fence("ok\n```sql\nSELECT 1") == "sql" and unclosed_fence("```sql\nSELECT 1\n```") is None
    assert unclosed_fence("```\nx") == ""
    assert any("unclosed ```sql fence" in i for i in normalize_action("```sql\nSELECT").issues)
    assert not normalize_action("```sql\nSELECT 1\n```").issues
    assert prose("say\n```python\nprint(1)\n```\nthen \\boxed{2}\n```py\ncut") == "say\n\nthen \\boxed{2}\n"
    rec = EpisodeRecord("e", "id", "t", "p", 0)
    for i, out in enumerate(("```sql\nSELECT 1\n```", "```python\nprint(1)\n```", "no code", "```text\nhi\n```")):
        rec.actions.append(ActionRecord(i, "a_0", "a", i + 1, [], out))
    assert role_stats([rec])["a"].code_actions == 2


def test_the_lenient_grade_reads_an_unboxed_final_number_and_the_reward_does_not():
    """The verifier wrote the right number without boxing it: the episode fails (the reward reads only a boxed
    answer) and its outcome's ``lenient_correct`` says the team computed it; a boxed wrong answer is wrong both ways."""
    import mappa_envs

    for last, strict, lenient in [
        ("The code printed 42, so the answer is 42.", False, True),
        ("So the answer is \\boxed{41}, not 42.", False, False),
        ("The answer is 1,042", False, False),
    ]:
        env = mappa_envs.make("mappa/MathChat-v0", tasks=[{"prompt": "What is 6 times 7?", "answer": "42"}])
        env.reset(seed=0)
        for action in ["6 * 7 = 42", "```python\nprint(6 * 7)\n```", "It printed 42.", last]:
            env.step(action)
        assert (env.record.outcome["success"], env.record.outcome["lenient_correct"]) == (strict, lenient), last
        env.close()
