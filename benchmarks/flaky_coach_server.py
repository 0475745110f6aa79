"""A local OpenAI-compatible chat server for coach benchmarks and tests: fixed latency, injected failures.

It speaks ``POST /v1/chat/completions`` like ``vllm serve`` and hosted APIs, so the real ``openai`` client and the
real :class:`~mappa_envs.coach.OpenAIChatBackend` talk to it over HTTP. Each request, drawn from a seeded RNG, is
answered normally (a reasoning line and ``PROCESS_SCORE: n``), or fails: HTTP 500, a reply slower than the
client's timeout, or a garbage reply without a score. It listens on 127.0.0.1 only.

With ``fail_every=k`` the failures are fixed instead of drawn: the server numbers the distinct requests in the
order they first arrive (a request is keyed by its first two messages, so a retry or a re-prompt of one action is
the same request) and every k-th one, the first included, fails on every attempt, HTTP 500 and a reply without a
score in turn. A run that sends n distinct requests then sees exactly ceil(n / k) of them fail, whatever the order
its threads send them in.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FlakyCoachServer:
    def __init__(
        self,
        failure_rate: float = 0.0,
        latency_s: float = 0.0,
        hang_s: float = 5.0,
        seed: int = 0,
        fail_every: int = 0,
    ):
        self.failure_rate, self.latency_s, self.hang_s, self.fail_every = failure_rate, latency_s, hang_s, fail_every
        self._rng = random.Random(seed)
        self._seen: dict[str, str] = {}  # fail_every: a distinct request's fixed outcome
        self._open = threading.Event()  # hold(): every reply waits until release()
        self._open.set()
        self.in_flight = self.max_in_flight = 0  # requests received and not yet answered
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server._count(+1)
                try:
                    server._open.wait()
                    self._answer(body)
                finally:
                    server._count(-1)

            def _answer(self, body: dict) -> None:
                kind = server._draw(body)
                if server.latency_s:
                    time.sleep(server.latency_s)
                if kind == "http500":
                    self._send(500, {"error": {"message": "injected failure", "type": "server_error"}})
                    return
                if kind == "hang":
                    time.sleep(server.hang_s)
                text = "It looks reasonable." if kind == "garbage" else server._reply(body)
                self._send(
                    200,
                    {
                        "id": "chatcmpl-local",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "local"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): expected for "hang"

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def hold(self) -> None:
        """Answer nothing until :meth:`release`: the requests that arrive meanwhile are counted in ``in_flight``."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _count(self, step: int) -> None:
        with self._lock:
            self.in_flight += step
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _draw(self, body: dict) -> str:
        with self._lock:
            if self.fail_every:
                key = json.dumps(body.get("messages", [])[:2], sort_keys=True)
                if key not in self._seen:
                    n = len(self._seen)
                    fails = n % self.fail_every == 0
                    self._seen[key] = ("http500" if (n // self.fail_every) % 2 == 0 else "garbage") if fails else "ok"
                kind = self._seen[key]
                self.outcomes[kind] += 1
                return kind
            r = self._rng.random()
            if r < self.failure_rate / 3:
                kind = "http500"
            elif r < 2 * self.failure_rate / 3:
                kind = "hang"
            elif r < self.failure_rate:
                kind = "garbage"
            else:
                kind = "ok"
            self.outcomes[kind] += 1
            return kind

    @property
    def failing_requests(self) -> int:
        """With ``fail_every``: how many distinct requests were given a fixed failure."""
        with self._lock:
            return sum(kind != "ok" for kind in self._seen.values())

    @staticmethod
    def _reply(body: dict) -> str:
        prompt = json.dumps(body.get("messages", []))
        score = 3 + len(prompt) % 6  # deterministic in the input
        answer = "\nANSWER_CORRECT: 1" if "ANSWER_CORRECT" in prompt else ""
        return f"The action does its job reasonably.\nPROCESS_SCORE: {score}{answer}"

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
