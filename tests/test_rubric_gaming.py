"""The rule-based coach cannot be gamed (issue 16): on fixed actions of a MathChat episode in the small-model prompt
style, code copied from the worked example, code that ignores the problem's numbers, an example's or a placeholder's
``\\boxed{}`` and wrong calculations earn less than honest work, and different actions of a role get different
scores (a role whose scores are constant has zero advantages and does not learn)."""

from __future__ import annotations

import statistics

import pytest

import mappa_envs
from mappa_envs.coach import CoachRewardWrapper, RuleBasedCoach
from mappa_envs.tasks.mathchat import prompts

TASK = [
    {
        "id": "jar",
        "prompt": "A jar holds 14 shells. Ava takes out 12. How many shells are still in the jar?",
        "answer": "2",
    }
]
GOOD_CODE = "```python\nshells = 14\ntaken = 12\nprint(shells - taken)\n```"
EXAMPLE_CODE = "```python\ncows = 37\nbought = 45\nprint(cows + bought)\n```"  # the code executor's worked example
IRRELEVANT_CODE = "```python\nprint(2)\n```"  # prints the right number, from none of the problem's numbers


def scores(solver: str, code: str, verifier: str, *, style: str = "small") -> dict[str, float]:
    env = CoachRewardWrapper(
        mappa_envs.make("mappa/MathChat-v0", tasks=TASK, prompt_style=style), RuleBasedCoach(), blocking=True
    )
    env.reset(seed=0)
    actions = [solver, code, "It printed the answer.", verifier]
    for _agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else actions.pop(0))
    rec = env.unwrapped.record
    env.close()
    return {f"{a.role}{a.turn}": a.coach.score for a in rec.actions}


def test_the_examples_are_outside_the_pool_and_their_code_is_what_the_test_copies():
    from mappa_envs.tasks.mathchat.data import ONE_OPERATION_RANGE, load_split

    lo, hi = ONE_OPERATION_RANGE
    assert prompts.SMALL_EXAMPLES["code_executor"][0][1] == EXAMPLE_CODE  # shown as an earlier chat turn
    assert all(not lo <= int(n) <= hi for n in prompts.SMALL_EXAMPLE_NUMBERS)
    assert all(lo <= t.metadata[k] <= hi for t in load_split("arith1-eval") for k in ("a", "b"))


def test_copied_or_irrelevant_code_earns_nothing_for_running():
    good = scores("14 - 12 = 2. \\boxed{2}", GOOD_CODE, "The code printed 2. \\boxed{2}")
    copied = scores("14 - 12 = 2. \\boxed{2}", EXAMPLE_CODE, "The code printed 82. \\boxed{2}")
    irrelevant = scores("14 - 12 = 2. \\boxed{2}", IRRELEVANT_CODE, "The code printed 2. \\boxed{2}")
    assert good["code_executor1"] == 9  # 5 + 3 ran + 1 printed
    assert copied["code_executor1"] == 3  # 5 - 2: ran, printed, copied: no credit
    assert irrelevant["code_executor1"] == 4  # 5 - 1: ran, printed the right number, from no number of the problem
    # the paper's prompts have no worked example to copy: the same code is judged on the problem's numbers only
    assert scores("\\boxed{2}", EXAMPLE_CODE, "\\boxed{2}", style="paper")["code_executor1"] == 4


@pytest.mark.parametrize(
    ("verifier", "expected"),
    [
        ("The code printed 2, so the answer is \\boxed{2}.", 5 + 1 + 2 + 4),  # boxed, agrees with the code, right
        ("The code printed 82, so the answer is \\boxed{82}.", 5 - 2 - 3),  # the example's answer: no answer
        ("The answer is \\boxed{answer}.", 5 - 2 - 3),  # a placeholder: no answer
        ("The answer is \\boxed{}.", 5 - 2 - 3),
        ("The answer is \\boxed{3}.", 5 + 1 - 1 - 3),  # a real answer, wrong, disagreeing with the code
    ],
)
def test_the_verifiers_copied_or_placeholder_answers_count_as_none(verifier, expected):
    assert scores("\\boxed{2}", GOOD_CODE, verifier)["verifier1"] == max(0, min(10, expected))


def test_the_solvers_scores_vary_with_its_work():
    """The solver acts first (nothing upstream to agree with, no ground truth): its score still separates a right
    calculation from a wrong one, a bare answer, a copied example and no answer."""
    replies = {
        "14 - 12 = 2 shells are left. \\boxed{2}": 5 + 1 + 1,
        "\\boxed{2}": 5 + 1,
        "14 - 12 = 3 shells are left. \\boxed{3}": 5 + 1 - 1,
        "The farm has 37 + 45 = 82 cows. \\boxed{82}": 5 - 2,  # the worked example, copied
        "There are some shells left.": 5 - 2,
    }
    got = {r: scores(r, GOOD_CODE, "\\boxed{2}")["problem_solver1"] for r in replies}
    assert got == replies
    assert statistics.pstdev(got.values()) > 1.0
