"""Confinement of the runner: Landlock, namespaces, a pids cgroup, seccomp, rlimits, and the
process tree's end. Standard library only: the judge and the runner import it."""
from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

from pipo_jax.tasks.code.config import SandboxConfig

logger = logging.getLogger(__name__)


# Linux uapi <linux/landlock.h>; the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
# All file-system rights an ABI knows: 13 in ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5).
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# The rights a rule on a file (not a directory) may hold: EXECUTE, WRITE, READ, TRUNCATE, IOCTL_DEV.
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | (1 << 14) | (1 << 15)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI >= 6
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER, _PR_SET_PDEATHSIG = 38, 36, 1


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@functools.lru_cache(maxsize=None)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none: before Linux 5.13, not built in, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = _libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                          ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot confine generated code here (no Landlock, no network namespace,
    no process bound) and the config does not allow running it anyway."""


def check_confinement(config: SandboxConfig) -> bool:
    """True when generated code will run confined; raises `SandboxUnavailable` where the
    kernel has no Landlock and ``config.allow_unconfined`` is off."""
    if landlock_abi() >= 1:
        return True
    if not config.allow_unconfined:
        raise SandboxUnavailable(
            "this kernel offers no Landlock, so the code sandbox cannot keep generated programs out of the file "
            "system; refusing to run them. Set SandboxConfig(allow_unconfined=True) (trainer: "
            "--config.task.code.sandbox_allow_unconfined=true) to run them with your permissions anyway")
    _warn_unconfined()
    return False


def check_process_bound(config: SandboxConfig) -> str:
    """What caps the program's processes: "none" (``max_processes=0``), "nproc" (RLIMIT_NPROC),
    or, where that does not bind this user (root), "cgroup" (a pids cgroup, where one can be
    made) or "seccomp" (no process at all); raises `SandboxUnavailable` where none can."""
    if not config.max_processes:
        return "none"
    if not nproc_exempt():
        return "nproc"
    if pids_cgroup_parent() is not None:
        return "cgroup"
    if not process_filter_available():
        raise SandboxUnavailable(
            f"RLIMIT_NPROC does not bind this user (root), no pids cgroup can be made and there is no process "
            f"filter for {os.uname().machine}, so a fork bomb would be unbounded; set SandboxConfig(max_processes=0) "
            "to run without a process cap")
    return "seccomp"


_PIDS_OVERHEAD = 2  # tasks of the sandbox itself in its pids cgroup: the judge, the runner (and unshare)
_cgroup_ids = itertools.count()
_CGROUP_PREFIX = "pipo_sandbox_"  # pipo_sandbox_<pid of the trainer>_<n>
# The file of each controller's limit: cgroup v2, and v1 where it differs.
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.max", "memory.limit_in_bytes")}
# Swap would take the memory cgroup's pages out of its count: none (v2; v1 where swap is accounted).
_NO_SWAP_FILES = {"memory": ("memory.swap.max", "memory.memsw.limit_in_bytes")}
_PROBE_LIMIT = {"pids": 4, "memory": 64 << 20}


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per hierarchy ("" is cgroup v2), from /proc/self/cgroup."""
    with open("/proc/self/cgroup") as f:
        parts = [line.rstrip("\n").split(":", 2) for line in f]
    return {p[1]: p[2] for p in parts if len(p) == 3}


def pids_cgroup_parent() -> str | None:
    """A cgroup directory below which this process can make pids cgroups, or None (`cgroup_parent`)."""
    return cgroup_parent("pids")


def memory_cgroup_parent() -> str | None:
    """A cgroup directory below which this process can make memory cgroups, or None (`cgroup_parent`)."""
    return cgroup_parent("memory")


@functools.lru_cache(maxsize=None)
def cgroup_parent(controller: str) -> str | None:
    """A cgroup directory below which this process can make cgroups of `controller` ("pids",
    "memory"): cgroup v1's hierarchy of it, or v2 with it enabled for children; where cgroupfs is
    writable, e.g. root outside a container. None where there is none."""
    try:
        own = _own_cgroups()
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        sep = fields.index("-")
        fstype, root, point, opts = fields[sep + 1], fields[3].rstrip("/"), fields[4], fields[sep + 3].split(",")
        if fstype == "cgroup" and controller in opts:
            path = next((p for c, p in own.items() if controller in c.split(",")), None)
        elif fstype == "cgroup2":
            path = own.get("")
        else:
            continue
        if path is None or not (path + "/").startswith(root + "/"):
            continue
        parent = os.path.join(point, path[len(root):].lstrip("/"))
        if _can_make_cgroup(parent, controller):
            return parent
    return None


# sh -c: enter each cgroup named before "--", then become what follows it: no task starts outside.
_ENTER_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; shift; exec "$@"'


def enter_cgroups_command(cgroups: list[str], cmd: list[str]) -> list[str]:
    """`cmd`, started inside `cgroups` (unchanged when there are none)."""
    if not cgroups:
        return cmd
    return ["/bin/sh", "-c", _ENTER_CGROUPS, "sh", *cgroups, "--", *cmd]


def _can_make_cgroup(parent: str, controller: str) -> bool:
    """Whether a cgroup of `controller` can be made below `parent` and a process can enter it."""
    try:
        path = _new_cgroup(parent, {controller: _PROBE_LIMIT[controller]})
    except OSError:
        return False
    try:
        entered = subprocess.run(enter_cgroups_command([path], ["true"]), capture_output=True, timeout=10)
        return entered.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        _remove_cgroup(path)


def _new_cgroup(parent: str, limits: dict[str, int]) -> str:
    """A fresh cgroup below `parent` with each controller's limit (pids: tasks, processes and
    threads; memory: bytes, swap none)."""
    path = os.path.join(parent, f"{_CGROUP_PREFIX}{os.getpid()}_{next(_cgroup_ids)}")
    os.mkdir(path)
    try:
        for controller, limit in limits.items():
            v2, v1 = _LIMIT_FILES[controller]
            _write_limit(path, v2 if os.path.exists(os.path.join(path, v2)) else v1, limit)
            for name in _NO_SWAP_FILES.get(controller, ()):
                if os.path.exists(os.path.join(path, name)):  # v1's memsw: its limit counts memory + swap
                    _write_limit(path, name, limit if name.startswith("memory.memsw") else 0)
    except OSError:
        _remove_cgroup(path)
        raise
    return path


def _write_limit(path: str, name: str, value: int) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def new_sandbox_cgroups(limits: dict[str, int]) -> list[str]:
    """The cgroups of one sandboxed run: per controller of `limits` (pids, memory) whose
    `cgroup_parent` exists, one below it (one cgroup for controllers sharing a parent, as under
    cgroup v2), with the limit. Raises OSError where one cannot be made (what was made is removed)."""
    by_parent: dict[str, dict[str, int]] = {}
    for controller, limit in limits.items():
        parent = {"pids": pids_cgroup_parent, "memory": memory_cgroup_parent}[controller]()
        if parent is not None:
            by_parent.setdefault(parent, {})[controller] = limit
    made: list[str] = []
    try:
        for parent, own in by_parent.items():
            made.append(_new_cgroup(parent, own))
    except OSError:
        for path in made:
            _remove_cgroup(path)
        raise
    return made


def _remove_cgroup(path: str) -> None:
    """Removes the (emptied) cgroup; its killed tasks may take a moment to leave it."""
    delay = 0.001
    for _ in range(40):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    logger.warning("could not remove the sandbox's cgroup %s", path)


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _dead_owner(name: str, prefix: str) -> bool:
    """Whether `name` is `prefix`<pid>_... of a process that no longer exists (not this one)."""
    if not name.startswith(prefix):
        return False
    pid, sep, _ = name[len(prefix):].partition("_")
    return sep == "_" and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))


def _sigkill(pids) -> None:
    """SIGKILLs each of `pids`; one already gone (or no longer ours to signal) is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_cgroup(path: str) -> None:
    """SIGKILLs every task of the cgroup `path` until none is left (cgroup v2's cgroup.kill where
    there is one), then removes it."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except OSError:
        pass
    for _ in range(100):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(line) for line in f if line.strip()]
        except OSError:
            break
        if not pids:
            break
        _sigkill(pids)
        time.sleep(0.01)
    _remove_cgroup(path)


def remove_cgroups_of_dead_trainers() -> list[str]:
    """Kills what runs in, and removes, each sandbox cgroup a process that has died left behind
    (``pipo_sandbox_<pid>_*``, that pid gone); returns their paths."""
    removed = []
    for parent in {p for p in (pids_cgroup_parent(), memory_cgroup_parent()) if p is not None}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if _dead_owner(name, _CGROUP_PREFIX):
                _kill_cgroup(os.path.join(parent, name))
                removed.append(os.path.join(parent, name))
    return removed


@functools.lru_cache(maxsize=None)
def _warn_unconfined() -> None:
    logger.warning("no Landlock on this kernel: generated code runs with this user's file system access "
                   "(allow_unconfined=True)")


@functools.lru_cache(maxsize=None)
def namespaces_available() -> bool:
    """Whether ``unshare`` can give a child new user, network and PID namespaces."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, *_UNSHARE_FLAGS, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


# IPC: SysV shared memory and message queues die with the namespace; mount: the scratch tmpfs.
_UNSHARE_FLAGS = ("--user", "--map-root-user", "--net", "--pid", "--ipc", "--mount", "--fork", "--kill-child",
                  "--")


def check_network_isolation(config: SandboxConfig) -> bool:
    """True when generated code will run in its own network (and user, PID) namespace; False
    where it runs without one, which needs ``config.allow_network``; else raises
    `SandboxUnavailable`."""
    if config.network != "audit" and namespaces_available():
        return True
    if config.network == "namespace":
        raise SandboxUnavailable("SandboxConfig.network='namespace' but 'unshare --user --net --pid' is not "
                                 "usable here")
    if not config.allow_network:
        why = ("network='audit' runs it without a network namespace" if config.network == "audit" else
               "'unshare --user --net --pid' is not usable here, so there is no network namespace")
        raise SandboxUnavailable(
            f"the code sandbox cannot keep generated programs off the network: {why} (the audit hook alone "
            "is no boundary); refusing to run them. Set SandboxConfig(allow_network=True) (trainer: "
            "--config.task.code.sandbox_allow_network=true) to run them anyway")
    _warn_no_namespaces()
    return False


@functools.lru_cache(maxsize=None)
def _warn_no_namespaces() -> None:
    logger.warning("generated code runs without a network namespace: only the audit hook keeps it off the "
                   "network (allow_network=True)")


def nproc_exempt() -> bool:
    """Whether RLIMIT_NPROC does not bind this process's children: root, or CAP_SYS_ADMIN /
    CAP_SYS_RESOURCE in its effective set (Linux `copy_process`)."""
    if os.getuid() == 0:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caps & (1 << 21 | 1 << 24))


def _user_tasks() -> int:
    """Processes and threads of this real uid now (what RLIMIT_NPROC counts), from /proc."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # gone meanwhile
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            n += int(fields.get("Threads", "1"))
    return n


def _set_limits(limits: dict) -> None:
    for res, value in ((resource.RLIMIT_AS, limits["memory"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                       (resource.RLIMIT_FSIZE, limits["fsize"]), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NOFILE, limits["nofile"])):
        resource.setrlimit(res, (value, value))
    if limits["nproc"]:
        nproc = _user_tasks() + limits["nproc"]
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _readable_roots() -> list[str]:
    """What the program may read (and execute): the interpreter's installation and the
    system libraries, never /etc, /proc, home directories or the caller's working tree."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {os.path.realpath(p) for p in list(paths)}
    paths |= {"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo"}
    return sorted(p for p in paths if os.path.isdir(p))


def _landlock_confine(scratch: str) -> None:
    """Restricts this process and everything it starts: read + execute below
    `_readable_roots()`, everything below `scratch`, /dev/null read + write, nothing else;
    with ABI >= 6 also no signals to and no abstract unix sockets of processes outside."""
    libc = _libc()
    abi = landlock_abi()
    fs_rights = _FS_RIGHTS_BY_ABI[max(k for k in _FS_RIGHTS_BY_ABI if k <= abi)]
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}: pass the
    # fields this ABI knows (network rights are not handled: `network` / the audit hook do that).
    attr = (ctypes.c_uint64 * 3)(fs_rights, 0, scoped)
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read_exec = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    rules = [(p, read_exec) for p in _readable_roots()] + [(scratch, fs_rights)]
    rules += [("/dev/null", _FS_READ_FILE | _FS_WRITE_FILE)]
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= _FS_FILE_RIGHTS
                rule = _PathBeneath(rights & fs_rights, fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _descendants(root: int) -> tuple[list[int], bool]:
    """(live descendants of `root`, whether any zombie child waits to be reaped), from /proc."""
    parent, zombie = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        if fields[0] in ("Z", "X"):
            zombie.add(int(name))
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return [p for p in found if p not in zombie], any(parent.get(z) == root for z in zombie)


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _kill_tree() -> None:
    """SIGKILLs every live descendant of this process until none is left (the subreaper
    inherits each orphan, so none escapes the scan); reaps them."""
    while True:
        _reap()
        live, _ = _descendants(os.getpid())
        if not live:
            _reap()
            return
        _sigkill(live)


# seccomp (uapi <linux/seccomp.h>, <linux/filter.h>): the audit arch and process-creating
# syscalls of each supported machine; 32-bit (and x32) syscalls are refused altogether.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {"x86_64": {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "prlimit64": 302, "memfd_create": 319},
             "aarch64": {"clone": 220, "clone3": 435, "prlimit64": 261, "memfd_create": 279}}
_CLONE_THREAD = 0x00010000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def process_filter_available() -> bool:
    """Whether `_install_filter` knows this machine's syscall numbers."""
    return os.uname().machine in _AUDIT_ARCH


def _filter_program(machine: str, no_processes: bool) -> list[tuple[int, int, int, int]]:
    """BPF: prlimit64 of another process fails with EPERM (a runner of the judge's uid could
    otherwise lower the judge's limits), so does memfd_create (its pages are in no address
    space, so RLIMIT_AS would not count them); other ABIs' syscalls fail with ENOSYS. With
    `no_processes`, fork / vfork / clone without CLONE_THREAD fail with EAGAIN; clone3 (its
    flags are behind a pointer) with ENOSYS, so libc falls back to clone."""
    nrs = _SYSCALLS[machine]

    def deny(err):
        return (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | err)

    allow = (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW)
    prog = [(_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]), deny(errno.ENOSYS),
            (_BPF_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(_BPF_JSET_K, 0, 1, 0x40000000), deny(errno.ENOSYS)]  # the x32 ABI
    # prlimit64: allowed only on the caller itself, pid 0 (args[0], low word at offset 16)
    prog += [(_BPF_JEQ_K, 0, 4, nrs["prlimit64"]), (_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JEQ_K, 1, 0, 0),
             deny(errno.EPERM), allow]
    prog += [(_BPF_JEQ_K, 0, 1, nrs["memfd_create"]), deny(errno.EPERM)]  # memory no rlimit counts
    if not no_processes:
        return prog + [allow]
    prog += [(_BPF_JEQ_K, 0, 1, nrs["clone3"]), deny(errno.ENOSYS)]
    for name in ("fork", "vfork"):
        if name in nrs:
            prog += [(_BPF_JEQ_K, 0, 1, nrs[name]), deny(errno.EAGAIN)]
    # clone: allowed only with CLONE_THREAD in its flags (args[0], low word at offset 16)
    prog += [(_BPF_JEQ_K, 0, 3, nrs["clone"]), (_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JSET_K, 1, 0, _CLONE_THREAD),
             deny(errno.EAGAIN), allow]
    return prog


def _install_filter(no_processes: bool) -> None:
    """Kernel-enforced, for this process and all it starts: no prlimit of another process, no
    memfd; with
    `no_processes` no new process either (threads stay allowed, bounded by the address-space
    limit; for users RLIMIT_NPROC does not bind, root)."""
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    prog = _filter_program(os.uname().machine, no_processes)
    insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), insns)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


_MS_NOSUID, _MS_NODEV = 2, 4


def _mount_scratch(path: str, size_bytes: int, files: int) -> None:
    """Mounts a tmpfs of `size_bytes` and `files` inodes over `path`, in this process's own mount
    namespace (it ends with it), and moves into it: the scratch space as a whole is bounded."""
    options = f"size={size_bytes},nr_inodes={files},mode=0700".encode()
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), options) != 0:
        raise OSError(ctypes.get_errno(), f"mount of the scratch tmpfs on {path} failed")
    os.chdir(path)
