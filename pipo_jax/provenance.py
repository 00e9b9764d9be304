"""What a results JSON or an exported policy records about how it was made: commit, package versions, machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_collections")


# Recorded results, not code: `experiments.reproduce` copies each run's JSON there before the next
# run of the same table starts, which must not make that run's commit read '+dirty'.
RESULTS_DIR = "experiments/results"


def git_commit(repo: str | None = None) -> str:
    """HEAD's hash (with '+dirty' when tracked files other than `RESULTS_DIR`'s differ), or 'unknown'
    outside git."""
    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout holding pipo_jax/
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){RESULTS_DIR}"], cwd=repo, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _cpuinfo_field(name: str, cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The value of the first `name : value` line of `cpuinfo` (Linux), None without the file or line."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    return _cpuinfo_field("model name") or platform.processor() or "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# x86 vector and matrix extensions: XLA:CPU generates code for the host's, so two hosts with one model name
# (a virtual machine's generic "AMD EPYC") but other extensions round differently.
_ISA_PREFIXES = ("sse4", "avx", "fma", "f16c", "amx")


def cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """The host's x86 vector / matrix extensions (sorted `flags` of `cpuinfo` starting with one of
    `_ISA_PREFIXES`); () where there is no such file or no such flag."""
    flags = _cpuinfo_field("flags", cpuinfo) or ""
    return tuple(sorted(x for x in flags.split() if x.startswith(_ISA_PREFIXES)))


def schedulable_cpus() -> int:
    """The cores this process may run on (its affinity mask where the OS has one, else `os.cpu_count()`).
    XLA:CPU sizes its thread pool by it, and the pool's split of a matmul moves the last bits."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def record() -> dict:
    """{commit, versions, cpu_model, cpu_isa, cpu_count, schedulable_cpus, platform} for a results JSON."""
    return {"commit": git_commit(), "versions": versions(), "cpu_model": cpu_model(), "cpu_isa": list(cpu_isa()),
            "cpu_count": os.cpu_count(), "schedulable_cpus": schedulable_cpus(), "platform": platform.platform()}
