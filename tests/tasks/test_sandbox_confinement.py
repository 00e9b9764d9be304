"""The code sandbox holds against the escapes found in review: a setsid fork bomb of
detached children (every one dies with the run), reading /etc/passwd and listing the
working tree (closed by Landlock), killing the supervisor. Where the kernel has no
Landlock, the sandbox refuses to run generated code unless `allow_unconfined`."""

import errno
import os
import pathlib

import pytest

from pipo_jax.tasks import code as cd
from tests.tasks.test_code import processes_named
from tests.typed import task_of

SANDBOX_REFUSAL_TESTED = True  # tests/conftest.py: no "run unconfined" stand-in here

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the working tree
LANDLOCK = cd.landlock_abi() >= 1
needs_landlock = pytest.mark.skipif(not LANDLOCK, reason="this kernel offers no Landlock (refusal tested below)")
MODES = ["audit"] + (["namespace"] if cd.namespaces_available() else [])


def _cfg(**kw):
    kw.setdefault("allow_network", kw.get("network") == "audit" or not cd.namespaces_available())
    return cd.SandboxConfig(timeout_s=5.0, startup_s=10.0, allow_unconfined=not LANDLOCK, **kw)


def _call(code: str, expected, **kw) -> cd.CodeResult:
    return cd.run_tests(code, [cd.CallTest("probe", (), expected)], _cfg(**kw))


def test_landlock_abi_is_what_the_kernel_reports():
    # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) answered directly, and the LSM list.
    lsm = pathlib.Path("/sys/kernel/security/lsm")
    if lsm.exists():
        assert LANDLOCK == ("landlock" in lsm.read_text().split(","))
    assert cd.landlock_abi() == max(int(cd._libc().syscall(444, None, 0, 1)), 0)


@needs_landlock
@pytest.mark.parametrize("network", MODES)
def test_reading_etc_passwd_is_denied(network):
    code = ("def probe():\n"
            "    try:\n"
            "        return open('/etc/passwd').read()\n"
            "    except PermissionError:\n"
            "        return 'denied'\n")
    r = _call(code, "denied", network=network)
    assert r.outcomes == ("pass",), r.feedback
    assert "root:" not in r.feedback


@needs_landlock
def test_listing_or_reading_the_working_tree_is_denied():
    code = ("import os\n"
            "def probe():\n"
            "    out = []\n"
            f"    for path in ({str(ROOT)!r}, '/', '/etc', '/proc/self'):\n"
            "        try:\n"
            "            os.listdir(path)\n"
            "            out.append('listed ' + path)\n"
            "        except PermissionError:\n"
            "            out.append('denied')\n"
            "    for path in (" + repr(str(ROOT / "README.md")) + ", " + repr(cd.__file__) + "):\n"
            "        try:\n"
            "            open(path).read()\n"
            "            out.append('read ' + path)\n"
            "        except PermissionError:\n"
            "            out.append('denied')\n"
            "    return out\n")
    r = _call(code, ["denied"] * 6)
    assert r.outcomes == ("pass",), r.feedback


@needs_landlock
def test_the_scratch_directory_and_the_standard_library_stay_usable():
    code = ("import os, tempfile\n"
            "def probe():\n"
            "    import json, fractions, decimal  # imported after confinement: read from the stdlib\n"
            "    with open('notes.txt', 'w') as f:\n"
            "        f.write(json.dumps([1, 2]))\n"
            "    os.mkdir('sub')\n"
            "    with tempfile.NamedTemporaryFile(dir='sub') as t:\n"
            "        t.write(b'x')\n"
            "    try:\n"
            "        open('/tmp/pipo_sandbox_escape', 'w')\n"
            "        outside = 'written'\n"
            "    except PermissionError:\n"
            "        outside = 'denied'\n"
            "    return [json.loads(open('notes.txt').read()), str(fractions.Fraction(2, 4)), outside]\n")
    r = _call(code, [[1, 2], "1/2", "denied"])
    assert r.outcomes == ("pass",), r.feedback
    assert not os.path.exists("/tmp/pipo_sandbox_escape")


@pytest.mark.parametrize("network", MODES)
def test_setsid_fork_bomb_of_detached_children_is_killed(network):
    """50 children, each leaving its session (setsid) and double-forking into a detached
    grandchild that forks once more: 100 detached processes named for this test. The
    program passes only when all 100 have reported in; afterwards none is left.
    ``max_processes=0`` (no process cap: 100 is more than the default allows): the subject
    here is the kill, not the cap."""
    name = f"pipobomb{os.getpid() % 100000}"
    code = (
        "import ctypes, os, time\n"
        "def probe():\n"
        "    libc = ctypes.CDLL(None)\n"
        "    r, w = os.pipe()\n"
        "    for _ in range(50):\n"
        "        if libc.fork() == 0:\n"
        "            libc.setsid()\n"
        "            if libc.fork() != 0:\n"
        "                libc._exit(0)\n"  # the grandchild is orphaned: reparented (to the subreaper)
        "            libc.fork()\n"  # and forks once more
        f"            libc.prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "            os.write(w, b'x')\n"
        "            while True:\n"
        "                libc.pause()\n"
        "    got = 0\n"
        "    while got < 100:\n"
        "        got += len(os.read(r, 100))\n"
        "    return got\n")
    r = _call(code, 100, network=network, max_processes=0)
    assert r.outcomes == ("pass",), r.feedback
    assert processes_named(name) == []


@pytest.mark.parametrize("network", MODES)
def test_detached_children_of_a_timed_out_program_are_killed(network):
    name = f"pipohang{os.getpid() % 100000}"
    code = (
        "import ctypes, os\n"
        "def probe():\n"
        "    libc = ctypes.CDLL(None)\n"
        "    for _ in range(5):\n"
        "        if libc.fork() == 0:\n"
        "            libc.setsid()\n"
        f"            libc.prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "            while True:\n"
        "                libc.pause()\n"
        "    while True:\n"  # swallows its own timer: only the parent's deadline ends it
        "        try:\n"
        "            libc.pause()\n"
        "        except BaseException:\n"
        "            pass\n")
    r = cd.run_tests(code, [cd.CallTest("probe", (), 0)],
                     cd.SandboxConfig(timeout_s=0.5, startup_s=5.0, allow_unconfined=not LANDLOCK, network=network,
                                      max_processes=0, allow_network=network == "audit"))
    assert r.outcomes == ("timeout",)
    assert processes_named(name) == []


@pytest.mark.skipif(cd.landlock_abi() < 6, reason="signal scoping needs Landlock ABI >= 6")
def test_the_program_cannot_kill_its_supervisor():
    code = ("import ctypes, os, signal\n"
            "def probe():\n"
            "    libc = ctypes.CDLL(None, use_errno=True)\n"
            "    rc = libc.kill(os.getppid(), signal.SIGKILL)\n"
            "    return [rc, ctypes.get_errno()]\n")
    r = _call(code, [-1, errno.EPERM], network="audit")
    assert r.outcomes == ("pass",), r.feedback


def test_process_count_is_capped():
    """RLIMIT_NPROC caps the forks; as root, where Linux ignores it, a pids cgroup or the
    seccomp filter does (no fork at all). tests/tasks/test_sandbox_hacks.py has more bombs."""
    code = ("import ctypes\n"
            "def probe():\n"
            "    libc = ctypes.CDLL(None)\n"
            "    n = 0\n"
            "    while n < 1000:\n"
            "        pid = libc.fork()\n"
            "        if pid == 0:\n"
            "            libc.pause()\n"
            "        if pid < 0:\n"
            "            return 'capped'\n"
            "        n += 1\n"
            "    return n\n")
    r = _call(code, "capped", network="audit", max_processes=16)
    assert r.outcomes == ("pass",), r.feedback


def test_without_landlock_the_sandbox_refuses_unless_allowed(monkeypatch):
    monkeypatch.setattr(cd, "landlock_abi", lambda: 0)  # as on a kernel without Landlock
    add = "def add(a, b):\n    return a + b\n"
    tests = [cd.AssertTest("assert add(1, 2) == 3")]
    with pytest.raises(cd.SandboxUnavailable, match="no Landlock.*allow_unconfined=True"):
        cd.run_tests(add, tests, cd.SandboxConfig(timeout_s=5.0))
    assert cd.run_tests(add, tests, cd.SandboxConfig(timeout_s=5.0, allow_unconfined=True)).outcomes == ("pass",)


def test_a_code_task_without_landlock_is_a_config_error(monkeypatch):
    from configs import grpo
    from pipo_jax.rl.spec import ConfigError

    monkeypatch.setattr(cd, "landlock_abi", lambda: 0)
    c = grpo.get_config("micro")
    c.task.name, c.model.path, c.task.dataset.path = "code", "/nonexistent", "x.jsonl"
    c.log.jit_loop, c.warmup.enabled, c.rollout.max_new_tokens = False, False, 16
    with pytest.raises(ConfigError, match=r"config\.task\.code\.sandbox_allow_unconfined: this kernel offers no Landlock"):
        task_of(c)  # before any file is read
