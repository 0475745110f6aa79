"""A cgroup per sandbox: memory, pids and CPU limits that hold for a sandbox as a whole (rlimits hold per process).

Written against the cgroup filesystem directly, no library and no systemd. Where the machine has cgroup v2 with the
``memory``, ``pids`` and ``cpu`` controllers, each sandbox gets ``<cgroup2 mount>/mappa.sandbox/<name>`` with
``memory.max`` (and ``memory.swap.max`` 0), ``pids.max`` and ``cpu.max``; on cgroup v1 (separate hierarchies), the
same group in each of the ``memory``, ``pids`` and ``cpu`` hierarchies with ``memory.limit_in_bytes`` (and
``memory.memsw.limit_in_bytes``, swap included, where the kernel accounts swap), ``pids.max`` and
``cpu.cfs_quota_us``. This needs write access there (root, or a delegated tree); :func:`support` says whether it
works here and, if not, why.

Group names are ``o<owner pid>-<owner start time>-<token>``, so :func:`reap` can tell the groups of live owners
from leftovers of crashed runs (the kernel removes a group only once its processes are gone: reaping kills them).
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .workspaces import process_start as _process_start

PARENT = "mappa.sandbox"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, str, str]]:
    """``(mount root, mount point, fs type, super options)`` of the cgroup mounts."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if rfields and rfields[0] in ("cgroup", "cgroup2"):
                    out.append((fields[3], fields[4], rfields[0], rfields[2] if len(rfields) > 2 else ""))
    except OSError:
        pass
    return out


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass(frozen=True)
class Support:
    """Where the sandbox groups go: one folder (v2) or one per controller (v1)."""

    version: int
    parents: dict[str, Path]
    """controller -> the ``mappa.sandbox`` folder holding that controller's sandbox groups (one folder for v2)."""

    def describe(self) -> str:
        return f"cgroup v{self.version} at {', '.join(sorted({str(p) for p in self.parents.values()}))}"


def _v2(mountpoint: str) -> Support | str:
    root = Path(mountpoint)
    try:
        available = set((root / "cgroup.controllers").read_text().split())
    except OSError as e:
        return f"cgroup v2 at {root}: {e}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"cgroup v2 at {root} lacks the {', '.join(missing)} controller(s) (bound to cgroup v1?)"
    parent = root / PARENT
    try:
        enabled = set((root / "cgroup.subtree_control").read_text().split())
        if not set(CONTROLLERS) <= enabled:
            # fails with EBUSY where the root holds processes and is not the hierarchy's real root (a container)
            _write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        parent.mkdir(exist_ok=True)
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not set(CONTROLLERS) <= enabled:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    except OSError as e:
        return f"cgroup v2 at {root}: cannot delegate {'/'.join(CONTROLLERS)} to {parent} ({e.strerror or e})"
    return Support(2, {c: parent for c in CONTROLLERS})


def _v1(mounts) -> Support | str:
    parents = {}
    for ctrl in CONTROLLERS:
        found = [m for m in mounts if m[2] == "cgroup" and ctrl in m[3].split(",")]
        if not found:
            return f"no cgroup v1 hierarchy with the {ctrl} controller"
        parent = Path(found[0][1]) / PARENT
        try:
            parent.mkdir(exist_ok=True)
            if ctrl == "memory":
                try:  # v1's default is a flat memory hierarchy on old kernels: make children count in parents
                    if (parent / "memory.use_hierarchy").read_text().strip() != "1":
                        _write(parent / "memory.use_hierarchy", "1")
                except OSError:
                    pass
            probe = parent / f"probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.mkdir()
            probe.rmdir()
        except OSError as e:
            return f"cgroup v1 {ctrl} hierarchy at {found[0][1]} is not writable here ({e.strerror or e})"
        parents[ctrl] = parent
    return Support(1, parents)


@functools.lru_cache(maxsize=1)
def support() -> Support | str:
    """How sandbox groups are made here, or a sentence saying why they cannot be (checked once)."""
    mounts = _mounts()
    if not mounts:
        return "no cgroup filesystem is mounted"
    v2 = [m for m in mounts if m[2] == "cgroup2"]
    pure_v2 = [m for m in v2 if not any(n[2] == "cgroup" for n in mounts)]
    reasons = []
    for m in pure_v2 or v2:
        got = _v2(m[1])
        if isinstance(got, Support):
            return got
        reasons.append(got)
    if any(m[2] == "cgroup" for m in mounts):
        got = _v1(mounts)
        if isinstance(got, Support):
            return got
        reasons.append(got)
    return "; ".join(reasons) or "no usable cgroup hierarchy"


class SandboxCgroup:
    """One sandbox's group (in each controller's hierarchy on v1). ``add(pid)`` moves a process in; its children
    are born inside. ``remove()`` kills what is left and deletes the group."""

    def __init__(self, memory_bytes: int, pids: int, cpus: float, where: Support | None = None):
        got = where or support()
        if isinstance(got, str):
            raise RuntimeError(got)
        self.support = got
        me = os.getpid()
        self.name = f"o{me}-{int(_process_start(me))}-{secrets.token_hex(6)}"
        self.paths = {c: p / self.name for c, p in got.parents.items()}
        self.dirs = sorted(set(self.paths.values()))
        try:
            for d in self.dirs:
                d.mkdir()
            mem, pid_dir, cpu = self.paths["memory"], self.paths["pids"], self.paths["cpu"]
            quota = max(1000, int(cpus * CPU_PERIOD_US))
            if got.version == 2:
                _write(mem / "memory.max", str(memory_bytes))
                try:
                    _write(mem / "memory.swap.max", "0")
                except OSError:  # no swap accounting on this kernel: nothing to limit
                    pass
                _write(pid_dir / "pids.max", str(pids))
                _write(cpu / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(pid_dir / "pids.max", str(pids))
                _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(quota))
        except OSError:
            self.remove()
            raise

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the group (every hierarchy on v1)."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def procs(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this group so far."""
        mem = self.paths["memory"]
        name = "memory.events" if self.support.version == 2 else "memory.oom_control"
        try:
            for line in (mem / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def memory_peak(self) -> int | None:
        """The group's highest memory use in bytes (None where the kernel does not keep it)."""
        mem = self.paths["memory"]
        name = "memory.peak" if self.support.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((mem / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process of the group (``cgroup.kill`` where v2 has it, else one by one until empty)."""
        kill_file = self.paths["pids"] / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        while (procs := self.procs()) and time.monotonic() < deadline:
            if self.support.version == 2 and kill_file.exists():
                try:
                    _write(kill_file, "1")
                except OSError:
                    pass
            for pid in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(50):  # a killed process leaves the group once it is reaped: retry briefly
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def reap(all_owners: bool = False) -> int:
    """Remove the sandbox groups whose owning process is gone (or all of them): their processes are killed."""
    got = support()
    if isinstance(got, str):
        return 0
    removed = 0
    names: set[str] = set()
    for parent in set(got.parents.values()):
        try:
            names.update(p.name for p in parent.iterdir() if p.is_dir() and p.name.startswith("o"))
        except OSError:
            pass
    for name in sorted(names):
        try:
            pid_s, start_s, _ = name[1:].split("-", 2)
            alive = int(pid_s) > 0 and int(_process_start(int(pid_s))) == int(start_s)
        except ValueError:
            continue
        if all_owners or not alive:
            group = SandboxCgroup.__new__(SandboxCgroup)
            group.support, group.name = got, name
            group.paths = {c: p / name for c, p in got.parents.items()}
            group.dirs = sorted(set(group.paths.values()))
            group.remove()
            removed += 1
    return removed
