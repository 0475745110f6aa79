"""A DeepSpeed rank's set-up checks (baselines/ray_learner/ds_setup.py) that need no rank."""

import os
import time

import pytest

from baselines.ray_learner.ds_setup import STALE_LOCK_S, check_extension_locks, extensions_root


def test_a_stale_extension_build_lock_is_an_error_that_names_it_and_a_fresh_one_is_waited_on(tmp_path, monkeypatch):
    """A build killed half-way leaves ``lock`` in its folder and torch's builder would wait on it forever: the rank
    raises instead, naming the file. A young lock (a build under way in another process) and a finished build's
    folder (no lock) pass."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions_root() == tmp_path
    done = tmp_path / "py311_cpu" / "cpu_adam"
    done.mkdir(parents=True)
    (done / "cpu_adam.so").write_bytes(b"")
    building = tmp_path / "deepspeed_shm_comm"
    building.mkdir()
    (building / "lock").touch()
    check_extension_locks()  # a build in progress: waited on, no error
    killed = tmp_path / "py311_cpu" / "fused_adam"
    killed.mkdir()
    (killed / "lock").touch()
    old = time.time() - STALE_LOCK_S - 60
    os.utime(killed / "lock", (old, old))
    with pytest.raises(RuntimeError, match="fused_adam/lock") as err:
        check_extension_locks()
    assert "deepspeed_shm_comm" not in str(err.value) and "rm " in str(err.value)
    (killed / "lock").unlink()
    check_extension_locks()
