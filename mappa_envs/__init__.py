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
register("mappa/SQLQuery-v0", "mappa_envs.tasks.sql_query:SQLQueryEnv", description="SQL over a shop database")
register(
    "mappa/DSBench-v0",
    "mappa_envs.tasks.dsbench:DSBenchEnv",
    description="data engineer -> modeler -> analyst on Kaggle-style modeling (DSBench-lite or DSBench data; "
    "lite's ladder: split level0-*, level1-*, level2-* = train/eval)",
)

__all__ = ["EnvSpec", "__version__", "list_envs", "make", "register", "registry", "spec"]
