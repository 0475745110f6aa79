"""mappa/MathChat-v0 as a verifiers v1 environment (id ``mappa-mathchat``): see
:mod:`mappa_envs.integrations.verifiers_env` and docs/integrations.md."""

from mappa_envs.integrations.verifiers_env import *  # noqa: F403 (verifiers' loader reads the names in __all__)
from mappa_envs.integrations.verifiers_env import __all__  # noqa: F401
