"""Tools: what an agent's action can call, separate from tasks (a role names the tools it offers).

A :class:`Tool` finds its calls in an action's text (for example the ```python blocks) and runs each in the
episode's sandbox session, returning a :class:`sandboxes.ExecResult`; the pipeline records every call with its
result and shows the feedback to the role itself (next turn) and to every later role. A role's turns go on while
its actions call a tool, up to its ``max_turns``.

Built in: ``python`` (:class:`PythonTool`). A task module can define and :func:`register_tool` its own, e.g. an
SQL tool that runs ```sql blocks against a database file in the workspace::

    class SQLTool(Tool):
        name = "sql"
        def calls(self, text):
            return fenced_blocks(text, "sql")[0]  # the closed ```sql blocks (mappa_envs.core.text)
        def run(self, session, call):
            return session.run(f"import sqlite3; ... {call!r} ...")

    register_tool(SQLTool())
"""

from __future__ import annotations

from sandboxes import ExecResult, Session

from .text import PYTHON_FENCES, extract_code_blocks, fenced_blocks


class Tool:
    """Base class of tools: a name, how to find calls in an action, how to run one."""

    name: str = ""
    description: str = ""
    """One line for role prompts (what the tool does and how to call it)."""
    languages: tuple[str, ...] = ()
    """The fence languages its calls are written in (```sql...): the default :meth:`calls` reads those blocks, and
    the per-role metrics count an action holding one as code (:func:`tool_languages`)."""

    def calls(self, text: str) -> list[str]:
        """The calls an action makes (in order); empty when it calls nothing. By default each closed block of one
        of its ``languages``."""
        return [b.strip() for b in fenced_blocks(text, *self.languages)[0]]

    def run(self, session: Session, call: str) -> ExecResult:
        """Run one call in the episode's sandbox session."""
        raise NotImplementedError


class PythonTool(Tool):
    """Runs the action's closed ```python blocks (joined into one program) in the sandbox."""

    name = "python"
    languages = PYTHON_FENCES
    description = "write Python in a ```python block; it runs in the workspace and you see its output"

    def calls(self, text: str) -> list[str]:
        blocks, _ = extract_code_blocks(text)
        return ["\n\n".join(blocks)] if blocks else []

    def run(self, session: Session, call: str) -> ExecResult:
        return session.run(call)


_TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool, *, override: bool = False) -> Tool:
    """Make ``tool`` available to roles by its name."""
    if not tool.name:
        raise ValueError("a tool needs a name")
    if tool.name in _TOOLS and not override and type(_TOOLS[tool.name]) is not type(tool):
        raise ValueError(f"a different tool is already registered as {tool.name!r} (override=True replaces it)")
    _TOOLS[tool.name] = tool
    return tool


def get_tool(name: str) -> Tool:
    try:
        return _TOOLS[name]
    except KeyError:
        raise KeyError(f"no tool registered as {name!r}; registered: {sorted(_TOOLS)}") from None


def list_tools() -> list[str]:
    return sorted(_TOOLS)


def tool_languages() -> tuple[str, ...]:
    """The fence languages of every registered tool: a block in one of them is code some tool runs."""
    return tuple(sorted({lang for t in _TOOLS.values() for lang in t.languages}))


register_tool(PythonTool())

__all__ = ["PythonTool", "Tool", "fenced_blocks", "get_tool", "list_tools", "register_tool", "tool_languages"]
