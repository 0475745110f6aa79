"""Sandbox latency per backend and execution mode, beside a bare interpreter, and the cost of a stateless call.

    python -m benchmarks.sandbox_latency [--repeat 20] [--import-repeat 8] [--backends subprocess,bubblewrap,docker]

For each available backend and mode (fresh process per block, or the warm forking worker) it prints the p50 and
p95 latency of ``print(1)`` and of a block importing pandas and scikit-learn, with the session start-up (container,
worker) measured apart; the reference is ``python -c`` in a bare subprocess. It then prints the cost of a
SandboxFusion-style stateless call that re-uploads a 50 MB workspace on every block, against running the same block
in a persistent workspace (both on the subprocess backend, so the difference is the transfer).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from sandboxes import Limits, make_sandbox
from sandboxes.fusion_server import serve_in_thread

PRINT = "print(1)"
IMPORT = "import pandas, sklearn, sklearn.ensemble\nprint(pandas.__version__)"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def row(label: str, xs: list[float]) -> None:
    print(f"{label:<46}{statistics.median(xs) * 1e3:>10.1f}{pct(xs, 0.95) * 1e3:>10.1f}{len(xs):>6}")


def check(result) -> None:
    if not result.ok:
        raise RuntimeError(f"benchmark block failed: {result.status} {result.error} {result.stderr[-300:]}")


def bench_backends(backends: list[str], repeat: int, import_repeat: int) -> dict[tuple[str, str], float]:
    limits = Limits(timeout_s=60, memory_mb=2048)
    p50_import: dict[tuple[str, str], float] = {}
    for backend in backends:
        for mode in ("fresh", "warm"):
            try:
                sandbox = make_sandbox(backend, limits=limits, mode=mode)
            except Exception as e:
                print(f"{backend}/{mode}: unavailable ({e})")
                break
            t = time.perf_counter()
            with sandbox.session() as s:
                check(s.run(PRINT))  # container start / worker start and preload
                startup = time.perf_counter() - t
                xs = timed(lambda s=s: check(s.run(PRINT)), repeat)
                ys = timed(lambda s=s: check(s.run(IMPORT)), import_repeat)
            sandbox.close()
            print(f"{backend}/{mode}: session start-up and first block {startup * 1e3:.0f} ms")
            row(f"  {backend}/{mode} print(1)", xs)
            row(f"  {backend}/{mode} import pandas+sklearn", ys)
            p50_import[(backend, mode)] = statistics.median(ys)
    return p50_import


def bench_stateless(repeat: int, size_mb: int = 50) -> None:
    limits = Limits(timeout_s=60, memory_mb=4096)
    server, url = serve_in_thread(make_sandbox("subprocess", limits=limits))
    try:
        fusion = make_sandbox("sandboxfusion", url=url, limits=limits)
        local = make_sandbox("subprocess", limits=limits)
        with fusion.session() as fs, local.session() as ls:
            for s in (fs, ls):
                for i in range(size_mb // 10):
                    s.write_file(f"data/part{i}.bin", os.urandom(10 * 1024 * 1024))
            stateless = timed(lambda: check(fs.run(PRINT)), repeat)
            persistent = timed(lambda: check(ls.run(PRINT)), repeat)
    finally:
        server.shutdown()
    print(f"workspace of {size_mb} MB, block print(1):")
    row("  stateless (SandboxFusion-style re-upload)", stateless)
    row("  persistent workspace (subprocess/fresh)", persistent)
    print(f"  stateless / persistent (p50): {statistics.median(stateless) / statistics.median(persistent):.1f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--import-repeat", type=int, default=8)
    ap.add_argument("--backends", default="subprocess,bubblewrap,docker")
    args = ap.parse_args(argv)
    print(f"{'what':<46}{'p50 ms':>10}{'p95 ms':>10}{'n':>6}")
    row(
        "reference: bare `python -c 'print(1)'`",
        timed(lambda: subprocess.run([sys.executable, "-c", PRINT], check=True, capture_output=True), args.repeat),
    )
    row(
        "reference: bare `python -c 'import pandas...'`",
        timed(
            lambda: subprocess.run([sys.executable, "-c", IMPORT], check=True, capture_output=True), args.import_repeat
        ),
    )
    p50 = bench_backends(args.backends.split(","), args.repeat, args.import_repeat)
    print("warm speed-up on the pandas+sklearn block (p50 fresh / p50 warm):")
    for backend in args.backends.split(","):
        if (backend, "fresh") in p50 and (backend, "warm") in p50:
            print(f"  {backend}: {p50[(backend, 'fresh')] / p50[(backend, 'warm')]:.0f}x")
    bench_stateless(max(5, args.repeat // 4))


if __name__ == "__main__":
    main()
