"""Answer extraction and grading for math tasks.

``math_equal(prediction, answer)`` decides whether a model's answer matches the ground truth. It first tries an
exact rational comparison (robust to ``"060"`` vs ``60`` vs ``60.0``, ``\\frac{3}{4}`` vs ``0.75``, ``$...$``,
``\\text{...}``, thousands separators, ``x = 60``) and falls back to Hugging Face's ``math-verify`` for symbolic
answers (radicals, pi, intervals, ...).

>>> math_equal(r"So the answer is $\\boxed{060}$.", 60)
True
>>> math_equal("61", "060")
False
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}$")
_FRAC_SHORT = re.compile(r"^(-?)\\[dt]?frac(\d)(\d)$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_RATIO = re.compile(r"^([+-]?\d+)\s*/\s*([+-]?\d+)$")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent."""
    last = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            last = text[m.end() : i - 1]
    return last


def _strip_latex(s: str) -> str:
    s = s.strip()
    for _ in range(3):
        s = _TEXT_CMD.sub(r"\1", s)
    for token in (
        "$",
        "\\(",
        "\\)",
        "\\[",
        "\\]",
        "\\displaystyle",
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "~",
    ):
        s = s.replace(token, "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    if "=" in s:  # "x = 60", "m+n=18"
        s = s.rsplit("=", 1)[1].strip()
    s = _THOUSANDS.sub("", s)
    s = s.replace(" ", "")
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    return s


def to_number(value: Any) -> Fraction | None:
    """Parse a plain numeric answer (int, decimal, fraction, LaTeX fraction) exactly; None if not numeric."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value).limit_denominator(10**9) if value == value and abs(value) != float("inf") else None
    if not isinstance(value, str):
        return None
    s = _strip_latex(value)
    if not s:
        return None
    try:
        if _NUMBER.match(s):
            return Fraction(s)
        if m := _RATIO.match(s):
            return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
        if m := _FRAC.match(s) or _FRAC_SHORT.match(s):
            num, den = Fraction(m.group(2)), Fraction(m.group(3))
            if den == 0:
                return None
            return -num / den if m.group(1) else num / den
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _math_verify_equal(prediction: str, answer: str) -> bool:
    """Symbolic comparison with math-verify; its signal-based timeout only works in the main thread."""
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    try:
        gold = parse(f"${answer}$", parsing_timeout=timeout)
        pred = parse(prediction, parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:
        return False


def math_equal(prediction: str | None, answer: Any) -> bool:
    """Whether ``prediction`` (a model's answer, possibly in prose or LaTeX) equals ``answer``.

    The last ``\\boxed{}`` of the prediction is used when present. Numbers are compared exactly as rationals
    (floats within a relative 1e-9); anything else goes to math-verify.
    """
    if prediction is None:
        return False
    if not isinstance(prediction, str):
        prediction = str(prediction)
    boxed = extract_boxed(prediction)
    candidate = boxed if boxed is not None else prediction
    gold = to_number(answer)
    pred = to_number(candidate)
    if gold is not None and pred is not None:
        return abs(pred - gold) <= Fraction(1, 10**9) * max(1, abs(gold))
    if gold is not None and boxed is not None:
        # A boxed answer that is not a plain number may still be a numeric expression (\sqrt{4}, 2^{5}).
        return _math_verify_equal(f"\\boxed{{{boxed}}}", _answer_latex(answer))
    return _math_verify_equal(prediction if boxed is None else f"\\boxed{{{boxed}}}", _answer_latex(answer))


def _answer_latex(answer: Any) -> str:
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer)


def extract_answer(text: str) -> str | None:
    """The answer a final agent gave: the content of its last ``\\boxed{}``, or None."""
    boxed = extract_boxed(text)
    return boxed.strip() if boxed is not None else None


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer_lenient(text: str) -> str | None:
    """The answer a lenient grader reads: the last ``\\boxed{}`` when there is one, else the text's last number
    (``"so she has 12 apples."`` -> ``"12"``; thousands separators dropped), or None. It tells computing the answer
    apart from boxing it: the strict grade (:func:`extract_answer`) credits only a boxed answer.

    >>> extract_answer_lenient("The code printed 42, so 6 * 7 = 42."), extract_answer_lenient("\\\\boxed{7} or 8")
    ('42', '7')
    """
    boxed = extract_answer(text)
    if boxed is not None:
        return boxed
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


__all__ = ["extract_answer", "extract_answer_lenient", "extract_boxed", "math_equal", "to_number"]
