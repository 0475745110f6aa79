"""What a training run shows on its console, and where the libraries' own output goes instead.

`mappa train`'s console carries the configuration, the trainer's progress lines and the result. Everything the
libraries say (Ray, vLLM, DeepSpeed, transformers, torch, Hugging Face Hub, HTTP clients: their logging, Python
warnings, progress bars, and in the actors whatever C code writes to stdout/stderr) goes to files in the run
folder's ``logs/``:

    logs/driver.log                      the driver's Python logging and warnings
    logs/engine-<role>.log               a vLLM engine actor's stdout and stderr
    logs/trainer-<role>-rank<r>.log      a DeepSpeed rank actor's stdout and stderr

:func:`setup_run_logging` configures the driver; :func:`redirect_actor_output` is the first call in each actor's
``__init__``. With ``verbose`` (``mappa train --verbose``) the driver's records also go to stderr and the actors'
output is left to Ray, which forwards it to the console as before.

Only the standard library is imported at module level: the libraries are imported (when installed) inside the
functions.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Imported by setup_run_logging (when installed) so that the console handlers they install at import time exist, and
# are removed, before the trainer's first message: every `mappa train` imports them within seconds anyway.
PRELOAD = ("torch", "transformers.utils.logging", "huggingface_hub.utils", "ray")
# Warnings raised from these folders (the project's own code) are meant for the user: still shown on the console.
_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the four packages
_PROJECT = tuple(str(_ROOT / name) + os.sep for name in ("baselines", "mappa_envs", "sandboxes", "benchmarks"))
_TAG = "_mappa_console"  # marks the handlers installed here (idempotence, reset)
_saved_root_level: int | None = None


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted (like logging's last resort)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


class _ProjectWarnings(logging.Filter):
    """Passes the ``py.warnings`` records of warnings raised in the project's own code."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage().startswith(_PROJECT)


def _tagged(handler: logging.Handler, fmt: str = FORMAT) -> logging.Handler:
    handler.setFormatter(logging.Formatter(fmt))
    setattr(handler, _TAG, True)
    return handler


def _writes_to_console(handler: logging.Handler) -> bool:
    if getattr(handler, _TAG, False) or isinstance(handler, logging.FileHandler):
        return False
    if not isinstance(handler, logging.StreamHandler):
        return False
    stream = getattr(handler, "stream", None)
    if stream is None:
        return False
    if any(stream is s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        return True
    try:
        return stream.fileno() in (1, 2)
    except Exception:  # a stream without a file descriptor (StringIO, a test's capture): not the console
        return False


def _remove_ours(logger: logging.Logger) -> None:
    for h in [h for h in logger.handlers if getattr(h, _TAG, False)]:
        logger.removeHandler(h)
        h.close()


def _quiet_libraries(verbose: bool, preload: bool) -> None:
    """Libraries' loggers without console handlers of their own (their records propagate to the root logger) and,
    unless ``verbose``, their progress bars off. ``preload`` imports :data:`PRELOAD` first (those installed)."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM then installs no handler (it reads it at import)
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is imported
    if preload:
        for name in PRELOAD:
            try:
                if name in sys.modules or importlib.util.find_spec(name.partition(".")[0]) is not None:
                    importlib.import_module(name)
            except Exception:  # a broken optional install is the trainer's to report, not this module's
                pass
    if "transformers.utils.logging" in sys.modules:
        tlog = sys.modules["transformers.utils.logging"]
        tlog.disable_default_handler()  # configures transformers' logger once, without its stderr handler
        tlog.enable_propagation()
        if not verbose:
            tlog.disable_progress_bar()  # "Loading weights"
    if not verbose and "huggingface_hub.utils" in sys.modules:
        try:
            sys.modules["huggingface_hub.utils"].disable_progress_bars()
        except Exception:
            pass
    for logger in list(logging.root.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue
        console = [h for h in logger.handlers if _writes_to_console(h)]
        for h in console:
            logger.removeHandler(h)
        if console:
            logger.propagate = True


def _capture_warnings() -> None:
    # off then on: logging remembers the showwarning it replaced, which a warnings.catch_warnings() block (pytest's,
    # around every test) may have restored since
    logging.captureWarnings(False)
    logging.captureWarnings(True)


def setup_run_logging(out_dir: Path, verbose: bool) -> Path:
    """Send the driver's Python logging (the root logger and every library's) and Python warnings to
    ``out_dir/logs/driver.log``; with ``verbose`` also to stderr, otherwise nothing of the libraries reaches the
    console (warnings raised by the project's own code still do) and their progress bars are off. Returns the log
    folder. Calling it again replaces the handlers it installed (none is duplicated)."""
    global _saved_root_level
    log_dir = Path(out_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    _quiet_libraries(verbose, preload=True)
    root = logging.getLogger()
    warn = logging.getLogger("py.warnings")
    _remove_ours(root)
    _remove_ours(warn)
    root.addHandler(_tagged(logging.FileHandler(log_dir / "driver.log", encoding="utf-8")))
    if verbose:
        root.addHandler(_tagged(_Stderr()))
    else:
        project = _tagged(_Stderr(), "%(message)s")
        project.addFilter(_ProjectWarnings())
        warn.addHandler(project)  # and on to the root logger's file
    if _saved_root_level is None:
        _saved_root_level = root.level
    root.setLevel(logging.INFO)
    _capture_warnings()
    return log_dir


def redirect_actor_output(log_dir: str | None, name: str) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, so C libraries' output too) at
    ``log_dir/<name>.log`` (appended to, line-buffered), and configure logging and warnings as the driver's, into
    that file. The first call in a Ray actor's ``__init__``. ``log_dir`` ``None``: nothing changes (Ray forwards
    the actor's output to the driver's console)."""
    if log_dir is None:
        return
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    fd = os.open(folder / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    # the process's streams for the rest of its life, hence no context manager
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    _quiet_libraries(verbose=False, preload=False)  # the actor imports its libraries itself, after this
    root = logging.getLogger()
    _remove_ours(root)
    root.addHandler(_tagged(_Stderr()))  # stderr is the file now
    root.setLevel(logging.INFO)
    _capture_warnings()


def reset_run_logging() -> None:
    """Undo :func:`setup_run_logging` in this process (for tests): its handlers removed and closed, warnings no
    longer captured, the root logger's level restored. The libraries' removed console handlers stay removed."""
    global _saved_root_level
    _remove_ours(logging.getLogger())
    _remove_ours(logging.getLogger("py.warnings"))
    logging.captureWarnings(False)
    if _saved_root_level is not None:
        logging.getLogger().setLevel(_saved_root_level)
        _saved_root_level = None
