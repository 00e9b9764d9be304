"""`SandboxConfig`: the limits of one sandboxed run."""
from __future__ import annotations

import dataclasses
import sys


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits for one run.

    timeout_s: wall-clock seconds per test (and for defining the solution).
    startup_s: extra wall-clock seconds for interpreter start-up per process.
    memory_mb: address-space limit of the runner (the judge gets 512 MiB more). Where a memory
      cgroup can be made (root outside a container, or a delegated cgroup v2) the whole sandbox's
      memory, page cache, tmpfs, pipes and every process the program starts included, is also
      capped at ``memory_mb + scratch_mb`` (the scratch tmpfs) plus ``max_output_bytes`` and 96 MiB
      for the judge's own interpreter and data.
    max_output_bytes: largest file the runner may write (its stdout included).
    max_open_files: file descriptors the runner may hold at once (RLIMIT_NOFILE): each pipe or
      socket can pin kernel memory that no address-space limit counts.
    max_processes: how many processes / threads the program may add: RLIMIT_NPROC is
      set to the user's count at start plus this (Linux counts every process and thread
      of the user). Where that limit does not bind (root, or CAP_SYS_ADMIN / CAP_SYS_RESOURCE)
      a pids cgroup of this size where one can be made, else a seccomp filter that forbids
      the program any new process (threads stay allowed, bounded by ``memory_mb``).
      0 = none of these: RLIMIT_NPROC unchanged, no cgroup, no filter.
    network: "auto" or "namespace" (a network namespace; where ``unshare`` is unusable the
      sandbox refuses to run, `SandboxUnavailable`, unless ``allow_network``) or "audit"
      (no namespace: needs ``allow_network``).
    audit_hook: block sockets, process creation, kill and setrlimit in Python.
    python: interpreter that runs the generated code.
    max_workers: parallel runs in `score_code_batch`.
    allow_unconfined: run generated code even where the kernel offers no Landlock
      (then the file system is open to it; a warning is logged once).
    allow_network: run generated code without a network namespace (``network="audit"``, or
      where ``unshare`` is unusable): then only the audit hook, which ctypes gets past, keeps
      it off the network (trainer: ``task.code.sandbox_allow_network``).
    scratch_mb / scratch_files: size and number of files and directories of the scratch
      directory as a whole, a tmpfs of the sandbox's mount namespace (where there is none,
      ``allow_network``, only ``max_output_bytes`` per file bounds it).
    response_budget_s: wall-clock seconds for all of one response's tests; what is unchecked
      when it runs out scores 0 (``CodeResult.unscored``).
    batch_budget_s: wall-clock seconds for a whole `score_code_batch` call; responses and
      tests unchecked when it runs out score 0 (``CodeResult.unscored``).
    """

    timeout_s: float = 5.0
    startup_s: float = 10.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_open_files: int = 64
    max_processes: int = 64
    network: str = "auto"
    audit_hook: bool = True
    python: str = sys.executable
    max_workers: int = 1
    allow_unconfined: bool = False
    allow_network: bool = False
    scratch_mb: int = 64
    scratch_files: int = 10_000
    response_budget_s: float = 20.0
    batch_budget_s: float = 120.0

    def __post_init__(self):
        if self.network not in ("auto", "namespace", "audit"):
            raise ValueError(f"SandboxConfig.network must be 'auto', 'namespace' or 'audit', got {self.network!r}")
        if not (self.timeout_s > 0 and self.startup_s > 0):
            raise ValueError("SandboxConfig.timeout_s and startup_s must be > 0")
        if self.memory_mb < 16 or self.max_output_bytes < 1 or self.max_processes < 0 or self.max_workers < 1:
            raise ValueError("SandboxConfig: memory_mb >= 16, max_output_bytes >= 1, max_processes >= 0, "
                             "max_workers >= 1 required")
        if self.max_open_files < 16:
            raise ValueError(f"SandboxConfig.max_open_files must be >= 16 (the interpreter's own files), got "
                             f"{self.max_open_files}")
        if self.scratch_mb < 1 or self.scratch_files < 16:
            raise ValueError("SandboxConfig: scratch_mb >= 1 and scratch_files >= 16 required")
        if not (self.response_budget_s > 0 and self.batch_budget_s > 0):
            raise ValueError("SandboxConfig.response_budget_s and batch_budget_s must be > 0")
