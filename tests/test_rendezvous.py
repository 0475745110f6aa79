"""Rendezvous ports: drawn outside the ranges other processes take, distinct per role, and a role whose rank 0 finds
its port taken restarts on a new one (the race CI hit once as EADDRINUSE)."""

import socket

import pytest

from baselines.ray_learner.rendezvous import pick_ports, port_range, start_ranks


class _ActorError(Exception):
    pass


class _Ref:
    def __init__(self, error: str | None):
        self.error = error


class _Method:
    def __init__(self, actor):
        self.actor = actor

    def remote(self):
        return _Ref(self.actor.error)


class _Actor:
    def __init__(self, role, rank, port, error):
        self.role, self.rank, self.port, self.error, self.killed = role, rank, port, error, False
        self.ready = _Method(self)


class _FakeRay:
    class exceptions:
        RayActorError = _ActorError

    def get(self, ref):
        if ref.error:
            raise _ActorError(ref.error)
        return True

    def kill(self, actor):
        actor.killed = True


def _spawner(errors: dict[str, list[str | None]]):
    """``errors[role]``: what rank 0 raises on each successive start (None: it starts)."""
    started: list[_Actor] = []

    def spawn(role, port):
        error = errors.get(role, [None]).pop(0) if errors.get(role) else None
        actors = [_Actor(role, r, port, error if r == 0 else None) for r in range(2)]
        started.extend(actors)
        return actors

    return spawn, started


IN_USE = "DistNetworkError: The server socket has failed to listen ... EADDRINUSE, message: address already in use"


def test_ports_are_distinct_bindable_and_outside_ephemeral_and_ray_ranges():
    ports = pick_ports(3)
    assert len(set(ports)) == 3
    assert all(20000 <= p < 32768 for p in ports)
    for p in ports:  # released again: the rank can bind them
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_never_chosen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
        s.listen()
        with pytest.raises(RuntimeError, match="only 0 of 1"):
            pick_ports(1, low=taken, high=taken + 1)
        assert taken not in pick_ports(1, low=taken, high=taken + 2)


def test_port_range_override(monkeypatch):
    monkeypatch.setenv("MAPPA_RENDEZVOUS_PORTS", "21000-21010")
    assert port_range() == (21000, 21010)
    assert all(21000 <= p < 21010 for p in pick_ports(2))
    monkeypatch.setenv("MAPPA_RENDEZVOUS_PORTS", "nonsense")
    with pytest.raises(ValueError, match="LOW-HIGH"):
        port_range()
    monkeypatch.setenv("MAPPA_RENDEZVOUS_PORTS", "80-90")
    with pytest.raises(ValueError, match="1024"):
        port_range()


def test_a_role_whose_port_was_taken_restarts_on_a_new_port(caplog):
    spawn, started = _spawner({"verifier": [IN_USE, None]})
    workers, retries = start_ranks(_FakeRay(), ["solver", "verifier"], spawn)
    assert retries == 1
    first, second = [a for a in started if a.role == "verifier" and a.rank == 0]
    assert first.killed and not second.killed
    assert all(a.killed for a in started if a.role == "verifier" and a.port == first.port)
    assert workers["verifier"][0] is second and second.port != first.port
    solver_port = next(a.port for a in started if a.role == "solver")
    assert second.port != solver_port  # never another role's port
    assert not any(a.killed for a in started if a.role == "solver")
    assert "verifier: rendezvous port taken" in caplog.text


def test_retries_are_bounded_and_other_failures_raise_at_once():
    spawn, started = _spawner({"solver": [IN_USE, IN_USE, IN_USE, None]})
    with pytest.raises(_ActorError, match="EADDRINUSE"):
        start_ranks(_FakeRay(), ["solver"], spawn, attempts=3)
    assert len([a for a in started if a.rank == 0]) == 3
    assert len({a.port for a in started}) == 3 and all(a.killed for a in started)  # a new port each time, none left
    spawn, started = _spawner({"solver": ["CUDA out of memory", None]})
    with pytest.raises(_ActorError, match="out of memory"):
        start_ranks(_FakeRay(), ["solver", "verifier"], spawn)
    assert len(started) == 4 and all(a.killed for a in started)  # not restarted; no rank outlives the failure
