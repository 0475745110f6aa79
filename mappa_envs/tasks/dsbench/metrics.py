"""DSBench metrics: the task's metric (scikit-learn), its trivial baseline and a normalised quality in [0, 1].

Each metric has a *kind*, which says what a submission holds:

- ``label``: a class per row (accuracy, F1, quadratic weighted kappa);
- ``probability``: the probability of the positive class per row (ROC-AUC, log-loss, Gini), or one probability
  column per class / target (then averaged per column, or a multi-class log-loss);
- ``value``: a number per row and target column (RMSE, RMSLE, MAE, median absolute error, R2, ...).

The trivial baseline predicts the same thing for every test row from the training target only: the majority class
(labels), the class prior (probabilities) or the mean (values). The normalised quality is DSBench's relative
performance gap with the metric's best possible value in place of the competition's best score::

    quality = clip((value - baseline) / (best - baseline), 0, 1)

for either direction of the metric, so 0 means "no better than the trivial baseline" and 1 "perfect".

>>> m = METRICS["rmse"]
>>> m.greater_is_better, m.kind, m.best
(False, 'value', 0.0)
>>> round(quality(m, value=2.0, baseline=4.0), 3)
0.5
>>> metric_from_text("Submissions are evaluated on area under the ROC curve between the predicted probability")
'roc_auc'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PROB_EPS = 1e-15


@dataclass(frozen=True)
class Metric:
    name: str
    title: str
    greater_is_better: bool
    kind: str
    """``label``, ``probability`` or ``value`` (see the module docstring)."""
    best: float
    fn: Callable[[np.ndarray, np.ndarray], float]
    """``fn(y_true, y_pred)``: 2-D arrays (rows x target columns)."""
    sentence: str
    """The evaluation sentence of a task description."""
    classification: bool = True


def _sk():
    import sklearn.metrics as skm

    return skm


def _per_column(f: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[np.ndarray, np.ndarray], float]:
    def g(y_true: np.ndarray, y_pred: np.ndarray) -> float:
        return float(np.mean([f(y_true[:, j], y_pred[:, j]) for j in range(y_true.shape[1])]))

    return g


def _accuracy(t, p):
    return float(np.mean(t[:, 0] == p[:, 0]))


def _f1(average: str):
    def f(t, p):
        skm = _sk()
        labels = sorted(set(t[:, 0]))
        if average == "binary":
            pos = next((c for c in ("1", "true", "yes") if c in labels), labels[-1])
            return float(skm.f1_score(t[:, 0], p[:, 0], pos_label=pos, average="binary"))
        return float(skm.f1_score(t[:, 0], p[:, 0], labels=labels, average=average, zero_division=0))

    return f


def _qwk(t, p):
    return float(_sk().cohen_kappa_score(t[:, 0], p[:, 0], weights="quadratic"))


def _auc_col(t, p):
    t = t.astype(float)
    if len(np.unique(t)) < 2:
        raise ValueError("ROC-AUC needs both classes in the answers")
    return float(_sk().roc_auc_score(t, p.astype(float)))


def _log_loss(t, p):
    p = np.clip(p.astype(float), PROB_EPS, 1 - PROB_EPS)
    t = t.astype(float)
    if t.shape[1] == 1:  # binary: probability of the positive class
        return float(-np.mean(t[:, 0] * np.log(p[:, 0]) + (1 - t[:, 0]) * np.log(1 - p[:, 0])))
    p = p / p.sum(axis=1, keepdims=True)  # one column per class, one-hot answers
    return float(-np.mean(np.sum(t * np.log(p), axis=1)))


def _rmse(t, p):
    return float(np.sqrt(np.mean((t.astype(float) - p.astype(float)) ** 2)))


def _rmsle(t, p):
    return float(np.sqrt(np.mean((np.log1p(t.astype(float)) - np.log1p(p.astype(float))) ** 2)))


def _mae(t, p):
    return float(np.mean(np.abs(t.astype(float) - p.astype(float))))


def _medae(t, p):
    return float(np.mean([np.median(np.abs(t[:, j] - p[:, j])) for j in range(t.shape[1])]))


def _r2(t, p):
    return float(_sk().r2_score(t.astype(float), p.astype(float)))


def _smape(t, p):
    t, p = t.astype(float), p.astype(float)
    den = np.abs(t) + np.abs(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(den == 0, 0.0, 2 * np.abs(p - t) / den)
    return float(100 * np.mean(ratio))


def _corr(kind: str):
    def f(t, p):
        from scipy import stats

        t, p = t.astype(float), p.astype(float)
        if np.std(p) == 0 or np.std(t) == 0:
            return 0.0  # undefined for a constant column: no better than a constant
        r = stats.pearsonr(t, p)[0] if kind == "pearson" else stats.spearmanr(t, p)[0]
        return 0.0 if math.isnan(r) else float(r)

    return _per_column(f)


def _mcrmse(t, p):
    return float(np.mean(np.sqrt(np.mean((t.astype(float) - p.astype(float)) ** 2, axis=0))))


_EVAL = "Submissions are evaluated on"
METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("accuracy", "accuracy", True, "label", 1.0, _accuracy, f"{_EVAL} classification accuracy."),
        Metric("f1", "F1 score", True, "label", 1.0, _f1("binary"), f"{_EVAL} the F1 score of the positive class."),
        Metric("f1_macro", "macro F1", True, "label", 1.0, _f1("macro"), f"{_EVAL} the macro-averaged F1 score."),
        Metric("f1_micro", "micro F1", True, "label", 1.0, _f1("micro"), f"{_EVAL} the micro-averaged F1 score."),
        Metric("qwk", "quadratic weighted kappa", True, "label", 1.0, _qwk, f"{_EVAL} the quadratic weighted kappa."),
        Metric(
            "roc_auc",
            "ROC-AUC",
            True,
            "probability",
            1.0,
            _per_column(_auc_col),
            f"{_EVAL} the area under the ROC curve between the predicted probability and the observed target.",
        ),
        Metric(
            "gini",
            "normalized Gini",
            True,
            "probability",
            1.0,
            _per_column(lambda t, p: 2 * _auc_col(t, p) - 1),
            f"{_EVAL} the normalized Gini coefficient.",
        ),
        Metric(
            "log_loss",
            "log-loss",
            False,
            "probability",
            0.0,
            _log_loss,
            f"{_EVAL} the log-loss between the predicted probability and the observed target.",
        ),
        Metric("rmse", "RMSE", False, "value", 0.0, _rmse, f"{_EVAL} the root mean squared error (RMSE).", False),
        Metric(
            "rmsle",
            "RMSLE",
            False,
            "value",
            0.0,
            _rmsle,
            f"{_EVAL} the root mean squared logarithmic error (RMSLE): sqrt(mean((log(1 + p) - log(1 + a))^2)).",
            False,
        ),
        Metric("mae", "MAE", False, "value", 0.0, _mae, f"{_EVAL} the mean absolute error (MAE).", False),
        Metric("medae", "MedAE", False, "value", 0.0, _medae, f"{_EVAL} the median absolute error (MedAE).", False),
        Metric("r2", "R2", True, "value", 1.0, _r2, f"{_EVAL} the R2 (coefficient of determination) score.", False),
        Metric("smape", "SMAPE", False, "value", 0.0, _smape, f"{_EVAL} SMAPE between forecasts and actuals.", False),
        Metric("pearson", "Pearson r", True, "value", 1.0, _corr("pearson"), f"{_EVAL} Pearson's r.", False),
        Metric("spearman", "Spearman rho", True, "value", 1.0, _corr("spearman"), f"{_EVAL} Spearman's rho.", False),
        Metric("mcrmse", "MCRMSE", False, "value", 0.0, _mcrmse, f"{_EVAL} the mean column-wise RMSE.", False),
    ]
}

# Ordered: the first pattern found in a task description's evaluation text names its metric.
_PATTERNS: list[tuple[str, str]] = [
    (r"MPA@3|MAP@3|mean average precision", "map@3"),
    (r"jaccard", "jaccard"),
    (r"quadratic weighted kappa", "qwk"),
    (r"normali[sz]ed gini", "gini"),
    (r"column-?wise root mean squared? error|MCRMSE", "mcrmse"),
    (r"spearman", "spearman"),
    (r"pearson", "pearson"),
    (r"SMAPE", "smape"),
    (r"root[- ]mean[- ]squared[- ]log(?:arithmic)?[- ]error|RMSLE", "rmsle"),
    (r"root[- ]mean[- ]squared[- ]error|RMSE", "rmse"),
    (r"median absolute error|MedAE", "medae"),
    (r"mean absolute error|\bMAE\b", "mae"),
    (r"\bR2\b|R\^2|coefficient of determination", "r2"),
    (r"log[- ]?loss|logarithmic loss|cross-entropy", "log_loss"),
    (r"ROC|\bAUC\b|area under", "roc_auc"),
    (r"macro[- ]?(?:averaged )?F1|macro F1", "f1_macro"),
    (r"micro[- ]?(?:averaged )?F1|micro F1", "f1_micro"),
    (r"\bF1\b|F-score|F1-score", "f1"),
    (r"accuracy|percentage of (?:passengers|predicted labels)|correctly predict", "accuracy"),
]


def metric_from_text(text: str) -> str | None:
    """The metric a task description names (``None`` if none is recognised).

    The evaluation section is searched first (``Evaluation`` ... ``Submission``), then the whole text. A name
    returned here may be one that is not scored (``map@3``, ``jaccard``): see :data:`METRICS`.
    """
    m = re.search(r"(?is)evaluat\w*(.*?)(?:submission (?:file|format)|$)", text)
    for scope in ([m.group(1)] if m else []) + [text]:
        for pattern, name in _PATTERNS:
            if re.search(pattern, scope, re.IGNORECASE):
                return name
    return None


def quality(metric: Metric, value: float, baseline: float) -> float:
    """Normalised quality in [0, 1]: 0 at (or below) the trivial baseline, 1 at the metric's best value."""
    if value is None or not math.isfinite(value):
        return 0.0
    gap = metric.best - baseline
    if gap == 0 or not math.isfinite(gap):
        return 1.0 if value == metric.best else 0.0
    return float(min(1.0, max(0.0, (value - baseline) / gap)))


def canonical(value: object) -> str:
    """A label or id as a comparable string: ``1``, ``1.0`` and ``" 1 "`` are the same; ``True``/``true`` too."""
    s = str(value).strip()
    if s.lower() in ("true", "false"):
        return s.lower()
    try:
        f = float(s)
    except ValueError:
        return s
    if math.isfinite(f) and f.is_integer():
        return str(int(f))
    return repr(f)


__all__ = ["METRICS", "Metric", "canonical", "metric_from_text", "quality"]
