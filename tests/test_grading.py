"""math_equal judges every answer of the bundled evaluation sets, written in many ways."""

import pytest

from mappa_envs.grading import extract_answer, extract_boxed, math_equal, to_number
from mappa_envs.tasks.mathchat import load_split

EVAL_TASKS = [t for split in ("aime-eval-32", "amc-eval-32") for t in load_split(split)]


def spellings(v: int) -> dict[str, str]:
    return {
        "plain": str(v),
        "zero-padded": f"{v:04d}" if v >= 0 else f"-{abs(v):03d}",
        "float": f"{v}.0",
        "float-2": f"{v}.00",
        "boxed in prose": f"Putting it together, the final answer is $\\boxed{{{v}}}$. Done.",
        "latex inline": f"\\({v}\\)",
        "latex text": f"$\\text{{{v}}}$",
        "latex frac": f"\\dfrac{{{2 * v}}}{{2}}",
        "assignment": f"m + n = {v}",
        "boxed float": f"\\boxed{{{v}.0}}",
    }


@pytest.mark.parametrize("task", EVAL_TASKS, ids=[t.id for t in EVAL_TASKS])
def test_every_eval_answer_in_every_spelling(task):
    v = int(to_number(task.answer))  # "023", 18.0 and "336^\\circ" all occur
    for name, text in spellings(v).items():
        assert math_equal(text, task.answer), f"{name}: {text!r} should equal {task.answer!r}"
    for wrong in (
        str(v + 1),
        f"\\boxed{{{v - 1}}}",
        f"{v}.5",
        "",
        "I could not solve it",
        f"\\boxed{{{v + 10}}}",
    ):
        assert not math_equal(wrong, task.answer), f"{wrong!r} should not equal {task.answer!r}"


def test_answers_of_both_types_are_covered():
    types = {type(t.answer) for t in EVAL_TASKS}
    assert types == {str, float}  # AIME answers are zero-padded strings, AMC answers floats


@pytest.mark.parametrize(
    ("pred", "answer", "expected"),
    [
        ("\\frac{3}{4}", "0.75", True),
        ("3/4", 0.75, True),
        ("1,000", 1000, True),
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", True),
        ("\\boxed{\\sqrt{3}}", "2\\sqrt{3}", False),
        ("\\boxed{\\sqrt{4}}", 2, True),
        ("45^\\circ", 45, True),
        (None, 5, False),
        ("\\boxed{1/0}", 5, False),
        ("The answer is 61", 60, False),
    ],
)
def test_math_equal_cases(pred, answer, expected):
    assert math_equal(pred, answer) is expected


def test_last_boxed_with_nested_braces():
    text = "first \\boxed{1} then \\boxed{\\frac{1}{2}} and an unclosed \\boxed{3"
    assert extract_boxed(text) == "\\frac{1}{2}"
    assert extract_answer("no box here") is None


def test_to_number_rejects_non_numbers():
    assert to_number("abc") is None
    assert to_number(True) is None
    assert to_number(float("nan")) is None
    assert to_number("060") == 60
