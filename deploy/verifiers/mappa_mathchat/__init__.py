"""mappa/MathChat-v0 as a verifiers v1 environment (id ``mappa-mathchat``): see
:mod:`mappa_envs.integrations.verifiers_env` and docs/integrations.md."""

from mappa_envs.integrations.verifiers_env import (
    MappaChatHarness,
    MappaChatHarnessConfig,
    MathChatData,
    MathChatEnv,
    MathChatEnvConfig,
    MathChatTask,
    MathChatTaskset,
    MathChatTasksetConfig,
)

__all__ = [
    "MappaChatHarness",
    "MappaChatHarnessConfig",
    "MathChatData",
    "MathChatEnv",
    "MathChatEnvConfig",
    "MathChatTask",
    "MathChatTaskset",
    "MathChatTasksetConfig",
]
