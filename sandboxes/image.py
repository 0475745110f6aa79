"""The sandbox image, built offline: a Debian rootfs from ``debootstrap`` imported with ``docker import``.

No registry is needed. The rootfs is Debian bookworm (``minbase``) with python3, numpy, pandas, scikit-learn and
scipy from Debian's own packages, fetched from the Debian mirror the host's apt already uses. The image tag carries
a version (:data:`IMAGE_VERSION`): change the package list, bump it. An existing image is never rebuilt unless
``force=True``. ``sandboxes/docker/Dockerfile`` builds the same image on machines that can pull ``debian``.

    python -m sandboxes build [--force] [--mirror URL]
"""

from __future__ import annotations

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


def image_exists(tag: str = DEFAULT_IMAGE, client=None) -> bool:
    from .docker_backend import docker_client

    client = client or docker_client()
    try:
        client.images.get(tag)
        return True
    except Exception:
        return False


def build_image(tag: str = DEFAULT_IMAGE, *, force: bool = False, mirror: str | None = None, client=None) -> str:
    """Build the sandbox image offline (root, ``debootstrap`` and a Docker engine needed). Returns the tag."""
    from .docker_backend import docker_client

    client = client or docker_client()
    if not force and image_exists(tag, client):
        return tag
    if shutil.which("debootstrap") is None:
        raise RuntimeError("building the sandbox image needs debootstrap: apt-get install -y debootstrap")
    mirror = mirror or host_debian_mirror()
    with tempfile.TemporaryDirectory(prefix="mappa-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for d in ("workspace", "mappa/code"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        with tar.open("rb") as f:
            client.images.client.api.import_image_from_data(
                f, repository=tag.split(":")[0], tag=tag.split(":")[1], changes=['CMD ["/bin/sh"]']
            )
    if not image_exists(tag, client):
        raise RuntimeError(f"docker import did not produce {tag}")
    return tag
