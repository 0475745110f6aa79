"""DSBench: data engineer -> modeler -> analyst on Kaggle-style modeling tasks (see :mod:`.env`)."""

from .env import DEFAULT_LIMITS, DSBenchEnv, dsbench_roles
from .lite import LITE_TASKS, build_lite, load_lite
from .metrics import METRICS, metric_from_text, quality
from .scoring import Score, score_bytes, score_workspace
from .tasks import DSTask, TaskSet, dsbench_descriptions, load_dsbench, load_layout

__all__ = [
    "DEFAULT_LIMITS",
    "LITE_TASKS",
    "METRICS",
    "DSBenchEnv",
    "DSTask",
    "Score",
    "TaskSet",
    "build_lite",
    "dsbench_descriptions",
    "dsbench_roles",
    "load_dsbench",
    "load_layout",
    "load_lite",
    "metric_from_text",
    "quality",
    "score_bytes",
    "score_workspace",
]
