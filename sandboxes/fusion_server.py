"""A SandboxFusion-compatible ``/run_code`` endpoint served by any mappa backend.

For users who want the stateless HTTP protocol without the SandboxFusion service, and for the tests of the
SandboxFusion client backend. Each request runs in a fresh session of the configured backend (a fresh
container, bubblewrap namespace or process), with the request's files written into its workspace::

    python -m sandboxes serve --backend bubblewrap --port 8080

Request: ``{"code", "language": "python", "run_timeout", "memory_limit_MB", "files": {path: base64},
"fetch_files": [path]}``. Reply: ``{"status": "Success"|"Failed"|"SandboxError", "message", "run_result":
{"status": "Finished"|"TimeLimitExceeded"|"Error", "execution_time", "return_code", "stdout", "stderr"},
"files": {path: base64}}``. It listens on 127.0.0.1 by default.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .base import ExecStatus, Sandbox


def handle_run_code(sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
    if req.get("language", "python") != "python":
        return {"status": "SandboxError", "message": f"unsupported language {req.get('language')!r}"}
    code = req.get("code")
    if not isinstance(code, str):
        return {"status": "SandboxError", "message": "'code' must be a string"}
    timeout = float(req.get("run_timeout") or sandbox.limits.timeout_s)
    with sandbox.session() as session:
        try:
            for path, b64 in (req.get("files") or {}).items():
                session.write_file(path, base64.b64decode(b64))
        except (ValueError, TypeError) as e:
            return {"status": "SandboxError", "message": f"bad files: {e}"}
        result = session.run(code, timeout_s=timeout)
        files = {}
        for path in req.get("fetch_files") or []:
            try:
                files[path] = base64.b64encode(session.read_file(path)).decode("ascii")
            except (OSError, ValueError):
                pass
    run_status = {ExecStatus.TIMEOUT: "TimeLimitExceeded", ExecStatus.OK: "Finished"}.get(result.status, "Finished")
    return {
        "status": "Success" if result.ok else "Failed",
        "message": result.error or "",
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": result.duration_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": files,
    }


def make_server(sandbox: Sandbox, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/run_code":
                self.send_error(404)
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                reply = handle_run_code(sandbox, req)
                code = 200
            except Exception as e:  # a bad request must not take the server down
                reply, code = {"status": "SandboxError", "message": f"{type(e).__name__}: {e}"}, 500
            body = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    return ThreadingHTTPServer((host, port), Handler)


def serve_in_thread(sandbox: Sandbox, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a free port in a daemon thread; returns it and its URL (call ``shutdown()`` to stop)."""
    server = make_server(sandbox, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"
