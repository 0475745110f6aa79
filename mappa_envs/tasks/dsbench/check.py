"""The hand-over check: after an action that wrote, changed or deleted a file of the hand-over contract, a fixed
script loads every contract file in the episode's sandbox and says what it holds; the result is recorded on the
action (``info["workspace_check"]``, kept in the JSON lines, so ``mappa rescore`` reads it too) and the DSBench
coaches judge the files by it, never by what an agent printed.

It runs in the sandbox, never on the host: the files are the agents' own, and a pickle runs code when it is loaded.
The host reads only bytes (:meth:`sandboxes.Session.read_file`: the given files' hashes at ladder level 0 and
``submission.csv`` against ``sample_submission.csv``) and the script's one line of JSON, found by a fresh random
prefix and validated field by field. What it records per file:

- every file: ``present``, ``ok`` (usable as the contract says) and ``problems`` (what is wrong, hard or soft);
  ``rows`` and ``type`` when it loads;
- ``X_train.pkl``: a 2-D table with 1 to train.csv's rows; missing values and non-numeric columns are problems;
- ``y_train.pkl``: one value per row of ``X_train.pkl``;
- ``X_test.pkl``: test.csv's row count and ``X_train.pkl``'s columns (the same names in the same order, or width);
- ``model.pkl``: loads (``joblib``, else pickle) and has ``predict``; its predictions on ``X_test.pkl`` are counted;
- ``submission.csv``: a CSV table with the submission's columns and test.csv's row count; a byte-for-byte copy of
  ``sample_submission.csv`` is not ok;
- at level 0, a given file whose bytes changed, or that is gone, is not ok (``keep intact``).

Cost: one short execution (Python, pandas and each file loaded once) per action that touched the contract; about
0.5-1 s on the subprocess backend with lite's data, under a 60 s limit. An action that touched none runs nothing.

What it cannot rule out: code inside a pickle runs when the check loads it (inside the sandbox, as the agents' own
code does) and could print a forged result if it found the prefix; the files are loaded with the sandbox's own
libraries, so a file that loads here loads for the next agent.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import prompts

CHECKED = tuple(p for files in prompts.ARTIFACTS.values() for p in files)
"""Every file of the full hand-over contract, in pipeline order."""
TIMEOUT_S = 60.0

CHECK_CODE = r'''
import contextlib, io, json, os, warnings
warnings.filterwarnings("ignore")
SPEC = json.loads(__SPEC__)
out = {}

def load(path, model=False):
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        if model:
            try:
                import joblib
                return joblib.load(path)
            except ImportError:
                pass
        import pandas as pd
        return pd.read_pickle(path)

def table(obj):
    """(rows, columns, names or None, missing values, non-numeric columns) of a 2-D table, or None."""
    import numpy as np, pandas as pd
    if isinstance(obj, pd.DataFrame):
        numeric = [pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t) for t in obj.dtypes]
        names = [str(c) for c in obj.columns]
        return len(obj), obj.shape[1], names, int(obj.isna().to_numpy().sum()), numeric.count(False)
    shape = getattr(obj, "shape", None)
    if shape is None or len(shape) != 2:
        return None
    arr = np.asarray(obj) if not hasattr(obj, "tocsr") else None
    if arr is None:
        return shape[0], shape[1], None, 0, 0
    numeric = arr.dtype.kind in "biuf"
    nan = int(np.isnan(arr).sum()) if numeric and arr.dtype.kind == "f" else 0
    return shape[0], shape[1], None, nan, 0 if numeric else shape[1]

def check(path):
    r = {"present": os.path.isfile(path), "ok": False, "problems": []}
    if not r["present"]:
        r["problems"].append("absent")
        return r, None
    try:
        obj = load(path, model=path == "model.pkl") if path.endswith(".pkl") else None
        if path.endswith(".csv"):
            import pandas as pd
            obj = pd.read_csv(path, dtype=str, keep_default_na=False)
    except BaseException as e:
        r["problems"].append(("does not load: %s: %s" % (type(e).__name__, e))[:200])
        return r, None
    r["loads"] = True
    r["type"] = type(obj).__name__
    return r, obj

n_train, n_test = SPEC["train_rows"], SPEC["test_rows"]
loaded, NAMES = {}, {}
for path in SPEC["files"]:
    r, obj = check(path)
    out[path] = r
    if obj is not None:
        loaded[path] = obj
    if "loads" not in r:
        continue
    p = r["problems"]
    try:
        if path in ("X_train.pkl", "X_test.pkl"):
            t = table(obj)
            if t is None:
                p.append("not a 2-D table (a %s)" % r["type"])
                continue
            rows, cols, names, nan, text = t
            r["rows"], r["cols"] = rows, cols
            hard = []
            if path == "X_train.pkl" and not 0 < rows <= n_train:
                hard.append("%d rows, not 1 to train.csv's %d" % (rows, n_train))
            if path == "X_test.pkl":
                if rows != n_test:
                    hard.append("%d rows, not test.csv's %d" % (rows, n_test))
                xt = out.get("X_train.pkl", {})
                train_names = NAMES.get("X_train.pkl")
                if xt.get("ok") and train_names is not None and names is not None and train_names != names:
                    hard.append("columns differ from X_train.pkl's")
                elif xt.get("ok") and xt.get("cols") != cols:
                    hard.append("%d columns, X_train.pkl has %s" % (cols, xt.get("cols")))
            NAMES[path] = names
            p.extend(hard)
            r["ok"] = not hard
            if nan:
                p.append("%d missing values" % nan)
            if text:
                p.append("%d columns not numeric" % text)
        elif path == "y_train.pkl":
            rows = len(obj)
            r["rows"] = rows
            xt = out.get("X_train.pkl", {})
            want = xt.get("rows") if xt.get("ok") else None
            r["ok"] = rows == want if want is not None else 0 < rows <= n_train
            if not r["ok"]:
                p.append("%d values, X_train.pkl has %s rows" % (rows, want if want is not None else "no usable"))
        elif path == "model.pkl":
            r["ok"] = callable(getattr(obj, "predict", None))
            if not r["ok"]:
                p.append("no predict method (a %s)" % r["type"])
            elif out.get("X_test.pkl", {}).get("ok"):
                sink = io.StringIO()
                try:
                    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                        r["predictions"] = int(len(obj.predict(loaded["X_test.pkl"])))
                    if r["predictions"] != n_test:
                        p.append("%d predictions for test.csv's %d rows" % (r["predictions"], n_test))
                except BaseException as e:
                    p.append(("cannot predict X_test.pkl: %s: %s" % (type(e).__name__, e))[:200])
        elif path == "submission.csv":
            rows, cols = len(obj), [c.strip() for c in obj.columns]
            r["rows"] = rows
            if sorted(cols) != sorted(SPEC["submission_columns"]):
                p.append("columns %s, not %s" % (cols[:8], SPEC["submission_columns"]))
            if rows != n_test:
                p.append("%d rows, not test.csv's %d" % (rows, n_test))
            r["ok"] = not p
            empty = int(sum((obj[c].str.strip() == "").sum() for c in obj.columns))
            if empty:
                p.append("%d empty cells" % empty)
    except BaseException as e:
        r["ok"] = False
        p.append(("the check failed: %s: %s" % (type(e).__name__, e))[:200])
print(SPEC["nonce"] + json.dumps(out))
'''
"""The check, run in the sandbox (``__SPEC__``: its JSON spec: files, row counts, the submission's columns)."""


def check_code(files: list[str], train_rows: int, test_rows: int, columns: list[str], nonce: str) -> str:
    """The check script for ``files`` with the host's expectations."""
    spec = {"files": files, "train_rows": train_rows, "test_rows": test_rows, "submission_columns": columns}
    return CHECK_CODE.replace("__SPEC__", repr(json.dumps({**spec, "nonce": nonce})))


def _clean(entry: Any) -> dict[str, Any]:
    """One file's entry as the script printed it, reduced to known fields of the right types."""
    if not isinstance(entry, Mapping):
        return {"present": False, "ok": False, "problems": ["the check printed no entry for it"]}
    out: dict[str, Any] = {
        "present": entry.get("present") is True,
        "ok": entry.get("ok") is True,
        "problems": [str(p)[:200] for p in entry.get("problems", []) if isinstance(p, str)][:8],
    }
    for key in ("rows", "cols", "predictions"):
        if isinstance(entry.get(key), int) and not isinstance(entry.get(key), bool):
            out[key] = entry[key]
    if isinstance(entry.get("type"), str):
        out["type"] = entry["type"][:60]
    return out


def parse_check(stdout: str, nonce: str, files: list[str]) -> dict[str, dict[str, Any]] | None:
    """The per-file entries of the line that starts with ``nonce`` (the last one); None when there is none."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(nonce)]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1][len(nonce) :])
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    return {p: _clean(data.get(p)) for p in files}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_check(
    session: Any,
    *,
    train_rows: int,
    test_rows: int,
    columns: list[str],
    given_sha256: Mapping[str, str] | None = None,
    sample: Path | None = None,
) -> dict[str, Any]:
    """Check every contract file of ``session``'s workspace (see the module docstring): the record stored in an
    action's ``info["workspace_check"]``: ``status`` of the execution, ``seconds`` and ``files`` (path -> entry)."""
    start = time.perf_counter()
    nonce = "MAPPA-CHECK-" + secrets.token_hex(16) + ":"
    files = list(CHECKED)
    result = session.run(check_code(files, train_rows, test_rows, columns, nonce), timeout_s=TIMEOUT_S)
    entries = parse_check(result.stdout, nonce, files) if result.ok else None
    if entries is None:  # the check itself failed: nothing it was to check counts as verified
        why = f"the check did not finish ({result.status}: {(result.error or result.stderr or '')[-160:]})"
        entries = {p: {"present": True, "ok": False, "problems": [why], "unchecked": True} for p in files}
    for name, digest in (given_sha256 or {}).items():  # level 0: the given files kept intact (host-side bytes)
        entry = entries.setdefault(name, {"present": False, "ok": False, "problems": []})
        try:
            intact = sha256(session.read_file(name)) == digest
        except (OSError, ValueError):  # gone, or not a regular file any more
            intact = False
        entry["given"] = True
        if not intact:
            entry["ok"] = False
            entry["problems"] = ["a given file, changed or removed (keep it intact)", *entry["problems"]]
    if sample is not None and entries.get("submission.csv", {}).get("present"):
        try:
            copy = session.read_file("submission.csv", max_bytes=sample.stat().st_size + 1) == sample.read_bytes()
        except (OSError, ValueError):
            copy = False
        if copy:
            entries["submission.csv"]["ok"] = False
            entries["submission.csv"]["problems"].insert(0, "a byte-for-byte copy of sample_submission.csv")
    return {"status": str(result.status), "seconds": round(time.perf_counter() - start, 3), "files": entries}


__all__ = ["CHECKED", "CHECK_CODE", "check_code", "parse_check", "run_check", "sha256"]
