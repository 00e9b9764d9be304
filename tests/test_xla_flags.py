"""The test processes' XLA flags and the once-more rule of the sharded workers (tests/xla_flags.py)."""

import sys

from tests.xla_flags import TERMINATE_TIMEOUT, XLA_CPU_RENDEZVOUS_ABORT, run_once_more_after_abort, xla_flags

# A worker that fails `fails` times (counting its runs in a file), printing `message` on failure.
WORKER = """
import pathlib, sys
runs = pathlib.Path(sys.argv[1]); n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
if n <= int(sys.argv[2]):
    print(sys.argv[3], file=sys.stderr); sys.exit(134)
print("done", n)
"""


def _run(tmp_path, fails: int, message: str):
    tmp_path.mkdir(exist_ok=True)
    runs = tmp_path / "runs"
    proc = run_once_more_after_abort([sys.executable, "-c", WORKER, str(runs), str(fails), message], timeout=60)
    return proc, int(runs.read_text())


def test_an_aborted_worker_runs_once_more(tmp_path, capsys):
    proc, runs = _run(tmp_path, 1, f"... {XLA_CPU_RENDEZVOUS_ABORT} AllReduce ...")
    assert (proc.returncode, proc.stdout.strip(), runs) == (0, "done 2", 2)
    assert "running it once more" in capsys.readouterr().err


def test_a_second_abort_or_another_failure_is_returned(tmp_path):
    proc, runs = _run(tmp_path / "a", 2, XLA_CPU_RENDEZVOUS_ABORT)
    assert (proc.returncode, runs) == (134, 2)
    proc, runs = _run(tmp_path / "b", 1, "Traceback: ValueError")
    assert (proc.returncode, runs) == (134, 1)


def test_a_later_flag_replaces_the_same_flag(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=4")
    flags = xla_flags(f"{TERMINATE_TIMEOUT}=180").split()
    assert flags[0] == "--xla_cpu_max_isa=AVX2"  # the caller's flag kept, its device count dropped
    assert not any(f.startswith("--xla_force_host_platform_device_count") for f in flags)
    assert [f for f in flags if f.startswith(TERMINATE_TIMEOUT)] == [f"{TERMINATE_TIMEOUT}=180"]
