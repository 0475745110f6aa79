"""Rendezvous ports for each role's DeepSpeed process group, and starting its ranks with a retry.

A role's ranks meet on a TCP port that rank 0 listens on. Picking "a free port" and handing it to a process that
binds it seconds later is a race: in between, any outgoing connection (Ray's gRPC, vLLM's ZMQ sockets) may take the
same port from the kernel's ephemeral range (CI saw ``EADDRINUSE`` once in ~700 tests). So ports are drawn *below*
the ephemeral range and above Ray's worker ports, distinct across roles, and a role whose rank 0 still finds its
port taken is restarted on a new port (a bounded number of times, each retry logged).

>>> ports = pick_ports(3, low=20000, high=20100)
>>> len(set(ports)) == 3 and all(20000 <= p < 20100 for p in ports)
True
>>> port_in_use(RuntimeError("DistNetworkError: ... EADDRINUSE, message: address already in use"))
True
>>> port_in_use(RuntimeError("out of memory"))
False
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Callable, Set
from typing import Any

log = logging.getLogger(__name__)

# Ray's worker processes take 10002-19999 by default; Linux's ephemeral range starts at 32768
DEFAULT_RANGE = (20000, 32768)


def port_range() -> tuple[int, int]:
    """``MAPPA_RENDEZVOUS_PORTS=LOW-HIGH`` (HIGH exclusive) overrides the default 20000-32768."""
    spec = os.environ.get("MAPPA_RENDEZVOUS_PORTS")
    if not spec:
        return DEFAULT_RANGE
    try:
        low, high = (int(x) for x in spec.split("-"))
    except ValueError:
        raise ValueError(f"MAPPA_RENDEZVOUS_PORTS={spec!r}: expected LOW-HIGH, e.g. 20000-32768") from None
    if not 1024 <= low < high <= 65536:
        raise ValueError(f"MAPPA_RENDEZVOUS_PORTS={spec!r}: need 1024 <= LOW < HIGH <= 65536")
    return low, high


def pick_ports(
    n: int, *, low: int | None = None, high: int | None = None, tries: int = 200, exclude: Set[int] = frozenset()
) -> list[int]:
    """``n`` distinct ports in ``[low, high)``, none in ``exclude`` (ports given out already), that could be bound
    now on 127.0.0.1 (each is held until all are chosen, so two roles never get the same one)."""
    if low is None or high is None:
        low, high = port_range()
    held: list[socket.socket] = []
    try:
        for port in random.sample(range(low, high), min(tries, high - low)):
            if len(held) == n:
                break
            if port in exclude:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise RuntimeError(f"found only {len(held)} of {n} free rendezvous ports in {low}-{high}")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def port_in_use(err: BaseException) -> bool:
    text = str(err)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def start_ranks(
    ray,
    roles: list[str],
    spawn: Callable[[str, int], list[Any]],
    *,
    attempts: int = 3,
) -> tuple[dict[str, list[Any]], int]:
    """Start every role's ranks (``spawn(role, port)`` returns its actors) and wait until they are ready. A role
    whose rank 0 could not listen on its port is killed and started again on a fresh one, up to ``attempts`` times
    in all; any other failure is raised at once. Returns the actors per role and the number of retries."""
    ports = pick_ports(len(roles))
    given = set(ports)
    workers = {role: spawn(role, port) for role, port in zip(roles, ports, strict=True)}
    retries = 0
    try:
        for role in roles:
            for attempt in range(1, attempts + 1):
                try:
                    # rank 0 first: when it dies, the other ranks wait on its store and would never answer
                    for w in workers[role]:
                        ray.get(w.ready.remote())
                    break
                except ray.exceptions.RayActorError as err:
                    if not port_in_use(err) or attempt == attempts:
                        raise
                    for w in workers[role]:
                        ray.kill(w)
                    (port,) = pick_ports(1, exclude=given)  # never another role's port, nor a taken one again
                    given.add(port)
                    log.warning("%s: rendezvous port taken; its ranks restart on port %d (try %d)", role, port, attempt)
                    workers[role] = spawn(role, port)
                    retries += 1
    except BaseException:
        for ws in workers.values():  # no rank outlives a failed start
            for w in ws:
                ray.kill(w)
        raise
    return workers, retries
