"""Text handling shared by every pipeline: action normalisation, code-block parsing, truncation, spaces.

Agent outputs are untrusted: they may be empty, enormous, binary, or carry an unclosed code fence. Nothing here
raises on such input; every anomaly becomes a short *issue* string that the environment records with the action.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np
from gymnasium.spaces import Text

from sandboxes import ExecResult

# Fences: a line of ``` and a language name (case-insensitive) opens a block, a line of ``` closes it.
PYTHON_FENCES = ("python", "python3", "py")
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[ \t]*$", re.MULTILINE)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)


@dataclass
class ParsedAction:
    """An agent's action after normalisation."""

    text: str
    """The action as text (bytes decoded as UTF-8 with replacement; CR/LF normalised)."""
    code_blocks: list[str] = field(default_factory=list)
    """Closed ```python blocks, in order."""
    issues: list[str] = field(default_factory=list)
    """Anomalies found (empty action, binary input, unclosed fence, ...)."""
    raw_b64: str | None = None
    """The original bytes, base64-encoded, when the action was not a ``str`` (so nothing is lost)."""

    @property
    def has_code(self) -> bool:
        return bool(self.code_blocks)


def normalize_action(action: object) -> ParsedAction:
    """Turn whatever an agent produced into text plus a list of issues; never raises."""
    issues: list[str] = []
    raw_b64 = None
    if action is None:
        text = ""
        issues.append("action was None")
    elif isinstance(action, str):
        text = action
    elif isinstance(action, bytes | bytearray | memoryview):
        raw = bytes(action)
        raw_b64 = base64.b64encode(raw).decode("ascii")
        text = raw.decode("utf-8", errors="replace")
        issues.append(f"action was {len(raw)} bytes, decoded as UTF-8 with replacement")
    else:
        text = str(action)
        issues.append(f"action was a {type(action).__name__}, converted with str()")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x00" in text:
        issues.append("action contains NUL bytes")
    if any(ch == "\ufffd" for ch in text[:100_000]) and raw_b64 is None:
        issues.append("action contains U+FFFD replacement characters")
    if not text.strip():
        issues.append("empty action")
    left_open = unclosed_fence(text)
    if left_open is not None:
        issues.append(f"unclosed ```{left_open} fence: no tool runs that block")
    return ParsedAction(text=text, code_blocks=extract_code_blocks(text)[0], issues=issues, raw_b64=raw_b64)


def fenced_blocks(text: str, *languages: str, untagged: bool = False) -> tuple[list[str], str | None]:
    """The one fence parser of every tool, metric and coach: the non-blank bodies of the closed blocks of ``text``
    whose opening ```` ``` ```` line names one of ``languages`` (case-insensitive; ``untagged``: or no language),
    in order, and the body of such a block left open at the end (None when there is none). A block of another
    language is skipped whole, as Markdown reads it: its closing fence opens nothing."""
    wanted = {x.lower() for x in languages} | ({""} if untagged else set())
    blocks, left_open = [], None
    for language, body, closed in _fences(text):
        if language in wanted and not closed:
            left_open = body
        elif language in wanted and body.strip():
            blocks.append(body)
    return blocks, left_open


def _fences(text: str) -> list[tuple[str, str, bool]]:
    """Every fenced block of ``text``: (its language, lower-case, "" when untagged; its body; whether it closed)."""
    out = []
    pos = 0
    while m := _FENCE_OPEN.search(text, pos):
        start = m.end() + 1  # the body starts on the line after the fence
        close = _FENCE_CLOSE.search(text, m.end())
        end = close.start() if close else len(text)
        out.append((m.group(1).lower(), text[start:end].strip("\n"), close is not None))
        if close is None:
            break
        pos = close.end()
    return out


def unclosed_fence(text: str) -> str | None:
    """The language of a fenced block ``text`` leaves open at its end ("" when untagged), or None: such a block,
    cut off mid-code (often at the token limit), is run by no tool."""
    fences = _fences(text)
    return fences[-1][0] if fences and not fences[-1][2] else None


def prose(text: str) -> str:
    """``text`` without its fenced blocks (closed or left open): what an action says, not its code."""
    out, pos = [], 0
    while m := _FENCE_OPEN.search(text, pos):
        out.append(text[pos : m.start()])
        close = _FENCE_CLOSE.search(text, m.end())
        if close is None:
            return "".join(out)
        pos = close.end()
    return "".join(out) + text[pos:]


def extract_code_blocks(text: str) -> tuple[list[str], bool]:
    """Return the closed ```python blocks of ``text`` and whether a python fence was left open."""
    blocks, left_open = fenced_blocks(text, *PYTHON_FENCES)
    return blocks, left_open is not None


def truncate_middle(text: str, limit: int, what: str = "characters") -> str:
    """Keep the head and the tail of ``text`` within ``limit`` characters, with a marker in between."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} {what} truncated ...]\n"
    keep = max(0, limit - len(marker))
    head = keep - keep // 3
    return text[:head] + marker + text[len(text) - (keep - head) :]


@cache
def printable_charset() -> frozenset[str]:
    """Printable characters of the Basic Multilingual Plane, plus newline and tab."""
    chars = {chr(c) for c in range(0x20, 0x10000) if not 0xD800 <= c <= 0xDFFF and chr(c).isprintable()}
    chars.update("\n\t")
    return frozenset(chars)


def sanitize(text: str) -> str:
    """Replace characters outside :func:`printable_charset` (control, surrogates, astral) with U+FFFD."""
    charset = printable_charset()
    if all(ch in charset for ch in text):
        return text
    return "".join(ch if ch in charset else "\ufffd" for ch in text)


class TextObservation(str):
    """A ``str`` that also carries the numpy ``dtype`` of a ``Text`` space.

    PettingZoo's ``api_test`` compares ``observation.dtype`` with the space's dtype; a plain ``str`` has none.
    Everything else treats it exactly as a ``str``.
    """

    __slots__ = ()
    dtype = np.dtype(str)


@cache
def _text_template(max_length: int) -> Text:
    return Text(max_length=max_length, min_length=0, charset=printable_charset())


def text_space(max_length: int) -> Text:
    """A ``Text`` space over printable BMP characters.

    Building the charset tables (~63k characters) is done once; each call returns a fresh, independently
    seeded copy that shares those immutable tables.
    """
    space = copy.copy(_text_template(max_length))
    space._np_random = None  # each copy gets its own generator
    return space


def format_feedback(result: ExecResult, limit: int) -> str:
    """Tool feedback as agents see it: status, stdout, stderr, files written (no timings: they are not
    deterministic, and observations must be, for seeding and coach caching)."""
    head = f"Execution status: {result.status}"
    if result.exit_code is not None:
        head += f" (exit code {result.exit_code})"
    if result.error:
        head += f": {result.error}"
    parts = [head]
    if result.stdout:
        parts.append("stdout:\n" + result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    written = [f"{c.path} ({c.change}, {c.size} bytes)" for c in result.files_changed]
    if written:
        parts.append("Files changed: " + ", ".join(written))
    return truncate_middle("\n".join(parts), limit)


def render_messages(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages as one text (the observation)."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
