"""mappa-envs: multi-agent LLM pipelines as PettingZoo environments, with sandboxed tools and coach rewards.

>>> import mappa_envs
>>> env = mappa_envs.make("mappa/MathChat-v0", split="amc-eval-32")
>>> env.reset(seed=0)
>>> env.agent_selection
'problem_solver_0'
"""

from .registry import EnvSpec, list_envs, make, register, registry, spec

__version__ = "0.1.0"

register(
    "mappa/MathChat-v0",
    "mappa_envs.tasks.mathchat:MathChatEnv",
    description="problem solver -> code executor -> verifier on AIME/AMC (MAPPA MathChat)",
)

__all__ = ["EnvSpec", "__version__", "list_envs", "make", "register", "registry", "spec"]
