"""The coach: per-action process rewards (MAPPA), its protocol, backends, reward wrappers and diagnostics."""

from .coaches import Coach, CoachStats, EnsembleCoach, LengthCoach
from .llm import CoachCache, LLMCoach, OpenAIChatBackend
from .llm_hindsight import LLMHindsightCoach
from .protocol import SCORE_REGEX, CoachEvaluation, CoachInput, FileInfo, Templates, parse_answer_correct, parse_score
from .rescore import RescoreStats, coach_from_spec, rescore
from .rule_based import RuleBasedCoach
from .wrapper import CoachPool, CoachRewardWrapper, MixedRewardWrapper, OutcomeRewardWrapper

__all__ = [
    "SCORE_REGEX",
    "Coach",
    "CoachCache",
    "CoachEvaluation",
    "CoachInput",
    "CoachPool",
    "CoachRewardWrapper",
    "CoachStats",
    "EnsembleCoach",
    "FileInfo",
    "LLMCoach",
    "LLMHindsightCoach",
    "LengthCoach",
    "MixedRewardWrapper",
    "OpenAIChatBackend",
    "OutcomeRewardWrapper",
    "RescoreStats",
    "RuleBasedCoach",
    "Templates",
    "coach_from_spec",
    "parse_answer_correct",
    "parse_score",
    "rescore",
]
