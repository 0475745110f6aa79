"""The bubblewrap backend's seccomp filter: Docker's default profile, compiled to BPF for ``bwrap --seccomp FD``.

The filter is an allow-list, like Docker's (moby ``profiles/seccomp/default.json``): the system calls a container
without capabilities may make are allowed; the ones that profile refuses such a container (:data:`DENIED`: mounts,
namespaces, keys, ``bpf``, kernel modules, clocks, tracing...) fail with ``EPERM``, and every other call, one this
filter does not know, fails with ``ENOSYS``, as a kernel without it would answer: the C library then falls back to
an older call (``clone3`` to ``clone``, ``fchmodat2`` to ``fchmodat``, ``faccessat2``, ``statx``, ``close_range``
on older profiles...), where ``EPERM`` would be final. As in that profile, ``clone`` is allowed only without
namespace flags (``EPERM`` with one), ``clone3`` fails with ``ENOSYS`` (its flags cannot be inspected),
``personality`` is allowed only with the default personas and ``socket`` never for ``AF_VSOCK`` (both ``EPERM``).
Stricter than that profile, because here the executed code shares its uid with the sandbox's init and the warm
worker (in Docker both are out of reach: init is root's): ``ptrace``, ``process_vm_readv``/``process_vm_writev``
are blocked (Docker allows them on kernels from 4.8); so are ``io_uring_*`` (as Docker does from version 25) and
``name_to_handle_at``. Calls of the other ABIs of the machine (i386 or x32 on x86_64) kill the thread
(libseccomp's default for a foreign architecture).

The BPF program is built by libseccomp through its Python bindings: ``pyseccomp`` (PyPI, ctypes bindings to the
system's ``libseccomp.so.2``; the ``bubblewrap`` extra) or libseccomp's own ``seccomp`` module where that is
importable (Debian's ``python3-seccomp``, for the system Python). Without either, :func:`seccomp_program` returns
``None`` with the reason, and the backend says so (a warning, and ``"seccomp"`` missing from ``enforces``).
"""

from __future__ import annotations

import errno
import functools
import os

EPERM, ENOSYS = errno.EPERM, errno.ENOSYS


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Allowed unconditionally (moby's default profile; its "names" list allowed for every container).
ALLOWED = _words("""
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1
epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit
exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchown
fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64
fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv futimesat getcpu getcwd
getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer
getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32
getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid
getuid32 getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy
io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill
landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen
listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise membarrier memfd_create
memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr
mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap
msgctl msgget msgrcv msgsnd msync munlock munlockall munmap nanosleep newfstatat _newselect open openat
openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll
ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev
pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending
rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64
send sendfile sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32
setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
setresuid32 setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address
setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn
socketcall socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat sync sync_file_range syncfs
sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill
truncate truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork
vmsplice wait4 waitid waitpid write writev
""")
# Allowed on the architectures that have them (the profile's per-architecture entries; elsewhere libseccomp
# resolves them to no system call and the rule is void).
ALLOWED_ARCH_SPECIFIC = _words("""
arch_prctl modify_ldt sync_file_range2 swapcontext arm_fadvise64_64 arm_sync_file_range breakpoint cacheflush
set_tls riscv_flush_icache s390_pci_mmio_read s390_pci_mmio_write s390_runtime_instr
""")
# In the profile's list but blocked here (see the module docstring).
NOT_ALLOWED_HERE = frozenset({"io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at"})
# Refused with EPERM: what the profile allows only with a capability this sandbox does not have (CAP_SYS_ADMIN,
# CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_TIME...), what it never allows, and NOT_ALLOWED_HERE. Every call on no
# list fails with ENOSYS instead.
DENIED = _words("""
ptrace process_vm_readv process_vm_writev kcmp pidfd_getfd process_madvise
keyctl add_key request_key bpf perf_event_open userfaultfd fanotify_init
unshare setns mount umount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr
kexec_load kexec_file_load init_module finit_module delete_module create_module reboot swapon swapoff
open_by_handle_at name_to_handle_at iopl ioperm
clock_settime clock_settime64 settimeofday stime acct quotactl quotactl_fd lookup_dcookie nfsservctl
move_pages migrate_pages mbind set_mempolicy get_mempolicy set_mempolicy_home_node
sethostname setdomainname syslog vhangup uselib ustat sysfs _sysctl vm86 vm86old
io_uring_setup io_uring_enter io_uring_register
""")

CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET."""
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE (alone and with UNAME26), and the query value."""
AF_VSOCK = 40


def _other_personas() -> list[tuple[str, int, int]]:
    """Comparisons of ``personality``'s argument, ``("GT", value, 0)`` or ``("MASKED_EQ", mask, value)``, that
    together match every value but :data:`PERSONALITIES` and none of those: the rules that refuse the others.

    libseccomp cannot say "none of these" in one rule (one comparison per argument), and when rules with different
    actions match the same value, which one wins depends on the order it builds them in. Of the 32-bit values that
    are not allowed, one with all of the other bits (not UNAME26's or ADDR_NO_RANDOMIZE's) set lacks one of those two
    bits; any other has, among the other bits taken in a circle, a set bit followed by a clear one."""
    free = 0x8 | 0x20000
    others = [b for b in range(32) if not (1 << b) & free]
    out = [("GT", 0xFFFFFFFF, 0)]
    for i, b in enumerate(others):
        nxt = others[(i + 1) % len(others)]
        out.append(("MASKED_EQ", (1 << b) | (1 << nxt), 1 << b))
    all_others = 0xFFFFFFFF & ~free
    out += [("MASKED_EQ", all_others | bit, all_others) for bit in (0x8, 0x20000)]
    return out


def _bindings():
    try:
        import pyseccomp as seccomp
    except Exception as first:  # ImportError, or RuntimeError("Unable to find libseccomp")
        try:
            import seccomp  # libseccomp's own bindings (Debian: python3-seccomp)
        except Exception:
            raise ImportError(f"pyseccomp: {first}") from None
    return seccomp


@functools.lru_cache(maxsize=1)
def _build() -> tuple[bytes | None, str | None]:
    try:
        sc = _bindings()
    except ImportError as e:
        return None, f"no libseccomp bindings ({e}; pip install 'mappa-envs[bubblewrap]', needs libseccomp2)"
    try:
        f = sc.SyscallFilter(sc.ERRNO(ENOSYS))  # a call this filter does not know: as if the kernel had none
        try:
            f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree over the syscall numbers: fewer BPF steps
        except Exception:
            pass
        for name in [*ALLOWED, *ALLOWED_ARCH_SPECIFIC]:
            if name in NOT_ALLOWED_HERE:
                continue
            try:
                f.add_rule(sc.ALLOW, name)
            except (OSError, ValueError, RuntimeError):
                pass  # not a system call this libseccomp knows: nothing to allow
        for name in DENIED:
            try:
                f.add_rule(sc.ERRNO(EPERM), name)
            except (OSError, ValueError, RuntimeError):
                pass  # not a system call this libseccomp knows
        # the calls allowed for some arguments only: EPERM for the others (rules that match no allowed value)
        for mode in PERSONALITIES:
            f.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, mode))
        for op, value, datum in _other_personas():
            f.add_rule(sc.ERRNO(EPERM), "personality", sc.Arg(0, getattr(sc, op), value, datum))
        f.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.NE, AF_VSOCK))
        f.add_rule(sc.ERRNO(EPERM), "socket", sc.Arg(0, sc.EQ, AF_VSOCK))
        f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACE_FLAGS, 0))
        for bit in (1 << b for b in range(32) if CLONE_NAMESPACE_FLAGS & (1 << b)):
            f.add_rule(sc.ERRNO(EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
        # clone3 is on no list: ENOSYS (its flags are in memory, out of the filter's sight; glibc falls back to clone)
        with open(os.memfd_create("mappa-seccomp", os.MFD_CLOEXEC), "w+b") as buf:  # no pipe: no size limit
            f.export_bpf(buf)
            buf.seek(0)
            program = buf.read()
    except Exception as e:
        return None, f"libseccomp could not build the filter ({type(e).__name__}: {e})"
    if not program or len(program) % 8:
        return None, f"libseccomp exported an invalid BPF program ({len(program)} bytes)"
    return program, None


def seccomp_program() -> tuple[bytes | None, str | None]:
    """``(bpf, None)``: the compiled filter (cached); or ``(None, reason)`` when it cannot be built here."""
    return _build()


def program_fd(program: bytes) -> int:
    """A fresh file descriptor (its own file offset, so concurrent launches never share one) holding ``program``."""
    fd = os.memfd_create("mappa-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
