"""Warm execution worker: preload modules once, then fork a fresh child per code block.

Runs *inside* the sandbox (a host process, a bubblewrap namespace or a Docker container) with whatever python3
is there, so it imports nothing from this package. Usage::

    python3 -I -u _worker.py SOCKET_PATH WORKSPACE PRELOAD(comma-separated) KILL_ALL(0|1)

It listens on a Unix socket and serves one connection. Each request is a JSON line::

    {"path": "/code/cell_3.py", "timeout": 10, "output_bytes": 16384, "memory_bytes": 0, "fsize_bytes": 0,
     "nproc": 0, "nofile": 0}

answered first by ``{"started": true}`` (sent before the block is forked), then by a JSON line with
``exit_code`` (negative: killed by that signal), ``timed_out``, ``stdout``, ``stderr`` (head and tail kept, with a
marker), ``stdout_truncated``, ``stderr_truncated`` and ``oom_kills`` (the memory group's count of OOM kills before
and after the block, read from the request's ``oom_files`` where one is readable, else null).

The worker dies with the host: on the host it asks for a parent-death signal, and it stops serving when the host's
connection closes.

Semantics: every block starts from the worker's state right after preloading (its own fresh globals; nothing a
previous block defined), files in the workspace persist, and modules already preloaded import instantly. After
each block the child's process group is killed; with KILL_ALL=1 (only inside a PID namespace or container, never
on a host) every other process of the sandbox user is killed as well. The reply waits until the killed processes
are gone (zombies at most), so none of them is still running when the next block starts.
"""

import builtins
import json
import os
import select
import signal
import socket
import sys
import time
import traceback

MARKER = "\n[... output truncated: {dropped} more bytes ...]\n"


class Cap:
    def __init__(self, limit):
        self.head_limit, self.tail_limit = limit - limit // 2, limit // 2
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def feed(self, chunk):
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_limit)]

    def text(self):
        dropped = self.total - len(self.head) - len(self.tail)
        if dropped <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), False
        return (
            bytes(self.head).decode("utf-8", "replace")
            + MARKER.format(dropped=dropped)
            + bytes(self.tail).decode("utf-8", "replace"),
            True,
        )


def child(req, workspace, w_out, w_err):
    """In the forked child: isolate, limit, run the block, exit. Never returns."""
    code = 1
    try:
        set_dumpable(True)  # the block's own /proc files stay its own (oom_score_adj below); the worker stays closed
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(w_out, 1)
        os.dup2(w_err, 2)
        # nothing of the worker's beyond stdio: not its connection to the host (a block could write a forged
        # result into it), not the other pipes
        os.closerange(3, 65536)
        import resource

        if req.get("memory_bytes"):
            # the budget is on top of what the preloaded worker already maps
            with open("/proc/self/statm") as f:
                base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limit(resource.RLIMIT_AS, base + int(req["memory_bytes"]))
        if req.get("fsize_bytes"):
            limit(resource.RLIMIT_FSIZE, req["fsize_bytes"])
        if req.get("nproc"):
            limit(resource.RLIMIT_NPROC, req["nproc"])
        if req.get("nofile"):
            limit(resource.RLIMIT_NOFILE, req["nofile"])
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # if the sandbox runs out of memory, the child dies, not the worker
        except OSError:
            pass
        os.environ.update(req.get("env") or {})
        os.chdir(workspace)
        sys.stdout.reconfigure(write_through=True)
        sys.argv = [req["path"]]
        with open(req["path"], encoding="utf-8", errors="surrogateescape") as f:
            source = f.read()
        glb = {"__name__": "__main__", "__file__": req["path"], "__builtins__": builtins}
        exec(compile(source, req["path"], "exec"), glb)
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code & 0xFF if code >= 0 else 1)


def run(req, workspace, kill_all):
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r_out)
        os.close(r_err)
        child(req, workspace, w_out, w_err)
    os.close(w_out)
    os.close(w_err)
    caps = {r_out: Cap(req["output_bytes"]), r_err: Cap(req["output_bytes"])}
    open_fds = set(caps)
    deadline = time.monotonic() + float(req["timeout"])
    status, timed_out = None, False
    while True:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        if status is not None:
            # the block is over: kill what it left behind, then drain the pipes (their writers are gone)
            kill_leftovers(pid, kill_all)
            drain(open_fds, caps)
            break
        if time.monotonic() >= deadline:
            timed_out = True
            kill_group(pid)
            _, status = os.waitpid(pid, 0)
            kill_leftovers(pid, kill_all)
            drain(open_fds, caps)
            break
        if not open_fds:
            time.sleep(0.02)
            continue
        ready, _, _ = select.select(list(open_fds), [], [], 0.02)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                caps[fd].feed(chunk)
            else:
                open_fds.discard(fd)
    for fd in caps:
        os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    out, out_t = caps[r_out].text()
    err, err_t = caps[r_err].text()
    return {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "stdout": out,
        "stderr": err,
        "stdout_truncated": out_t,
        "stderr_truncated": err_t,
    }


def drain(open_fds, caps):
    for fd in list(open_fds):
        os.set_blocking(fd, False)
        try:
            while chunk := os.read(fd, 65536):
                caps[fd].feed(chunk)
        except BlockingIOError:
            pass
        open_fds.discard(fd)


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


CLEAN_UP_S = 2.0
"""How long :func:`kill_leftovers` may wait for the killed processes to be gone (well within the host's grace)."""


def kill_leftovers(pgid, kill_all):
    """Kill what the block left (its process group ``pgid``; with ``kill_all`` every process we may signal but
    ourselves and init) and return once none of it is alive: a SIGKILL only marks a process for death, and one that
    has not run since (on a busy machine) still runs, and shows in ``/proc`` with its command line, when the next
    block starts. So: kill, reap, look for a survivor that is not a zombie, and again (a survivor may have forked
    meanwhile), until there is none or :data:`CLEAN_UP_S` has passed."""
    deadline, pause = time.monotonic() + CLEAN_UP_S, 0.0005
    while True:
        kill_group(pgid)
        if kill_all:
            try:
                os.kill(-1, signal.SIGKILL)  # every process we may signal, except ourselves and the namespace's init
            except OSError:
                pass
        reap()
        if not any_alive(pgid, kill_all) or time.monotonic() > deadline:
            return
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


def reap():
    """Reap our own children that have exited (the block's orphans are init's to reap)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def any_alive(pgid, kill_all):
    """Whether a process of the group ``pgid`` (with ``kill_all``: any process we may signal, but ourselves and
    init) is alive; zombies are dead, whoever has yet to reap them."""
    if not kill_all:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return False  # no such group (ESRCH) left at all: the common case, without reading /proc
    me = os.getpid()
    for name in os.listdir("/proc"):  # in a PID namespace (kill_all), only the sandbox's own processes
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
            if fields[0] in (b"Z", b"X") or (not kill_all and int(fields[2]) != pgid):
                continue
            if kill_all:
                os.kill(int(name), 0)  # ours to kill? (PermissionError: another user's, e.g. the container's init)
        except (OSError, IndexError, ValueError):
            continue
        return True
    return False


def limit(res, value):
    """Set rlimit ``res`` to ``value``, soft and hard, never above the hard limit the worker inherited (the host
    refused requests over it when the sandbox was made)."""
    import resource

    hard = resource.getrlimit(res)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(res, (value, value))


def oom_kills(paths):
    """The memory group's count of OOM kills (the ``oom_kill`` line of the first readable of ``paths``), or None."""
    for path in paths or ():
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
    return None


def set_dumpable(on):
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 1 if on else 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass


def die_with_parent():
    """Ask the kernel to SIGKILL this worker when the thread that started it ends (Linux only): on the host
    (subprocess backend), the host's launcher thread, which lives as long as the host process. Inside a sandbox the
    worker's parent is the sandbox's own init; there bwrap's --die-with-parent or the container does the job."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main():
    sock_path, workspace, preload, kill_all = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    if not kill_all:  # KILL_ALL=0: running on the host, not in a PID namespace or container
        die_with_parent()
    for name in filter(None, preload.split(",")):
        try:
            __import__(name)
        except Exception as e:
            print(f"worker: could not preload {name}: {e}", file=sys.stderr)
    # Not dumpable: a block (our child, the same uid) may then neither ptrace us nor open /proc/<worker>/mem (a
    # write there is no system call the seccomp filter sees) to forge results or survive its block.
    set_dumpable(False)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path + ".tmp"
    srv.bind(tmp)
    os.rename(tmp, sock_path)  # the socket appears only once the worker is ready
    srv.listen(1)
    srv.settimeout(300)  # a host that never connects (it died) does not keep the worker forever
    conn, _ = srv.accept()
    conn.settimeout(None)
    stream = conn.makefile("rwb")
    for line in stream:  # ends when the host closes the connection (or dies)
        stream.write(b'{"started": true}\n')  # before the fork: a block never acknowledged never ran
        stream.flush()
        try:
            req = json.loads(line)
            before = oom_kills(req.get("oom_files"))
            reply = run(req, workspace, kill_all)
            reply["oom_kills"] = [before, oom_kills(req.get("oom_files"))]
        except Exception as e:
            reply = {"worker_error": f"{type(e).__name__}: {e}"}
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()


if __name__ == "__main__":
    main()
