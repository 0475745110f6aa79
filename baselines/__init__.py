"""Policies, rollouts and (later) the training baselines: REINFORCE++, GRPO, outcome-only."""

from .policies import GenerationConfig, Policy, ScriptedPolicy, TransformersPolicy
from .rollout import policy_for, run_episodes

__all__ = ["GenerationConfig", "Policy", "ScriptedPolicy", "TransformersPolicy", "policy_for", "run_episodes"]
