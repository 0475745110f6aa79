"""DSBench role prompts (data engineer -> modeler -> analyst) with the artifact contract of docs/method.md."""

TEAM = (
    "You are part of a team of three agents solving a Kaggle-style data-science task: a data engineer, a modeler "
    "and an analyst, in that order. You share one workspace folder (the current directory), which starts with "
    "train.csv, test.csv and sample_submission.csv; files written there stay for the agents after you. Each "
    "agent sees the task and the work of the agents before it. Write Python in ```python blocks: they run in the "
    "workspace (python3 with pandas, numpy, scipy and scikit-learn; no internet) and you see their output. Your "
    "turn ends when you reply without a code block; you have at most {turns} replies.\n\n"
    "The hand-over contract:\n"
    "- the data engineer writes X_train.pkl (training features, a pandas DataFrame), y_train.pkl (the training "
    "target, a pandas Series) and X_test.pkl (the test features: same columns in the same order as X_train, one "
    "row per row of test.csv, in test.csv's order), with pandas' to_pickle;\n"
    "- the modeler writes model.pkl (the fitted model, with pickle), trained on X_train.pkl and y_train.pkl;\n"
    "- the analyst writes submission.csv from model.pkl and X_test.pkl, exactly in the format of the task's "
    "Submission File section (the columns of sample_submission.csv, one row per test id)."
)

DATA_ENGINEER_SYSTEM = (
    TEAM + "\n\nYou are the data engineer: load the data, clean it (missing values), encode categorical and text "
    "columns as numbers the same way for train and test, and write X_train.pkl, y_train.pkl and X_test.pkl. Never "
    "drop or reorder test rows."
)
DATA_ENGINEER_INSTRUCTION = (
    "Prepare the data: write X_train.pkl, y_train.pkl and X_test.pkl as the contract says, then print their shapes."
)

MODELER_SYSTEM = (
    TEAM + "\n\nYou are the modeler: load X_train.pkl and y_train.pkl, choose and train a model suited to the "
    "task's metric (predicted probabilities when the metric needs them), estimate its score on held-out training "
    "rows, and save the fitted model as model.pkl."
)
MODELER_INSTRUCTION = "Train a model on X_train.pkl and y_train.pkl, print a validation score, and write model.pkl."

ANALYST_SYSTEM = (
    TEAM + "\n\nYou are the analyst: load model.pkl and X_test.pkl, predict for every test row, and write "
    "submission.csv with exactly the columns and ids the task asks for. If an input file is missing, say which "
    "and which agent should have written it."
)
ANALYST_INSTRUCTION = "Write submission.csv from model.pkl and X_test.pkl, then print its first rows and its shape."

CONTINUE = (
    "That is the output of your code. If something failed or is missing, write a corrected ```python block; "
    "otherwise summarise what you delivered in one or two sentences, without code."
)

ARTIFACTS = {
    "data_engineer": ("X_train.pkl", "y_train.pkl", "X_test.pkl"),
    "modeler": ("model.pkl",),
    "analyst": ("submission.csv",),
}

# ------------------------------------------------------------------------------------------ small-model style
# `role_prompts="small"` (issue 16): one short instruction and one worked example per role, shown as an earlier
# chat turn (`Role.examples`), for models that follow a format only when shown one (SmolLM2-135M writes no
# submission with the prompts above: 0/4 valid on the lite eval tasks). The example is a made-up regression task
# (bike rentals) that is none of DSBench-lite's: a copied reply names the example's target (`rentals`), which no
# task has, so the data engineer's copy raises and the analyst's writes the wrong columns; the modeler's code does
# not depend on the task except through the choice of a classifier or a regressor, which the task's metric decides.
SMALL_EXAMPLE_TASK = (
    "# Bike Rentals\n\n"
    "## Overview\nPredict how many bikes are rented in a day from the weather and the season.\n\n"
    "## Dataset Description\ntrain.csv has 300 rows, test.csv 100. Each row has an `id`.\n"
    "- season: spring, summer, autumn or winter\n- temperature: in degrees Celsius; some are missing\n"
    "- holiday: yes or no\n- rentals: bikes rented that day (target)\n\n"
    "## Evaluation\nSubmissions are evaluated on root mean squared error. Lower is better.\n\n"
    "## Submission File\nFor each id in the test set, you must predict `rentals`. The file should contain a header "
    "and have the following format:\n```\nid,rentals\n300,250.0\n301,250.0\n...\n```\n\n"
    "## Workspace\nThe current directory starts with: train.csv, test.csv, sample_submission.csv."
)

SMALL_TEAM = (
    "You are one of three agents solving a data-science task in one shared folder: a data engineer, then a modeler, "
    "then an analyst. Write one ```python block (pandas, numpy and scikit-learn are installed); it runs in the "
    "folder and you see its output."
)
SMALL_DATA_ENGINEER_SYSTEM = (
    SMALL_TEAM + " You are the data engineer: write X_train.pkl, y_train.pkl and X_test.pkl from train.csv and "
    "test.csv. The target is the column the task names as its target."
)
SMALL_DATA_ENGINEER_INSTRUCTION = "Write X_train.pkl, y_train.pkl and X_test.pkl in one ```python block."
SMALL_DATA_ENGINEER_REPLY = (
    "```python\nimport pandas as pd\n"
    'train = pd.read_csv("train.csv")\ntest = pd.read_csv("test.csv")\n'
    'target = "rentals"\n'
    "train = train.dropna(subset=[target])\n"
    'features = [c for c in train.columns if c not in ("id", target)]\n'
    "X_train = pd.get_dummies(train[features]).fillna(0)\n"
    "X_test = pd.get_dummies(test[features]).reindex(columns=X_train.columns, fill_value=0).fillna(0)\n"
    'X_train.to_pickle("X_train.pkl")\ntrain[target].to_pickle("y_train.pkl")\nX_test.to_pickle("X_test.pkl")\n'
    "print(X_train.shape, X_test.shape)\n```"
)
SMALL_MODELER_SYSTEM = (
    SMALL_TEAM + " You are the modeler: train a model on X_train.pkl and y_train.pkl and save it as model.pkl. "
    "Use a classifier when the task predicts a class, a regressor when it predicts a number."
)
SMALL_MODELER_INSTRUCTION = "Train a model and write model.pkl in one ```python block."
SMALL_MODELER_REPLY = (
    "```python\nimport pandas as pd\nimport pickle\nfrom sklearn.ensemble import RandomForestRegressor\n"
    'X = pd.read_pickle("X_train.pkl")\ny = pd.read_pickle("y_train.pkl")\n'
    "model = RandomForestRegressor(n_estimators=50, max_depth=10, random_state=0)\nmodel.fit(X, y)\n"
    'pickle.dump(model, open("model.pkl", "wb"))\nprint(model.score(X, y))\n```'
)
SMALL_ANALYST_SYSTEM = (
    SMALL_TEAM + " You are the analyst: predict every test row with model.pkl and X_test.pkl and write "
    "submission.csv with the columns of the task's Submission File (predicted probabilities when the metric needs "
    "them)."
)
SMALL_ANALYST_INSTRUCTION = "Write submission.csv in one ```python block."
SMALL_ANALYST_REPLY = (
    "```python\nimport pandas as pd\nimport pickle\n"
    'model = pickle.load(open("model.pkl", "rb"))\nX_test = pd.read_pickle("X_test.pkl")\n'
    'test = pd.read_csv("test.csv")\n'
    'submission = pd.DataFrame({"id": test["id"], "rentals": model.predict(X_test)})\n'
    'submission.to_csv("submission.csv", index=False)\nprint(submission.shape)\n```'
)
SMALL_CONTINUE = (
    "That is your code's output. If it failed, write a corrected ```python block; otherwise say in one sentence "
    "what you wrote."
)


def _small_example(earlier: str, instruction: str) -> str:
    """An example's user message, laid out as :class:`~mappa_envs.core.PipelineEnv` lays out a real one."""
    parts = [f"## Task\n{SMALL_EXAMPLE_TASK}"]
    if earlier:
        parts.append(f"## Work of the earlier agents\n{earlier}")
    parts.append(f"## Your job\n{instruction}")
    return "\n\n".join(parts)


_OK = "Execution status: ok (exit code 0)\nstdout:\n"
SMALL_EXAMPLES = {
    "data_engineer": ((_small_example("", SMALL_DATA_ENGINEER_INSTRUCTION), SMALL_DATA_ENGINEER_REPLY),),
    "modeler": (
        (
            _small_example(
                f"### Data engineer\n{SMALL_DATA_ENGINEER_REPLY}\n### Result of running the data engineer's code\n"
                f"{_OK}(300, 6) (100, 6)",
                SMALL_MODELER_INSTRUCTION,
            ),
            SMALL_MODELER_REPLY,
        ),
    ),
    "analyst": (
        (
            _small_example(
                f"### Data engineer\n(wrote X_train.pkl, y_train.pkl, X_test.pkl)\n"
                f"### Modeler\n{SMALL_MODELER_REPLY}\n### Result of running the modeler's code\n{_OK}0.91",
                SMALL_ANALYST_INSTRUCTION,
            ),
            SMALL_ANALYST_REPLY,
        ),
    ),
}
"""Per role, its worked example as (user message, assistant reply) turns (``Role.examples``)."""

ROLE_PROMPTS = ("paper", "small")
"""``role_prompts`` values of DSBench: the prompts above (the default) or the small-model style."""

# ------------------------------------------------------------------------------ ladder level 0 (see ladder.py)
# The data engineer's files are given: it checks them and writes nothing; the others' prompts say so.
GIVEN_CONTRACT_LINE = (
    "- the data engineer writes ",
    "- given in the workspace from the start (the data engineer checks them and writes nothing): ",
)
GIVEN_DATA_ENGINEER_SYSTEM = (
    TEAM.replace(*GIVEN_CONTRACT_LINE) + "\n\nYou are the data engineer. On this task your files are given: "
    "X_train.pkl, y_train.pkl and X_test.pkl are already in the workspace. Load them, check that X_train and X_test "
    "have the same columns, that X_test has one row per row of test.csv and that nothing is missing, and tell the "
    "modeler what they hold. Do not overwrite them."
)
GIVEN_DATA_ENGINEER_INSTRUCTION = (
    "Check the given X_train.pkl, y_train.pkl and X_test.pkl: print their shapes and their number of missing values."
)
SMALL_GIVEN_DATA_ENGINEER_SYSTEM = (
    SMALL_TEAM + " You are the data engineer: X_train.pkl, y_train.pkl and X_test.pkl are given; load them and "
    "print their shapes."
)
SMALL_GIVEN_DATA_ENGINEER_INSTRUCTION = "Check X_train.pkl, y_train.pkl and X_test.pkl in one ```python block."
SMALL_GIVEN_DATA_ENGINEER_REPLY = (
    "```python\nimport pandas as pd\n"
    'X_train = pd.read_pickle("X_train.pkl")\ny_train = pd.read_pickle("y_train.pkl")\n'
    'X_test = pd.read_pickle("X_test.pkl")\n'
    "print(X_train.shape, y_train.shape, X_test.shape)\n"
    "print(int(X_train.isna().sum().sum()), int(X_test.isna().sum().sum()))\n```"
)
SMALL_GIVEN_EXAMPLE = (
    (
        f"## Task\n{SMALL_EXAMPLE_TASK.rstrip('.')}, X_train.pkl, y_train.pkl, X_test.pkl.\n\n"
        f"## Your job\n{SMALL_GIVEN_DATA_ENGINEER_INSTRUCTION}",
        SMALL_GIVEN_DATA_ENGINEER_REPLY,
    ),
)
"""The level-0 data engineer's worked example (the made-up task with the given files in its workspace)."""


# Under handoff="results" the later roles' examples pickle with pandas (`pd.to_pickle`, `pd.read_pickle`), as the
# data engineer's files are read: with `import pickle` the greedy 135M modeler wrote `import numpy as np` in its place
# on 11 of 14 training tasks at level 0 and its `pickle.dump` raised (docs/results.md).
PANDAS_MODELER_REPLY = (
    "```python\nimport pandas as pd\nfrom sklearn.ensemble import RandomForestRegressor\n"
    'X = pd.read_pickle("X_train.pkl")\ny = pd.read_pickle("y_train.pkl")\n'
    "model = RandomForestRegressor(n_estimators=50, max_depth=10, random_state=0)\nmodel.fit(X, y)\n"
    'pd.to_pickle(model, "model.pkl")\nprint(model.score(X, y))\n```'
)
PANDAS_ANALYST_REPLY = (
    "```python\nimport pandas as pd\n"
    'model = pd.read_pickle("model.pkl")\nX_test = pd.read_pickle("X_test.pkl")\n'
    'test = pd.read_csv("test.csv")\n'
    'submission = pd.DataFrame({"id": test["id"], "rentals": model.predict(X_test)})\n'
    'submission.to_csv("submission.csv", index=False)\nprint(submission.shape)\n```'
)


def small_examples(level: int, handoff: str = "code") -> dict[str, tuple[tuple[str, str], ...]]:
    """Per role, its worked example at ladder ``level`` for the ``handoff`` of :data:`~mappa_envs.core.HANDOFFS`.
    ``"code"`` gives :data:`SMALL_EXAMPLES` (and :data:`SMALL_GIVEN_EXAMPLE` for level 0's data engineer) as they
    always were. ``"results"`` shows later roles only what the earlier roles' code printed, laid out as the env
    lays it out (at level 0 the data engineer's part is the check of the given files), and the modeler's and
    analyst's replies pickle with pandas (:data:`PANDAS_MODELER_REPLY`, :data:`PANDAS_ANALYST_REPLY`)."""
    given = level == 0
    if handoff == "code":
        return {**SMALL_EXAMPLES, **({"data_engineer": SMALL_GIVEN_EXAMPLE} if given else {})}
    if handoff != "results":
        raise ValueError(f"handoff must be 'code' or 'results', not {handoff!r}")
    task = f"{SMALL_EXAMPLE_TASK.rstrip('.')}, X_train.pkl, y_train.pkl, X_test.pkl." if given else SMALL_EXAMPLE_TASK
    engineer = f"### Data engineer\n### Result of running the data engineer's code\n{_OK}" + (
        "(300, 3) (300,) (100, 3)\n0 0" if given else "(300, 6) (100, 6)"
    )
    modeler = f"### Modeler\n### Result of running the modeler's code\n{_OK}0.91"

    def example(earlier: str, instruction: str) -> str:
        return f"## Task\n{task}\n\n## Work of the earlier agents\n{earlier}\n\n## Your job\n{instruction}"

    return {
        "data_engineer": SMALL_GIVEN_EXAMPLE if given else SMALL_EXAMPLES["data_engineer"],
        "modeler": ((example(engineer, SMALL_MODELER_INSTRUCTION), PANDAS_MODELER_REPLY),),
        "analyst": ((example(f"{engineer}\n\n{modeler}", SMALL_ANALYST_INSTRUCTION), PANDAS_ANALYST_REPLY),),
    }
