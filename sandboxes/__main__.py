"""`python -m sandboxes build [--force] [--mirror URL] [--tag TAG]`, `python -m sandboxes reap [--all]` and
`python -m sandboxes check` (which isolating backends run here; exit 1 when one that ``$MAPPA_REQUIRE_BACKENDS``
or CI requires is missing: :mod:`sandboxes.check`).

``reap`` removes what crashed runs left: this host's and this user's sandbox containers whose owner is gone (all of
this host's and user's with ``--all``; never another host's or user's) and
session folders (workspaces) whose owner is gone (:func:`sandboxes.workspaces.reap_workspaces`: only folders that carry
this host's owner marker, never a live run's)."""

from __future__ import annotations

import argparse
import sys


def build_parser(prog: str = "python -m sandboxes") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the Docker sandbox image offline (skipped when it exists)")
    b.add_argument("--force", action="store_true")
    b.add_argument("--mirror", default=None, help="Debian mirror (default: the host's apt configuration)")
    b.add_argument("--tag", default=None)
    b.add_argument("--rootfs-only", action="store_true", help="only the rootfs (bubblewrap); no Docker engine needed")
    r = sub.add_parser("reap", help="remove the sandbox containers and workspaces left by crashed runs")
    r.add_argument(
        "--all", action="store_true", help="remove every sandbox container of this host and user, live owners too"
    )
    r.add_argument("--tmpdir", default=None, help="where the session folders are (default: the temporary directory)")
    v = sub.add_parser("serve", help="serve a SandboxFusion-compatible /run_code endpoint")
    v.add_argument("--backend", default="bubblewrap")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8080)
    sub.add_parser("check", help="which isolating backends run here; exit 1 if a required one is missing")
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m sandboxes") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.cmd == "check":
        from .check import main as check_main

        return check_main()
    if args.cmd == "serve":
        from . import make_sandbox
        from .fusion_server import make_server

        server = make_server(make_sandbox(args.backend), args.host, args.port)
        print(f"serving /run_code on http://{args.host}:{server.server_address[1]} ({args.backend})", flush=True)
        server.serve_forever()
        return 0
    try:
        if args.cmd == "build" and args.rootfs_only:
            from .image import build_rootfs

            print(build_rootfs(force=args.force, mirror=args.mirror))
        elif args.cmd == "build":
            from .image import DEFAULT_IMAGE, build_image

            print(build_image(args.tag or DEFAULT_IMAGE, force=args.force, mirror=args.mirror))
        else:
            return _reap(args.all, args.tmpdir)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _reap(all_containers: bool, tmpdir: str | None) -> int:
    """Containers first (they hold the workspaces' bind mounts), then the session folders of dead owners."""
    from .workspaces import reap_workspaces

    try:
        from .docker_backend import docker_client, reap

        client = docker_client(timeout=10)
    except RuntimeError as e:
        print(f"containers: skipped ({e})")
    else:
        print(f"removed {reap(client, all_owners=all_containers)} container(s)")
    from .cgroups import reap as reap_cgroups

    print(f"removed {reap_cgroups(all_owners=all_containers)} bubblewrap cgroup(s) of dead owners")
    print(f"removed {reap_workspaces(tmpdir)} workspace folder(s) of dead owners")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
