"""The sandbox rootfs and image, built offline: a Debian rootfs from ``debootstrap``, imported with ``docker import``.

No registry is needed. The rootfs is Debian bookworm (``minbase``) with python3, numpy, pandas, scikit-learn and
scipy from Debian's own packages, fetched from the Debian mirror the host's apt already uses. The image tag carries
a version (:data:`IMAGE_VERSION`): change the package list, bump it. An existing image is never rebuilt unless
``force=True``. ``sandboxes/docker/Dockerfile`` builds the same image on machines that can pull ``debian``.

    python -m sandboxes build [--force] [--mirror URL] [--rootfs-only]

The rootfs is kept under ``/var/lib/mappa-envs/sandbox-rootfs/`` (root) or ``$MAPPA_CACHE/sandbox-rootfs/`` (default
``~/.cache/mappa-envs``; a user without one there uses root's): the bubblewrap backend runs in it, and the Docker
image is made from it. ``$MAPPA_SANDBOX_ROOTFS`` names another.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

IMAGE_VERSION = "1"
DEFAULT_IMAGE = f"mappa-sandbox:bookworm-py3-v{IMAGE_VERSION}"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy", "python3-pandas", "python3-sklearn", "python3-scipy")


def host_debian_mirror() -> str:
    """The Debian mirror of the host's apt configuration (deb822 ``.sources`` or one-line ``sources.list``)."""
    candidates = [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.MULTILINE):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.MULTILINE):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
    raise RuntimeError("no Debian mirror found in the host's apt sources; pass mirror=...")


SYSTEM_DIR = Path("/var/lib/mappa-envs")
"""Root's place for the rootfs (see :func:`rootfs_dir`)."""


def cache_dir() -> Path:
    return Path(os.environ.get("MAPPA_CACHE", Path.home() / ".cache" / "mappa-envs"))


def rootfs_dir(version: str = IMAGE_VERSION) -> Path:
    """Where the sandbox rootfs is kept (the bubblewrap backend runs in it; the Docker image is made from it).

    ``$MAPPA_SANDBOX_ROOTFS`` overrides it. For root the default is under ``/var/lib/mappa-envs``, a path the
    unprivileged sandbox users can traverse (``/root`` is closed to them); otherwise under the user's cache, or, where
    that has none and root built one (``make sandbox``), root's: building it needs root anyway.
    """
    if env := os.environ.get("MAPPA_SANDBOX_ROOTFS"):
        return Path(env)
    name = Path("sandbox-rootfs") / f"{SUITE}-py3-v{version}"
    system = SYSTEM_DIR / name
    if os.geteuid() == 0:
        return system
    own = cache_dir() / name
    if not (own / "usr/bin/python3").exists() and (system / "usr/bin/python3").exists():
        return system
    return own


def build_rootfs(*, force: bool = False, mirror: str | None = None) -> Path:
    """Build (or reuse) the sandbox rootfs with ``debootstrap``; needs root. Returns its path."""
    target = rootfs_dir()
    if (target / "usr/bin/python3").exists() and not force:
        return target
    if shutil.which("debootstrap") is None:
        raise RuntimeError("building the sandbox rootfs needs debootstrap: apt-get install -y debootstrap")
    mirror = mirror or host_debian_mirror()
    target.parent.mkdir(parents=True, exist_ok=True)
    for parent in (target.parent, target.parent.parent):
        os.chmod(parent, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(tmp / junk, ignore_errors=True)
        (tmp / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for d in ("workspace", "mappa/code", "mappa/ipc"):
            (tmp / d).mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o755)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def image_exists(tag: str = DEFAULT_IMAGE, client=None) -> bool:
    from .docker_client import docker_client

    client = client or docker_client()
    try:
        client.images.get(tag)
        return True
    except Exception:
        return False


def build_image(tag: str = DEFAULT_IMAGE, *, force: bool = False, mirror: str | None = None, client=None) -> str:
    """Build the Docker sandbox image offline from :func:`build_rootfs` (root and an engine needed)."""
    from .docker_client import docker_client

    client = client or docker_client()
    if not force and image_exists(tag, client):
        return tag
    rootfs = build_rootfs(force=force, mirror=mirror)
    with tempfile.TemporaryDirectory(prefix="mappa-image-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        repository, _, version = tag.rpartition(":")
        with tar.open("rb") as f:
            client.api.import_image_from_data(f, repository=repository, tag=version, changes=['CMD ["/bin/sh"]'])
    if not image_exists(tag, client):
        raise RuntimeError(f"docker import did not produce {tag}")
    return tag
