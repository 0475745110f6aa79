"""The held-out comparison's statistics (issue 16): the exact McNemar test against hand-computed binomial tails,
the before/after pairing of ``mappa train``'s evaluations, and the per-role behaviour figures on fixed episodes."""

from __future__ import annotations

import math

import pytest

import mappa_envs
from mappa_envs.metrics import mcnemar_exact, paired_change, role_behaviour


def test_mcnemar_exact_matches_the_binomial_tails():
    # 9 gained, 1 lost: P(X >= 9 | n=10) = 11/1024; two-sided doubles it
    before = [False] * 9 + [True] + [True] * 5 + [False] * 5
    after = [True] * 9 + [False] + [True] * 5 + [False] * 5
    t = mcnemar_exact(before, after)
    assert (t["pairs"], t["gained"], t["lost"]) == (20, 9, 1)
    assert t["p_value_gain"] == pytest.approx(11 / 1024)
    assert t["p_value"] == pytest.approx(22 / 1024)
    # concordant pairs carry no information; no discordant pair: p = 1
    assert mcnemar_exact([True, False], [True, False])["p_value"] == 1.0
    # symmetric change: two-sided p capped at 1
    assert mcnemar_exact([True, False], [False, True])["p_value"] == 1.0
    # a loss is not a gain
    lost = mcnemar_exact(after, before)
    assert lost["p_value"] == t["p_value"] and lost["p_value_gain"] == pytest.approx(1 - 1 / 1024)
    # 6 of 6 discordant pairs gained: 1/64 one-sided, the smallest p six pairs can give
    assert mcnemar_exact([False] * 6, [True] * 6)["p_value_gain"] == pytest.approx(1 / 2**6)
    assert math.isclose(mcnemar_exact([False] * 6, [True] * 6)["p_value"], 2 / 2**6)
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_paired_change_needs_the_same_episodes():
    before = {"task_ids": ["a", "b", "c"], "outcomes": [False, False, True], "accuracy": 1 / 3, "correct": 1}
    after = {"task_ids": ["a", "b", "c"], "outcomes": [True, True, True], "accuracy": 1.0, "correct": 3}
    for e in (before, after):
        e["episodes"] = 3
    p = paired_change(before, after)
    assert (p["gained"], p["lost"], p["p_value_gain"]) == (2, 0, 0.25)
    assert p["ci95_before"][0] < 1 / 3 < p["ci95_before"][1]
    assert paired_change(before, {**after, "task_ids": ["a", "c", "b"]}) is None  # other order: not paired
    assert paired_change({k: v for k, v in before.items() if k != "outcomes"}, after) is None  # an older eval.json


def _episode(solver: str, code: str, verifier: str):
    env = mappa_envs.make(
        "mappa/MathChat-v0", tasks=[{"id": "q", "prompt": "Ava has 6 bags of 7 apples. How many?", "answer": "42"}]
    )
    env.reset(seed=0)
    actions = [solver, code, "It printed 42.", verifier]
    for _ in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else actions.pop(0))
    rec = env.unwrapped.record
    env.close()
    return rec


def test_role_behaviour_on_fixed_episodes():
    right = _episode("6 * 7 = 42. \\boxed{42}", "```python\nprint(6 * 7)\n```", "\\boxed{42}")
    wrong = _episode("\\boxed{answer}", "```python\nprint(6 + 7)\n```", "The answer is 13. \\boxed{13}")
    none = _episode("I do not know.", "No code today.", "No idea.")
    b = role_behaviour([right, wrong, none])
    assert b["problem_solver"]["boxed_rate"] == pytest.approx(1 / 3)  # "answer" is not a numeric answer
    assert b["problem_solver"]["right_answer_rate"] == pytest.approx(1 / 3)
    assert b["verifier"]["boxed_rate"] == pytest.approx(2 / 3)
    assert b["verifier"]["right_answer_rate"] == pytest.approx(1 / 3)
    ce = b["code_executor"]
    assert ce["right_number_rate"] == pytest.approx(1 / 3)  # printed 42 once, 13 once, nothing once
    assert ce["tool_success_rate"] == 1.0 and 0 < ce["code_rate"] < 1


def test_paired_test_counts_problems_not_samples_with_k_samples():
    """k correlated samples of a problem are one pair (the sign test on the problems' means), not k pairs."""
    from mappa_envs.metrics import paired_test

    ids = ["a", "a", "b", "b", "c", "c"]
    before = [False, False, True, False, True, True]
    after = [True, True, True, True, True, False]  # a: 0 -> 1, b: 0.5 -> 1, c: 1 -> 0.5
    t = paired_test(ids, before, after)
    assert (t["unit"], t["pairs"], t["gained"], t["lost"]) == ("problem", 3, 2, 1)
    assert t["p_value_gain"] == pytest.approx(4 / 8)  # P(X >= 2), X ~ Binomial(3, 1/2)
    once = paired_test(["a", "b", "c"], [False, False, True], [True, True, True])
    assert (once["unit"], once["gained"], once["lost"]) == ("episode", 2, 0)
    with pytest.raises(ValueError, match="task ids"):
        paired_test(["a"], [True, False], [True, False])
