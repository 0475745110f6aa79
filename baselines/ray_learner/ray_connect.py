"""Which Ray cluster a command's Ray work runs on, and joining it with Ray's token authentication.

``--ray-address`` (or ``RAY_ADDRESS``, which the option sets) names a cluster started with ``ray start`` (or KubeRay):
``HOST:PORT`` of its head (the GCS port ``ray start --head --port`` opened), ``auto`` (the cluster ``ray start`` last
recorded on this machine) or ``ray://HOST:PORT`` (Ray Client). Without one, or with ``local``, mappa starts a local
cluster of its own, as before, and says in one line when a ``ray start`` cluster runs here that it could join instead.

**Token authentication.** A cluster whose head ``ray start`` began with a token (Ray 2.60 does so whenever a token
exists: ``~/.ray/auth_token``, which any local ``ray.init()`` writes) refuses a driver without the token. Ray itself
picks the token up only for a cluster it finds itself (``auto``); for a given address it needs ``RAY_AUTH_MODE=token``
and otherwise retries with a wall of ``InvalidAuthToken`` warnings. Before Ray is started,
:func:`join` asks the head once, without a token, whether it needs one (``GetClusterId``, a few seconds), and:

- it does not: nothing is sent or changed;
- it does, and ``RAY_AUTH_MODE`` is unset: Ray's own rule for a cluster found locally
  (``maybe_enable_token_auth_if_token_available``) turns token mode on for this process and its children, with the
  token Ray finds, in Ray's order: ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``;
  the head is then asked again with it;
- ``RAY_AUTH_MODE`` set by hand is obeyed, never overridden.

Nothing turns a cluster's security off. Any failure (nothing answers, a token is needed and none is found, the token is
refused) raises :class:`RayConnectError`, whose one paragraph names the address, where it came from, the auth mode and
what to set, instead of Ray's retries.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

# Ray and grpc are imported inside the functions that use them: importing this module (the CLI, the checks, a dry run)
# loads none of them.

LOCAL = "local"
"""``--ray-address local``: a local cluster of mappa's own even where ``RAY_ADDRESS`` is set."""

PROBE_TIMEOUT_S = 8.0
"""How long one question to the head may take (the wrong-token case asks twice)."""

_TOKEN_HELP = (
    "copy the token the cluster was started with (on the head: `ray get-auth-token`, or its ~/.ray/auth_token) into "
    "~/.ray/auth_token on this machine, or point RAY_AUTH_TOKEN_PATH at a file holding it (RAY_AUTH_TOKEN=<token> "
    "works too, but shows the token to every process that reads the environment)"
)
_LOCAL_HELP = (
    "or run without --ray-address / RAY_ADDRESS (or with --ray-address local) for a local cluster of mappa's own"
)


class RayConnectError(ConnectionError):
    """The Ray cluster named by ``--ray-address`` / ``RAY_ADDRESS`` cannot be joined; the message says why and what
    to set."""


@dataclass(frozen=True)
class Target:
    """Where the Ray work of a command runs: ``address`` None is a local cluster of mappa's own."""

    address: str | None
    source: str
    """Where the address came from: ``--ray-address`` / ``RAY_ADDRESS``, or ``auto`` resolved."""


def target(given: str | None = None) -> Target:
    """The cluster named by ``given`` (``--ray-address``), else by ``RAY_ADDRESS``; ``local`` or nothing: our own."""
    if given is not None:
        address, source = given.strip(), "--ray-address"
    else:  # the command's --ray-address sets RAY_ADDRESS, and says so in MAPPA_RAY_ADDRESS_FROM
        address, source = (
            os.environ.get("RAY_ADDRESS", "").strip(),
            os.environ.get("MAPPA_RAY_ADDRESS_FROM", "RAY_ADDRESS"),
        )
    if not address or address == LOCAL:
        return Target(None, source)
    return Target(address, source)


def auth_mode() -> str:
    """This process's auth mode as Ray reads it: ``RAY_AUTH_MODE`` (``disabled`` when unset)."""
    return os.environ.get("RAY_AUTH_MODE", "").strip().lower() or "disabled"


def token_source() -> tuple[str | None, str]:
    """Where Ray would take the token from, in its order (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``), and a problem with it ("" when none): (None, why) when there is no token."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN", ""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:  # Ray aborts the process on an unreadable or empty file named here: say so before it does
        try:
            text = Path(path).expanduser().read_text().strip()
        except OSError as err:
            return None, f"RAY_AUTH_TOKEN_PATH={path} cannot be read ({err.strerror or err})"
        return (f"RAY_AUTH_TOKEN_PATH={path}", "") if text else (None, f"RAY_AUTH_TOKEN_PATH={path} is empty")
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file() and default.read_text().strip():
        return str(default), ""
    return None, f"no token here (RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH unset, no {default})"


def _gcs_address(t: Target) -> str:
    """``host:port`` of the head's GCS (``auto`` resolved as Ray resolves it)."""
    if t.address != "auto":
        return t.address  # type: ignore[return-value]
    from ray._private import services

    try:
        return services.canonicalize_bootstrap_address_or_die("auto")
    except ConnectionError as err:
        raise RayConnectError(
            f"could not find the Ray cluster to join ({t.source}=auto): {err} Give its head's HOST:PORT "
            f"instead, {_LOCAL_HELP}."
        ) from None


def ask_head(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Ask the head at ``address`` for its cluster id, as this process's auth mode stands (Ray's own gRPC channel:
    its TLS settings, and the token when token mode is on): ``ok``, ``unauthenticated`` or ``unreachable: <detail>``."""
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, wait_for_ready=True)
        return "ok"
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            return "unauthenticated"
        return f"unreachable: {err.code().name} ({err.details()})"
    finally:
        channel.close()


def _enable_token_mode() -> None:
    """Token mode for this process and its children, by Ray's own rule for a cluster it finds locally (a token must be
    available; ``RAY_AUTH_MODE`` unset)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without that helper: the variable alone (read when Ray starts)
        os.environ["RAY_AUTH_MODE"] = "token"
        return

    # its warning ("Set RAY_AUTH_MODE=disabled to opt out") is meant for a cluster it starts, not for joining one
    quiet = logging.getLogger(maybe_enable_token_auth_if_token_available.__module__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)


@dataclass(frozen=True)
class Joined:
    """A cluster that accepts this process: ``ray.init(address=...)``, and the console line that says so."""

    address: str
    line: str


def join(given: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> Joined | None:
    """The cluster named by ``given`` / ``RAY_ADDRESS`` once it is known to accept this process (token mode turned on
    where the head needs it and a token is found), or None for a local cluster of our own. Raises
    :class:`RayConnectError` with what to set."""
    t = target(given)
    if t.address is None:
        return None
    if t.address.startswith("ray://"):  # Ray Client: its server, not the GCS; Ray checks it when it connects
        return Joined(t.address, f"[ray] joining {t.address} with Ray Client ({t.source})")
    address = _gcs_address(t)
    where = f"the Ray cluster at {address} ({t.source}={t.address})"
    source, problem = token_source()
    if auth_mode() == "token" and source is None:  # Ray would abort on a token file it cannot read
        raise RayConnectError(
            f"cannot join {where}: RAY_AUTH_MODE=token and {problem}. To join it, {_TOKEN_HELP}; {_LOCAL_HELP}."
        )
    answer = ask_head(address, timeout_s)
    if answer == "unauthenticated" and "RAY_AUTH_MODE" not in os.environ:
        if source is None:
            raise RayConnectError(
                f"cannot join {where}: the cluster uses token authentication and {problem}. To join it, "
                f"{_TOKEN_HELP}; {_LOCAL_HELP}."
            )
        _enable_token_mode()
        answer = ask_head(address, timeout_s)
    if answer == "ok":
        mode = auth_mode()
        auth = f"token authentication, the token from {token_source()[0]}" if mode == "token" else f"auth mode {mode}"
        return Joined(address, f"[ray] joining the Ray cluster at {address} ({t.source}={t.address}; {auth})")
    mode = auth_mode()
    if answer.startswith("unreachable"):
        raise RayConnectError(
            f"cannot join {where}: nothing answered within {timeout_s:g} s ({answer.split(': ', 1)[1]}; auth "
            f"mode here: {mode}). Check that the head runs (`ray start --head --port PORT` prints the address) and "
            f"that this machine reaches HOST:PORT: the GCS port, not the dashboard's (8265) or Ray Client's "
            f"(10001, which takes ray://HOST:10001); {_LOCAL_HELP}."
        )
    if mode != "token":
        raise RayConnectError(
            f"cannot join {where}: the cluster uses token authentication and RAY_AUTH_MODE={mode} here. Unset "
            f"RAY_AUTH_MODE (mappa then uses the token Ray finds) or set RAY_AUTH_MODE=token, and {_TOKEN_HELP}; "
            f"{_LOCAL_HELP}."
        )
    raise RayConnectError(
        f"cannot join {where}: the cluster uses token authentication and refused the token from {source} "
        f"(auth mode here: token). To join it, {_TOKEN_HELP}; {_LOCAL_HELP}."
    )


def recorded_cluster() -> str | None:
    """The address of a live cluster that ``ray start`` recorded on this machine (what ``auto`` would join), if any."""
    try:
        from ray._private import services
    except ImportError:
        return None
    address = services.find_bootstrap_address(None)
    if not address:
        return None
    try:
        return address if address in services.find_gcs_addresses() else None
    except Exception:  # it greps the process list: informational only
        return None


__all__ = [
    "LOCAL",
    "PROBE_TIMEOUT_S",
    "Joined",
    "RayConnectError",
    "Target",
    "ask_head",
    "auth_mode",
    "join",
    "recorded_cluster",
    "target",
    "token_source",
]
