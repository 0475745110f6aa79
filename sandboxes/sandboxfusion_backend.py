"""SandboxFusion-compatible HTTP backend: run code through a ``/run_code`` service.

SandboxFusion (and compatible services) are stateless: each request carries the files the code needs and names
the files to send back. This backend keeps the episode workspace on the host and, for every block,

1. uploads every workspace file (base64) with the code,
2. wraps the code so that, when it exits, it packs the working directory into one tar file,
3. fetches that tar and unpacks it safely into the workspace (no absolute paths, no ``..``, no links), deleting
   the files the code deleted.

That round trip is the cost a persistent workspace avoids (``python -m benchmarks.sandbox_latency`` prints it).
A block killed by the service's timeout cannot pack its files: its file changes are lost, and the result says
so. Isolation is whatever the service provides, so :attr:`isolated` is False here.

    make_sandbox("sandboxfusion", url="http://localhost:8080")

The API key, if the service needs one, is read from the environment variable named by ``api_key_env``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request

from .base import ExecResult, ExecStatus, Limits, Sandbox, Session, check_env
from .files import snapshot

PACK = ".mappa_out.tar"
_WRAPPER = """\
import atexit as _mappa_atexit


def _mappa_pack():
    import os, tarfile
    with tarfile.open({pack!r}, "w") as tar:
        for name in os.listdir("."):
            if name != {pack!r}:
                tar.add(name)


_mappa_atexit.register(_mappa_pack)
del _mappa_atexit, _mappa_pack
__import__("os").environ.update({env!r})
__mappa_source = {source!r}
exec(compile(__mappa_source, "cell.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
"""


class SandboxFusionSession(Session):
    def run(self, code: str, *, timeout_s: float | None = None, env=None) -> ExecResult:
        if self.closed:
            raise RuntimeError("session is closed")
        sb: SandboxFusionSandbox = self.sandbox  # type: ignore[assignment]
        extra = self.env_for(env)
        timeout = sb.limits.timeout_s if timeout_s is None else timeout_s
        self.executions += 1
        before = snapshot(self.workspace)
        files = {}
        for path in before:  # regular files only: links, pipes, sockets, hard links are not sent (nor read)
            try:
                files[path] = base64.b64encode(self.read_file(path)).decode("ascii")
            except (OSError, ValueError):
                pass
        request = {
            "code": _WRAPPER.format(pack=PACK, source=code, env=extra),
            "language": "python",
            "run_timeout": timeout,
            "compile_timeout": timeout,
            "memory_limit_MB": sb.limits.memory_mb,
            "files": files,
            "fetch_files": [PACK],
        }
        start = time.monotonic()
        try:
            reply = sb.post("/run_code", request, timeout + sb.request_grace_s)
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
            message = f"service unreachable or failed: {e}"
            return ExecResult(ExecStatus.ERROR, None, "", "", time.monotonic() - start, backend=sb.name, error=message)
        duration = time.monotonic() - start
        run = reply.get("run_result") or {}
        stdout, stderr = _cap(run.get("stdout") or "", sb.limits), _cap(run.get("stderr") or "", sb.limits)
        exit_code = run.get("return_code")
        message = None
        packed = (reply.get("files") or {}).get(PACK)
        if packed:
            self._unpack(base64.b64decode(packed))
        elif reply.get("status") != "SandboxError":
            message = "the service returned no workspace archive: file changes of this block are lost"
        run_status = run.get("status")
        if reply.get("status") == "SandboxError":
            status, message = ExecStatus.ERROR, f"service error: {reply.get('message', '')}"
        elif run_status == "TimeLimitExceeded":
            status = ExecStatus.TIMEOUT
            message = "execution timed out (file changes of this block are lost)"
        elif exit_code == 0:
            status = ExecStatus.OK
        elif "MemoryError" in (stderr[0].strip().splitlines() or [""])[-1]:
            status, message = ExecStatus.OOM, "memory limit reached"
        else:
            status = ExecStatus.ERROR
        return self.result(status, exit_code, stdout, stderr, duration, before, sb.name, message)

    def _unpack(self, data: bytes) -> None:
        """Replace the workspace's content with the archive's, refusing anything unsafe."""
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = []
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()):
                    continue  # links, devices, fifos: never materialised on the host
                if os.path.isabs(m.name) or ".." in m.name.split("/"):
                    continue
                members.append(m)
            kept = {os.path.normpath(m.name) for m in members if m.isfile()}
            for path in snapshot(self.workspace):
                if os.path.normpath(path) not in kept:
                    (self.workspace / path).unlink(missing_ok=True)
            for m in members:
                target = self.workspace / m.name
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                src = tar.extractfile(m)
                if src is None:
                    continue
                with src:
                    if target.is_file() and target.stat().st_size == m.size:
                        data = src.read()
                        if target.read_bytes() == data:
                            continue  # unchanged: keep the file (and its mtime) as it is
                        target.write_bytes(data)
                    else:
                        with open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst)


def _cap(text: str, limits: Limits) -> tuple[str, bool]:
    from .output import OutputCap

    cap = OutputCap(limits.output_bytes)
    cap.feed(text.encode("utf-8", errors="replace"))
    return cap.text()


class SandboxFusionSandbox(Sandbox):
    """A client of a SandboxFusion-compatible ``/run_code`` service."""

    name = "sandboxfusion"
    isolated = False  # the service's isolation, not verifiable from here
    enforces = frozenset({"timeout_s", "memory_mb", "output_bytes"})

    def __init__(
        self,
        url: str = "http://localhost:8080",
        limits: Limits | None = None,
        api_key_env: str | None = None,
        request_grace_s: float = 30.0,
    ):
        super().__init__(limits)
        self.url = url.rstrip("/")
        self.api_key_env = api_key_env
        self.request_grace_s = request_grace_s

    def post(self, path: str, payload: dict, timeout: float) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ValueError(f"environment variable {self.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url + path, json.dumps(payload).encode(), headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def session(self, workspace=None, keep_workspace: bool = False, env=None) -> SandboxFusionSession:
        env = check_env(env)
        s = SandboxFusionSession(self, workspace, keep_workspace)
        s.env = env
        return s
