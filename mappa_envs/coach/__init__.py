"""The coach: per-action process rewards (MAPPA), its protocol, backends, reward wrappers and diagnostics."""

from .coaches import (
    CoachCache,
    EnsembleCoach,
    LengthCoach,
    LLMCoach,
    OpenAIChatBackend,
    RuleBasedCoach,
)
from .protocol import CoachEvaluation, CoachInput, FileInfo, Templates, parse_answer_correct, parse_score
from .wrapper import CoachPool, CoachRewardWrapper, MixedRewardWrapper, OutcomeRewardWrapper

__all__ = [
    "CoachCache",
    "CoachEvaluation",
    "CoachInput",
    "CoachPool",
    "CoachRewardWrapper",
    "EnsembleCoach",
    "FileInfo",
    "LLMCoach",
    "LengthCoach",
    "MixedRewardWrapper",
    "OpenAIChatBackend",
    "OutcomeRewardWrapper",
    "RuleBasedCoach",
    "Templates",
    "parse_answer_correct",
    "parse_score",
]
