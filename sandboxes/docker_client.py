"""The Docker SDK client of the local engine, shared by the Docker backend and the image builder."""

from __future__ import annotations


def docker_client(timeout: float = 60.0):
    """A Docker SDK client for the local engine; raises a clear error when there is none."""
    try:
        import docker
    except ImportError:
        raise RuntimeError("the Docker backend needs the 'docker' extra: pip install 'mappa-envs[docker]'") from None
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as e:
        raise RuntimeError(
            f"no Docker engine reachable ({e}); start one (e.g. `dockerd --iptables=false --bridge=none &`) "
            "or use the 'subprocess' backend"
        ) from None
    return client
