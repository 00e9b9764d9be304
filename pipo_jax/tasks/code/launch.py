"""The trainer's side of one sandboxed run: start the judge (in namespaces, a cgroup), watch its
progress records, end it at a deadline, remove its scratch directory."""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from pipo_jax.tasks.code import sandbox
from pipo_jax.tasks.code.child_script import CHILD_SCRIPT
from pipo_jax.tasks.code.config import SandboxConfig
from pipo_jax.tasks.code.protocol import _memfd_with, _read_all

logger = logging.getLogger(__name__)


_RECORD_SLACK_S = 2.0  # harness overhead allowed between a test's time limit and its record
_SUPERVISOR_EXIT_S = 5.0  # time the judge gets to kill the runner's tree at a deadline


def _child_of(pid: int) -> int | None:
    """A child process of `pid` (from /proc), or None."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    return int(name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def _end_program(proc: subprocess.Popen, namespaced: bool) -> None:
    """At a deadline: SIGKILL the namespace's first process (the kernel then kills the whole
    namespace before `unshare` returns), or SIGTERM the judge (it kills the runner's
    tree, then exits); waits for that."""
    try:
        target = _child_of(proc.pid) if namespaced else None
        if target is not None:
            os.kill(target, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=_SUPERVISOR_EXIT_S)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass


def _wait_or_kill(proc: subprocess.Popen, config: SandboxConfig, progress_fd: int, namespaced: bool,
                  budget: float) -> str | None:
    """Wait for the judge while it makes progress; then kill its whole process group.

    The judge has ``startup_s + timeout_s`` to start and define the solution, and
    ``timeout_s + _RECORD_SLACK_S`` after each result record it writes to
    ``progress_fd`` for the next one. Waits with WNOWAIT so an exited leader keeps
    its pid (and group id) reserved until the group is killed. `budget` (a monotonic time)
    ends it in any case. Returns "timeout" or "budget" when a deadline killed the child, else None.
    """
    deadline = time.monotonic() + config.startup_s + config.timeout_s
    delay, killed, seen = 0.001, None, 0
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        now = time.monotonic()
        size = os.fstat(progress_fd).st_size
        if size != seen:
            seen, deadline, delay = size, now + config.timeout_s + _RECORD_SLACK_S, 0.001
        if now >= min(deadline, budget):
            killed = "timeout" if now >= deadline else "budget"
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    if killed:
        _end_program(proc, namespaced)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return killed


_JUDGE_MEMORY = 96 << 20  # the memory cgroup's share of the judge, unshare and their interpreters
_SWEEP_EVERY_S = 30.0  # how often a process looks for what dead trainers left (its first run always does)
_sweep_lock = threading.Lock()
_last_sweep = -math.inf


_SCRATCH_PREFIX = "pipo_code_pid"  # pipo_code_pid<pid of the trainer>_<random>


def remove_leftovers(force: bool = False) -> None:
    """Removes what the sandboxes of trainers that died (SIGKILL, OOM) left: their cgroups, with
    whatever still runs in them, and their scratch directories (``pipo_code_pid<pid>_*`` in the
    temporary directory), only where that pid no longer runs (in this PID namespace). At most every `_SWEEP_EVERY_S`
    per process unless `force`."""
    global _last_sweep
    with _sweep_lock:
        if not force and time.monotonic() - _last_sweep < _SWEEP_EVERY_S:
            return
        _last_sweep = time.monotonic()
        cgroups = sandbox.remove_cgroups_of_dead_trainers()
        tmp = tempfile.gettempdir()
        try:
            names = [n for n in os.listdir(tmp) if sandbox._dead_owner(n, _SCRATCH_PREFIX)]
        except OSError:
            names = []
        for name in names:
            remove_tree(os.path.join(tmp, name))
    if cgroups or names:
        logger.warning("removed what the code sandbox of a trainer that died left: %d cgroups, %d scratch "
                       "directories", len(cgroups), len(names))


@functools.lru_cache(maxsize=None)
def _warn_no_memory_cgroup(why: str) -> None:
    logger.warning("could not make the code sandbox's memory cgroup (%s); its rlimits, seccomp filter and open-file "
                   "cap still bound it", why)


def sandbox_memory_bytes(config: SandboxConfig, namespaced: bool, spec_bytes: int) -> int:
    """The memory cgroup's limit for one run: the runner's ``memory_mb``, the scratch tmpfs (in
    namespaces), its stdout, and the judge (its interpreter, and the tests' data a few times)."""
    scratch = config.scratch_mb << 20 if namespaced else 0
    return (config.memory_mb << 20) + scratch + config.max_output_bytes + _JUDGE_MEMORY + 4 * spec_bytes


def _launch(spec: dict, config: SandboxConfig, budget: float = math.inf
            ) -> tuple[list[dict], bytes, int, str | None]:
    """Run the harness once in a fresh working directory.

    The spec (code, tests, limits) arrives on an anonymous memfd as stdin, which the
    harness reads and then replaces; result records go to another memfd; nothing the
    program could read or overwrite is on disk. Returns (records, stdout, return
    code, what killed it: "timeout", "budget" (the monotonic time `budget` passed) or None).
    """
    remove_leftovers()
    confine, bound = sandbox.check_confinement(config), sandbox.check_process_bound(config)
    cmd = [config.python, "-I", "-X", "utf8", CHILD_SCRIPT, "--harness"]
    namespaced = sandbox.check_network_isolation(config)
    if namespaced:
        cmd = [shutil.which("unshare"), *sandbox._UNSHARE_FLAGS, *cmd]
    limits = {"memory": sandbox_memory_bytes(config, namespaced, len(json.dumps(spec)))}
    if bound == "cgroup":
        limits["pids"] = config.max_processes + sandbox._PIDS_OVERHEAD + namespaced
    try:
        cgroups = sandbox.new_sandbox_cgroups(limits)
    except OSError as e:
        _warn_no_memory_cgroup(str(e))
        try:  # the process bound, without the memory cgroup
            cgroups = sandbox.new_sandbox_cgroups({"pids": limits["pids"]}) if "pids" in limits else []
        except OSError as e:
            if not sandbox.process_filter_available():
                raise sandbox.SandboxUnavailable(f"could not make the sandbox's pids cgroup: {e}") from e
            bound, cgroups = "seccomp", []
    cmd = sandbox.enter_cgroups_command(cgroups, cmd)  # no task of the sandbox starts outside them
    scratch = [config.scratch_mb << 20, config.scratch_files] if namespaced else None
    spec = dict(spec, confine=confine, no_processes=bound == "seccomp", scratch=scratch)
    try:
        return _run_harness(spec, cmd, config, namespaced, budget)
    finally:
        for path in cgroups:
            sandbox._remove_cgroup(path)


def _run_harness(spec: dict, cmd: list[str], config: SandboxConfig, namespaced: bool, budget: float
                 ) -> tuple[list[dict], bytes, int, str | None]:
    """Runs `cmd` (the judge) on `spec` in a fresh scratch directory; what `_launch` returns.
    The judge holds the read end of a pipe whose write end only this process holds: when this
    process dies, however, the judge sees its end and ends the sandbox."""
    lifeline_r, lifeline_w = os.pipe()
    spec_fd = _memfd_with(json.dumps(dict(spec, lifeline=lifeline_r)).encode(), "spec")
    results_fd = os.memfd_create("results")
    stdout_fd = os.memfd_create("stdout")
    try:
        workdir = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}_")
        try:
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
                   "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            proc = subprocess.Popen(cmd + [str(results_fd)], stdin=spec_fd, stdout=stdout_fd,
                                    stderr=subprocess.DEVNULL, cwd=workdir, env=env,
                                    start_new_session=True, pass_fds=(results_fd, lifeline_r))
            os.close(lifeline_r)
            lifeline_r = -1
            killed = _wait_or_kill(proc, config, results_fd, namespaced, budget)
        finally:
            remove_tree(workdir)
        records = []
        for line in _read_all(results_fd, 1 << 24).decode("utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a record cut short by the kill
        stdout = _read_all(stdout_fd, config.max_output_bytes + 1)
    finally:
        for fd in (spec_fd, results_fd, stdout_fd, lifeline_r, lifeline_w):
            if fd >= 0:
                os.close(fd)
    return records, stdout, proc.returncode, killed


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> None:
    """Deletes the directory `path` and everything in it, however deep or locked down the program
    left it (``shutil.rmtree`` recurses, so a few thousand nested directories end it with
    RecursionError). Depth-first with one open directory at a time, names relative to it (no path
    grows past PATH_MAX) and ".." to climb; symlinks are removed, never followed. Runs once every
    process that could write there has ended. Never raises: what it cannot delete is logged."""
    failures: list[str] = []
    try:
        _remove_below(os.path.dirname(path) or ".", os.path.basename(path), failures)
    except OSError as e:
        failures.append(str(e))
    if failures:
        logger.warning("could not remove all of the sandbox's scratch directory %s (%d failures, e.g. %s)", path,
                       len(failures), failures[0])


def _remove_below(parent: str, name: str, failures: list[str]) -> None:
    """`remove_tree` of `parent`/`name`; what fails to go is appended to `failures`."""
    fd = os.open(parent, _DIR)
    pending = [[name]]  # per level: the subdirectories still to delete
    entered: list[str] = []  # the directories descended into, below `parent`
    try:
        while pending:
            if pending[-1]:
                sub = pending[-1].pop()
                try:
                    child = _enter(fd, sub)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    failures.append(f"{sub}: {e}")
                    continue
                os.close(fd)
                fd = child
                entered.append(sub)
                pending.append(_clear_files(fd, failures))
                continue
            pending.pop()
            if not entered:
                return
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            sub = entered.pop()
            try:
                os.rmdir(sub, dir_fd=fd)
            except OSError as e:
                failures.append(f"{sub}: {e}")
    finally:
        os.close(fd)


def _enter(parent_fd: int, name: str) -> int:
    """The directory `name` below `parent_fd`, opened after making it ours to empty (0700)."""
    os.chmod(name, 0o700, dir_fd=parent_fd)
    return os.open(name, _DIR, dir_fd=parent_fd)


def _clear_files(fd: int, failures: list[str]) -> list[str]:
    """Unlinks every entry of directory `fd` but its subdirectories, whose names it returns."""
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
            except OSError as e:
                failures.append(f"{entry.name}: {e}")
    return subdirs
