"""Environment core: the sequential role pipeline, text handling and trajectory records."""

from .pipeline import HANDOFFS, PYTHON_TOOL, PipelineEnv, Role, Task
from .policy import Generation, Policy, ScriptedPolicy, SerialPolicy, policy_for
from .records import CoachEvaluation, FinishReason, GenerationInfo, Outcome, OutcomeKind, ParseKind
from .single_agent import SingleAgentView
from .text import (
    ParsedAction,
    extract_code_blocks,
    format_feedback,
    normalize_action,
    render_messages,
    sanitize,
    text_space,
    truncate_middle,
)
from .tools import PythonTool, Tool, fenced_blocks, get_tool, list_tools, register_tool, tool_languages
from .trajectory import ActionRecord, EpisodeRecord, Message, ToolCall, read_jsonl, write_jsonl

__all__ = [
    "HANDOFFS",
    "PYTHON_TOOL",
    "ActionRecord",
    "CoachEvaluation",
    "EpisodeRecord",
    "FinishReason",
    "Generation",
    "GenerationInfo",
    "Message",
    "Outcome",
    "OutcomeKind",
    "ParseKind",
    "ParsedAction",
    "PipelineEnv",
    "Policy",
    "PythonTool",
    "Role",
    "ScriptedPolicy",
    "SerialPolicy",
    "SingleAgentView",
    "Task",
    "Tool",
    "ToolCall",
    "extract_code_blocks",
    "fenced_blocks",
    "format_feedback",
    "get_tool",
    "list_tools",
    "normalize_action",
    "policy_for",
    "read_jsonl",
    "register_tool",
    "render_messages",
    "sanitize",
    "text_space",
    "tool_languages",
    "truncate_middle",
    "write_jsonl",
]
