"""Where a study's groups run, for every command on the sweep engine (`experiments.sweep`, `experiments.compare`):
one after another in this process; `--workers=N` side by side, each group its own process running the same
command with `--group_index`; one group per task of a SLURM job array (`--emit_slurm`) or the groups of one
TPU VM (`--group_shard`, experiments/launch/tpu_sweep.sh). A point stored in <out>/groups/
(`study.stored_points`) is read back, not rerun; `--collect_only` runs nothing and reports the stored points.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from absl import flags

from experiments import cli, study, vmapped
from pipo_jax.run import atomic

FLAGS = flags.FLAGS

LAUNCH_FLAGS = ("workers", "group_index", "group_shard", "emit_slurm", "slurm_option", "collect_only", "dry_run")


def define_flags() -> None:
    """The launch flags (`LAUNCH_FLAGS`), defined by each study command's own `define_flags`."""
    flags.DEFINE_integer("workers", 1, "groups run at a time, each its own process")
    flags.DEFINE_integer("group_index", -1, "run only this group (0-based; a job array's task id)")
    flags.DEFINE_string("group_shard", "", "I/N: run only the groups whose index is I modulo N")
    flags.DEFINE_bool("collect_only", False, "run nothing: write the report from the stored groups")
    flags.DEFINE_string("emit_slurm", "", "write a SLURM job-array script (one group per task) here and exit")
    flags.DEFINE_multi_string("slurm_option", [], "an #SBATCH option of --emit_slurm's script, e.g. "
                              "--gpus-per-task=1 (repeatable)")
    flags.DEFINE_bool("dry_run", False, "validate every point, print the groups and exit")
    flags.DEFINE_enum("members", "vmap", list(vmapped.MEMBERS), "how a group's points share its one program: vmap "
                      "(batched, the accelerators' form; each point equals its separate run up to the float32 order "
                      "of batched sums) | map (one after another, each bit-equal to its separate run)")


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a study's groups run (the launch flags); `argv`: the command's flags, which its group processes
    and the SLURM script run again (with the launch flags replaced)."""

    argv: tuple[str, ...] = ()
    workers: int = 1
    group_index: int = -1
    group_shard: str = ""
    collect_only: bool = False
    emit_slurm: str = ""
    slurm_options: tuple[str, ...] = ()
    dry_run: bool = False
    members: str = "vmap"  # how a group's points share its program (`vmapped.MEMBERS`; not a launch flag: kept)

    @classmethod
    def from_flags(cls) -> Launch:
        if FLAGS.workers < 1:
            raise cli.UsageError(f"--workers={FLAGS.workers}: must be >= 1")
        return cls(tuple(sys.argv[1:]), FLAGS.workers, FLAGS.group_index, FLAGS.group_shard, FLAGS.collect_only,
                   FLAGS.emit_slurm, tuple(FLAGS.slurm_option), FLAGS.dry_run, FLAGS.members)


def select_groups(n: int, index: int, shard: str) -> list[int]:
    """The group indices this process runs: `index` (>= 0, --group_index), `shard` 'I/N' (--group_shard: those
    equal to I modulo N), or all `n`."""
    if index >= 0:
        if index >= n:
            raise cli.UsageError(f"--group_index={index}: the study has {n} groups (0-{n - 1})")
        return [index]
    if shard:
        try:
            i, k = (int(x) for x in shard.split("/"))
            if not 0 <= i < k:
                raise ValueError
        except ValueError:
            raise cli.UsageError(f"--group_shard={shard}: expected I/N with 0 <= I < N") from None
        return [g for g in range(n) if g % k == i]
    return list(range(n))


def child_argv(argv: list[str], **flag_values) -> list[str]:
    """A command's flags without the launch flags, plus `flag_values` (e.g. group_index=3)."""
    keep = [a for a in argv if a.lstrip("-").split("=")[0].removeprefix("no") not in LAUNCH_FLAGS]
    return keep + [f"--{k}={v}" for k, v in flag_values.items()]


def slurm_script(module: str, argv: list[str], n_groups: int, out: str, options: list[str]) -> str:
    """A SLURM job-array script: task i runs group i of the study `python -m <module> <argv>`
    (`--group_index=$SLURM_ARRAY_TASK_ID`)."""
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", module, *child_argv(argv)])
    lines = ["#!/usr/bin/env bash", f"#SBATCH --job-name=pipo_{module.rpartition('.')[2]}",
             f"#SBATCH --array=0-{n_groups - 1}", f"#SBATCH --output={os.path.abspath(out)}/slurm-%A_%a.log",
             *(f"#SBATCH {o}" for o in options),
             "set -euo pipefail", f"cd {shlex.quote(os.getcwd())}",  # where the flags' relative paths point
             f'{command} --group_index="${{SLURM_ARRAY_TASK_ID}}"',
             f"# when every task is done: {command} --collect_only"]
    return "\n".join(lines) + "\n"


def appended_log(path: str, command: list[str]):
    """`path` opened for appending, a line naming `command` and the time written first: a rerun keeps the
    lines of an earlier try (a failed one's above), each under its own header. The caller closes it."""
    log = open(path, "a")
    log.write(f"=== {' '.join(command)} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    log.flush()
    return log


def run_workers(module: str, argv: list[str], indices: list[int], workers: int, out: str) -> None:
    """Runs each group of `indices` as its own process (`python -m <module> <argv> --group_index=i`), `workers`
    at a time; logs go to <out>/logs/group<i>.log (appended, each try under a line naming its command and
    time). A failed group stops the others (SIGTERM: each saves
    nothing half-done) and is one line naming it and its log."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    pending, running = list(indices), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                g = pending.pop(0)
                command = [sys.executable, "-m", module, *child_argv(argv, group_index=g)]
                log = appended_log(os.path.join(out, "logs", f"group{g}.log"), command)
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)  # this cwd: relative paths hold
                running[proc.pid] = (g, log, proc)
            pid, status = os.waitpid(-1, 0)
            if pid not in running:
                continue
            g, log, _ = running.pop(pid)
            log.close()
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                raise RuntimeError(f"group {g}: its process exited with {code}; see {log.name}")
            print(f"group {g}: done ({log.name})", flush=True)
    finally:
        for g, log, proc in running.values():  # a failure or an interrupt here: no orphaned group
            proc.terminate()
            proc.wait()
            log.close()


def run_study(module: str, points: list[study.Point], groups: list[list[study.Point]], out: str,
              base_path: Callable[[study.Point], str], code: str, launch: Launch
              ) -> tuple[dict[str, dict], list[str]] | None:
    """Runs the `groups` of `points` that `launch` gives this process and are not stored in `out`, each from
    its members' warmed-up bases (`base_path(point)`, a HF directory made on first use), writing its own
    group file. Returns every point's entry by name (`study.run_points`) and the names read back, not rerun;
    None where this process reports nothing: a dry run, an emitted SLURM script, or some groups of many
    (the collecting run reports)."""
    indices = select_groups(len(groups), launch.group_index, launch.group_shard)
    print(f"{len(points)} points in {len(groups)} program{'s' * (len(groups) != 1)} (groups of equal jit-static "
          "spec)", flush=True)
    if launch.dry_run:
        for g, members in enumerate(groups):
            print(f"group {g}: " + "; ".join(p.name for p in members))
        return None
    os.makedirs(out, exist_ok=True)
    if launch.emit_slurm:
        atomic.write_text_atomic(launch.emit_slurm,  # a full disk keeps no half-written script
                                 slurm_script(module, list(launch.argv), len(groups), out, list(launch.slurm_options)))
        print(f"wrote {launch.emit_slurm}: sbatch it ({len(groups)} tasks), then rerun with --collect_only")
        return None
    entries = study.stored_points(out, points, code, launch.members)
    reused = [p.name for g in indices for p in groups[g] if p.name in entries]
    if reused:
        print(f"{len(reused)} point(s) finished earlier: read from {os.path.join(out, study.GROUPS)}", flush=True)
    todo = [g for g in indices if any(p.name not in entries for p in groups[g])]
    if launch.collect_only and todo:
        missing = [p.name for g in todo for p in groups[g] if p.name not in entries]
        raise cli.UsageError(f"--collect_only: {len(missing)} point(s) not finished in {out}, e.g. {missing[0]}")
    if launch.workers > 1 and len(todo) > 1:
        for g in todo:  # each base warmed up once, here, before the groups' processes read it
            for p in groups[g]:
                base_path(p)
        run_workers(module, list(launch.argv), todo, launch.workers, out)
        entries = study.stored_points(out, points, code, launch.members)
    else:
        for g in todo:
            pending = [p for p in groups[g] if p.name not in entries]
            done = study.run_points(pending, out, base_path, code, launch.members)
            entries.update(done)
            timing = next(iter(done.values()))["group"]
            print(f"group {g}: {len(pending)} point(s) in {timing['wall_s']:.0f}s "
                  f"({timing['compile_s']:.0f}s compiling)", flush=True)
    if len(indices) < len(groups):
        return None  # one task of a job array: the collecting run reports
    missing = [p.name for p in points if p.name not in entries]
    if missing:  # e.g. the sources changed while the groups' processes ran: their results are other code's
        raise RuntimeError(f"{len(missing)} point(s) have no stored result after their groups ran, e.g. {missing[0]} "
                           "(see the lines above)")
    return entries, reused
