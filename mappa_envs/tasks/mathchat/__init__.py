"""MathChat: problem solver -> code executor -> verifier on AIME/AMC (and easy arithmetic) problems."""

from .data import SPLITS, arithmetic_problems, load_split, load_task_file
from .env import MathChatEnv, mathchat_roles

__all__ = ["SPLITS", "MathChatEnv", "arithmetic_problems", "load_split", "load_task_file", "mathchat_roles"]
