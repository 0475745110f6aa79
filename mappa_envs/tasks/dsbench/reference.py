"""A scripted reference team for DSBench: hand-written code for each role, built from the task's metadata.

It is what a careful (non-LLM) team would do: the data engineer expands date columns, encodes categorical
columns with codes shared by train and test and keeps missing values as NaN; the modeler fits scikit-learn's
histogram gradient boosting (native NaN support; a log-target for RMSLE); the analyst predicts and writes the
submission. Used by the tests, by ``benchmarks/dsbench_reference.py`` and as a sanity check that a task is
solvable through the sandbox. ``omit`` drops artifacts from the data engineer's code (to test credit
assignment).

>>> from mappa_envs.tasks.dsbench.reference import ReferenceTeam
>>> team = ReferenceTeam(id_column="id", target_columns=("y",), metric="rmse")
>>> "X_test.pkl" in team.code("data_engineer")
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .metrics import METRICS

_DATA_ENGINEER = """import warnings

import numpy as np
import pandas as pd

train = pd.read_csv("train.csv")
test = pd.read_csv("test.csv")
id_col, targets = {id_column!r}, {targets!r}
y = train[targets[0]] if len(targets) == 1 else train[targets]
features = [c for c in test.columns if c != id_col and c not in targets]
both = pd.concat([train[features], test[features]], keys=["train", "test"])
for c in list(both.columns):
    if pd.api.types.is_bool_dtype(both[c]):
        both[c] = both[c].astype(float)
    elif not pd.api.types.is_numeric_dtype(both[c]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = pd.to_datetime(both[c], errors="coerce")
        if parsed.notna().mean() > 0.95:  # a date column: its parts are features
            for part in ("year", "month", "day", "hour", "dayofweek"):
                values = getattr(parsed.dt, part)
                if values.nunique() > 1:
                    both[c + "_" + part] = values
            both = both.drop(columns=[c])
        else:  # categorical: shared codes, missing stays missing
            codes = both[c].astype("category").cat.codes.astype(float)
            both[c] = codes.where(codes >= 0)
X_train, X_test = both.loc["train"].reset_index(drop=True), both.loc["test"].reset_index(drop=True)
X_train.to_pickle("X_train.pkl")
{save_y}{save_x_test}print("X_train", X_train.shape, "y_train", y.shape, "X_test", X_test.shape)
print("missing values in X_train:", int(X_train.isna().sum().sum()))
"""

_MODELER = """import pickle

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.model_selection import train_test_split

X = pd.read_pickle("X_train.pkl")
y = pd.read_pickle("y_train.pkl")
kind, log_target = {kind!r}, {log_target!r}
if kind == "value":
    model = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.08, random_state=0, loss={loss!r})
    fit_y = np.log1p(y.clip(lower=0)) if log_target else y
else:
    model = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.08, random_state=0)
    fit_y = y.astype(str) if kind == "label" else y
X_fit, X_val, y_fit, y_val = train_test_split(X, fit_y, test_size=0.2, random_state=0)
model.fit(X_fit, y_fit)
print("validation score ({{}}): {{:.4f}}".format(
    "R2" if kind == "value" else "accuracy", model.score(X_val, y_val)))
model.fit(X, fit_y)
with open("model.pkl", "wb") as f:
    pickle.dump({{"model": model, "log_target": log_target, "kind": kind}}, f)
print("wrote model.pkl")
"""

_ANALYST = """import pickle

import numpy as np
import pandas as pd

with open("model.pkl", "rb") as f:
    saved = pickle.load(f)
model = saved["model"]
X_test = pd.read_pickle("X_test.pkl")
test = pd.read_csv("test.csv")
id_col, target = {id_column!r}, {target!r}
if saved["kind"] == "probability":
    proba = model.predict_proba(X_test)
    positive = list(model.classes_).index(1) if 1 in list(model.classes_) else proba.shape[1] - 1
    pred = proba[:, positive]
else:
    pred = model.predict(X_test)
    if saved["log_target"]:
        pred = np.expm1(pred).clip(min=0)
submission = pd.DataFrame({{id_col: test[id_col], target: pred}})
submission.to_csv("submission.csv", index=False)
print(submission.head())
print("shape", submission.shape)
"""

DONE = {
    "data_engineer": "X_train.pkl, y_train.pkl and X_test.pkl are written as the contract asks.",
    "modeler": "model.pkl is written: a histogram gradient-boosting model trained on all training rows.",
    "analyst": "submission.csv is written with one prediction per test id.",
}


@dataclass(frozen=True)
class ReferenceTeam:
    """Scripted replies of each role: turn 1 runs the role's code, turn 2 concludes without code."""

    id_column: str
    target_columns: tuple[str, ...]
    metric: str
    omit: tuple[str, ...] = ()
    """Artifacts the data engineer does not write (e.g. ``("X_test.pkl",)``)."""

    @classmethod
    def for_task(cls, task, omit: Sequence[str] = ()) -> ReferenceTeam:
        """From a :class:`DSTask` or an env :class:`Task` (its metadata has the columns and metric)."""
        meta = getattr(task, "metadata", None)
        if meta and "metric" in meta:
            return cls(meta["id_column"], tuple(meta["target_columns"]), meta["metric"], tuple(omit))
        return cls(task.id_column, tuple(task.target_columns), task.metric, tuple(omit))

    def code(self, role: str) -> str:
        kind = METRICS[self.metric].kind
        if len(self.target_columns) != 1:
            raise NotImplementedError("the reference team handles one target column")
        if role == "data_engineer":
            return _DATA_ENGINEER.format(
                id_column=self.id_column,
                targets=list(self.target_columns),
                save_y="" if "y_train.pkl" in self.omit else 'y.to_pickle("y_train.pkl")\n',
                save_x_test="" if "X_test.pkl" in self.omit else 'X_test.to_pickle("X_test.pkl")\n',
            )
        if role == "modeler":
            loss = "absolute_error" if self.metric in ("mae", "medae") else "squared_error"
            return _MODELER.format(kind=kind, log_target=self.metric == "rmsle", loss=loss)
        if role == "analyst":
            return _ANALYST.format(id_column=self.id_column, target=self.target_columns[0])
        raise KeyError(f"no reference code for role {role!r}")

    def reply(self, role: str, turn: int, feedback: str = "") -> str:
        """The role's reply at ``turn`` (1-based); ``feedback`` is its last tool feedback."""
        if turn == 1:
            return f"Here is my code.\n\n```python\n{self.code(role)}```"
        if "Error" in feedback or "No such file" in feedback:
            missing = [f for f in ("X_train.pkl", "y_train.pkl", "X_test.pkl", "model.pkl") if f in feedback]
            if missing:
                return (
                    f"I cannot finish: {', '.join(missing)} is missing from the workspace, so the earlier agent "
                    "that should have written it did not deliver; no output was written."
                )
            return "My code failed; I could not deliver my artifact."
        return DONE[role]

    def act(self, env) -> str:
        """The reply for the env's current agent (reads its turn and last feedback from ``env.unwrapped``)."""
        u = env.unwrapped
        agent = u.agent_selection
        own = [a for a in u.record.actions if a.agent == agent]
        feedback = own[-1].tool_calls[-1].feedback if own and own[-1].tool_calls else ""
        return self.reply(u.role(agent).name, len(own) + 1, feedback)


def run_reference(env, task_id: str | None = None, *, seed: int = 0, omit: Sequence[str] = ()):
    """Play one episode of ``env`` (a DSBench env, possibly wrapped) with the reference team.

    Returns the episode's :class:`EpisodeRecord`; its ``outcome`` has the score.
    """
    env.reset(seed=seed, options={"task_id": task_id} if task_id else None)
    team = ReferenceTeam.for_task(env.unwrapped.task, omit)
    for _agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else team.act(env))
    return env.unwrapped.record


__all__ = ["DONE", "ReferenceTeam", "run_reference"]
