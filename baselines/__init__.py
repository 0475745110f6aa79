"""Model-backed policies (transformers, vLLM engines), rollouts, and the trainers: REINFORCE++, GRPO, outcome-only
(the single-process `local_trainer` and the distributed `ray_trainer`), their configuration and presets."""

from baselines.evaluation.rollout import policy_for, run_episodes
from baselines.weights.policies import GenerationConfig, Policy, ScriptedPolicy, TransformersPolicy

__all__ = ["GenerationConfig", "Policy", "ScriptedPolicy", "TransformersPolicy", "policy_for", "run_episodes"]
