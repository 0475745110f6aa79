"""The mappa-bench-v2 CPU track: balanced, disjoint splits; worked examples that favour no operation; a sealed test
split whose every evaluation is logged; rewards labelled by what they see."""

import collections
import json
import re

import pytest

import mappa_envs
from mappa_envs.core import ScriptedPolicy
from mappa_envs.tasks.mathchat import arith2
from mappa_envs.tasks.mathchat.data import load_split

OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _key(task):
    m = task.metadata
    ops, xs = tuple(m["op"].split(",")), m["operands"]
    first = (xs[0] // xs[1], xs[1]) if ops[0] == "div" else (xs[0], xs[1])  # a division: divisor and quotient
    return (ops, tuple(sorted(first)), *xs[2:])


def test_every_split_is_balanced_and_the_answers_are_right():
    for split in arith2.SPLITS:
        tasks = load_split(split)
        by_steps = collections.defaultdict(list)
        for t in tasks:
            by_steps[t.metadata["steps"]].append(t)
            value = t.metadata["operands"][0]
            for op, x in zip(t.metadata["op"].split(","), t.metadata["operands"][1:], strict=True):
                assert op != "div" or value % x == 0, t
                value = {"add": value + x, "sub": value - x, "mul": value * x, "div": value // x}[op]
            assert str(value) == t.answer and value > 0, t
            assert all(str(x) in t.prompt for x in t.metadata["operands"]), t
        for steps, group in by_steps.items():
            ops = collections.Counter(op for t in group for op in t.metadata["op"].split(","))
            assert len(set(ops.values())) == 1 and set(ops) == set(OPS), (split, steps, ops)  # every op as often
            shown = collections.Counter((t.metadata["op"], t.metadata["example"]) for t in group)
            assert len(set(shown.values())) == 1 and len(shown) == 4 * len({t.metadata["op"] for t in group})


def test_splits_are_disjoint_by_computation_and_the_test_splits_by_wording():
    keys = {split: [_key(t) for t in load_split(split)] for split in arith2.SPLITS}
    every = [k for ks in keys.values() for k in ks]
    assert len(every) == len(set(every)) == 96 + 96 + 48 + 48 + 480
    train = load_split("arith2-train")
    for split in arith2.SEALED:
        for t in arith2.load(split):
            assert t.metadata["wording"] == "B"
            assert not any(name in t.prompt for name in arith2.NAMES["A"]), t.prompt
            skeleton = re.sub(r"\d+", "#", t.prompt)
            assert all(re.sub(r"\d+", "#", u.prompt) != skeleton for u in train)
    words_a = {w for t in train for w in re.findall(r"[A-Za-z]+", t.prompt)}
    assert not words_a & set(arith2.NAMES["B"]) and not words_a & set(arith2.ITEMS["B"])


def test_the_worked_example_is_the_tasks_and_uses_numbers_outside_the_range():
    env = mappa_envs.make("mappa/MathChat-v0", split="arith2-dev-2step", prompt_style="small-balanced")
    seen = set()
    for i in range(12 * 4):
        env.reset(options={"task_index": i})
        task = env.unwrapped.task
        msgs = env.unwrapped.messages("code_executor_0")
        example = [m["content"] for m in msgs if m.get("name") == "example"]
        pool = mappa_envs.tasks.mathchat.prompts.BALANCED_TWO_STEP
        assert example[1] == pool[task.metadata["example"]]["code_executor"][0][1]
        seen.add((task.metadata["op"], example[0]))
        numbers = {int(x) for x in re.findall(r"\d+", "".join(example))}
        assert all(n > arith2.OPERAND_RANGE[1] or n in (0, 1) for n in numbers), numbers
    assert len(seen) == 48  # every pair of operations with each of the four examples
    env.close()


def test_a_sealed_split_is_built_only_when_unsealed(tmp_path, monkeypatch):
    from mappa_envs.heldout import heldout_env_kwargs
    from mappa_envs.sealed import SealedSplit, is_sealed, sealed_splits

    assert sealed_splits("mappa/MathChat-v0") == arith2.SEALED
    with pytest.raises(SealedSplit, match=r"sealed test split.*--unseal-test"):
        mappa_envs.make("mappa/MathChat-v0", split="arith2-test-1step")
    env = mappa_envs.make("mappa/MathChat-v0", split="arith2-test-1step", unseal=True)
    assert len(env.unwrapped.tasks) == 96
    env.close()
    train = {"split": "arith2-train", "prompt_style": "small-balanced"}
    assert heldout_env_kwargs("mappa/MathChat-v0", train)["split"] == "arith2-dev-1step"  # never the test split
    asked = heldout_env_kwargs("mappa/MathChat-v0", train, "arith2-test-2step")
    assert "unseal" not in asked and is_sealed("mappa/MathChat-v0", asked)
    assert heldout_env_kwargs("mappa/MathChat-v0", train, "arith2-test-2step", unseal=True)["unseal"] is True
    assert "unseal" not in heldout_env_kwargs("mappa/MathChat-v0", train, "arith2-dev-2step", unseal=True)


def _half_right(conversation):
    """A reply that boxes the right answer to every task of an even index, a wrong one otherwise."""
    text = conversation[-1]["content"]
    for split in ("arith2-dev-1step", "arith2-test-1step"):
        for i, t in enumerate(arith2.load(split)):
            if t.prompt in text:
                return f"\\boxed{{{t.answer if i % 2 == 0 else 0}}}"
    return "\\boxed{0}"


def test_every_evaluation_of_a_sealed_split_is_logged_by_the_code(tmp_path, monkeypatch):
    from baselines.config import TrainConfig
    from baselines.evaluation.heldout_eval import evaluate_heldout
    from mappa_envs.sealed import SealedSplit, read_access_log

    log = tmp_path / "access.jsonl"
    monkeypatch.setenv("MAPPA_TEST_ACCESS_LOG", str(log))
    env_kwargs = {"split": "arith2-train", "prompt_style": "small-balanced", "sandbox": "subprocess"}
    cfg = TrainConfig(env_kwargs=env_kwargs, concurrency=4, out_dir=str(tmp_path / "run"))
    policies = lambda: ScriptedPolicy(_half_right)  # noqa: E731 - one policy plays every role
    with pytest.raises(SealedSplit):
        evaluate_heldout(cfg, policies, "arith2-test-1step", 8)
    assert read_access_log() == []
    dev = evaluate_heldout(cfg, policies, "arith2-dev-1step", 8)
    assert read_access_log() == [] and dev["categories"] == ["add", "sub", "mul", "div"] * 2
    cfg.unseal_test = True
    test = evaluate_heldout(cfg, policies, "arith2-test-1step", 8)
    (line,) = read_access_log()
    assert line["split"] == "arith2-test-1step" and line["episodes"] == 8 == test["episodes"]
    assert line["correct"] == test["correct"] == 4 and line["result_file"] == f"{cfg.out_dir}/eval.json"
    assert line["commit"] and line["time"] and "command" in line
    assert json.loads(log.read_text().splitlines()[0]) == line


def test_rewards_are_labelled_by_what_they_see():
    from baselines.config import TrainConfig, config_record
    from mappa_envs.coach import coach_from_spec
    from mappa_envs.coach.information import information_label, reward_information

    assert information_label(coach_from_spec("rule")) == "final-answer-key"
    assert information_label(coach_from_spec("rule-hindsight")) == "outcome+per-action-answer-key"
    assert information_label(coach_from_spec("rule-hindsight-key")) == "outcome+per-action-answer-key"
    assert information_label(coach_from_spec("rule-hindsight-outcome")) == "outcome+final-answer-key"
    assert information_label(coach_from_spec("mappa_envs.coach:LengthCoach")) == "none"
    assert information_label(object()) == "undeclared"
    assert reward_information(coach_from_spec("rule"), process_reward=False) == reward_information("none") == "outcome"
    record = config_record(TrainConfig(coach="rule-hindsight"))
    assert record["reward_information"] == "outcome+per-action-answer-key" and record["coach"] == "rule-hindsight"
    assert config_record(TrainConfig(estimator="outcome", coach="none"))["reward_information"] == "outcome"
    with pytest.raises(ValueError, match="unknown information"):
        information_label(("the answer",))


def test_the_change_is_printed_per_category():
    from benchmarks.commands.train import _fmt_categories

    cats = ["add", "sub", "add", "sub", "mul"]
    before = {"categories": cats, "outcomes": [True, False, False, True, False]}
    after = {"categories": cats, "outcomes": [True, True, True, False, False]}
    lines = _fmt_categories(before, after)
    assert lines[1].split() == ["add", "1/2", "->", "2/2", "(+1,", "-0)"]
    assert lines[2].split() == ["sub", "1/2", "->", "1/2", "(+1,", "-1)"]
    assert lines[3].split() == ["mul", "0/1", "->", "0/1", "(+0,", "-0)"]
    assert _fmt_categories({**before, "categories": ["add"] * 5}, {**after, "categories": ["add"] * 5}) == []


def test_mappa_eval_of_a_sealed_suite_needs_unsealing_and_is_logged(tmp_path, monkeypatch):
    from baselines.evaluation.evaluate import EvalConfig, evaluate
    from mappa_envs.sealed import SealedSplit, read_access_log

    monkeypatch.setenv("MAPPA_TEST_ACCESS_LOG", str(tmp_path / "access.jsonl"))
    cfg = EvalConfig(suites=("mathchat:arith2-test-1step",), limit=4, sandbox="subprocess", concurrency=4)
    with pytest.raises(SealedSplit):
        evaluate(ScriptedPolicy(_half_right), cfg, log=lambda _: None)
    cfg.unseal_test = True
    result = evaluate(ScriptedPolicy(_half_right), cfg, out_dir=tmp_path / "eval", log=lambda _: None)
    (line,) = read_access_log()
    assert line["split"] == "arith2-test-1step" and line["episodes"] == 4 and line["correct"] == 2
    assert line["result_file"] == str(tmp_path / "eval" / "eval.json") and (tmp_path / "eval" / "eval.json").exists()
    assert result["suites"]["mathchat:arith2-test-1step"]["episodes"] == 4


def test_a_result_file_says_what_the_methods_reward_saw(tmp_path):
    """mappa eval --protocol: the run's reward_information (or, for a run from before the label, its coach and
    estimator's) in the result file's method; the untrained bundled team saw nothing."""
    import argparse

    from benchmarks.commands.evaluate import _information

    args = argparse.Namespace(model=None, role_model=[])
    assert _information(args, {"reward_information": "outcome+final-answer-key"}) == "outcome+final-answer-key"
    assert _information(args, {"coach": "rule-hindsight", "estimator": "reinforce_pp"}) == (
        "outcome+per-action-answer-key"
    )
    assert _information(args, {"coach": "rule", "estimator": "outcome"}) == "outcome"
    assert _information(args, {}) == "none"
    assert _information(argparse.Namespace(model="some/model", role_model=[]), {}) == "undeclared"
