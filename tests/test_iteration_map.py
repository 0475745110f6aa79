"""The map of one training iteration at the top of baselines/training/loop.py stays true: every function it lists
exists, in the file it names; and the loop's base class is abstract (a trainer that misses a step fails when it is
built)."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\s+(?:or\s+)?(?P<file>[\w/]+\.py)\s+(?P<name>[\w.]+)")


def _map_rows() -> list[tuple[str, str]]:
    """(file, dotted name) of each row of the map: the block after the paragraph 'One iteration ...::'."""
    doc = ast.get_docstring(ast.parse((ROOT / "baselines" / "training" / "loop.py").read_text()))
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("One iteration"))
    start = next(i for i in range(start, len(lines)) if lines[i].endswith("::"))
    rows = []
    for line in lines[start + 2 :]:  # after the heading's last line and a blank line
        if not line.strip():
            break
        m = ROW.match(line)
        assert m, f"not a map row: {line!r}"
        rows.append((m["file"], m["name"]))
    return rows


def test_the_iteration_map_names_functions_that_exist_where_it_says():
    rows = _map_rows()
    assert len(rows) >= 15 and rows[0] == ("baselines/training/loop.py", "TrainerBase.train_iteration")
    files = {file for file, _ in rows}
    assert len(files) <= 12, f"following one iteration takes {len(files)} files: {sorted(files)}"
    wrong = []
    for file, name in rows:
        module = importlib.import_module(file.removesuffix(".py").replace("/", "."))
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if not callable(obj):
            wrong.append(f"{file}: no function {name}")
            continue
        defined = Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve()  # through decorators (torch.no_grad)
        if defined != (ROOT / file).resolve():
            wrong.append(f"{name} is defined in {defined}, not {file}")
    assert not wrong, "the iteration map in baselines/training/loop.py is out of date:\n" + "\n".join(wrong)


def test_trainer_base_is_abstract():
    from baselines.config import TrainConfig
    from baselines.training.loop import TrainerBase

    assert TrainerBase.__abstractmethods__ == {"policies"}  # the update, sync and checkpoints are the base's
    with pytest.raises(TypeError, match="abstract"):
        TrainerBase(TrainConfig())
