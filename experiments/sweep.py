"""Config sweeps: any config keys, product or zip, over seeds; each group of points that share one
jit-static spec runs as ONE vmapped program; resumable; side by side on one host or one group per
task of a cluster (a SLURM job array, TPU VMs).

    python -m experiments.sweep --config=configs/grpo.py:tiny --config.pipo.enabled=true \
        --sweep=pipo.lam=0.05,0.1,0.2 --sweep=train.lr=1e-4,3e-4 --seeds=0-2 --out=runs/lam_lr
    python -m experiments.sweep --config=experiments/studies/pipo_lam_lr.py --seeds=0-2   # its get_hyper
    python -m experiments.sweep ... --sweep_mode=zip              # the i-th values of every --sweep together
    python -m experiments.sweep ... --baseline='pipo.enabled=false'  # paired differences against that point
    python -m experiments.sweep ... --workers=2                  # two groups at a time, each its own process
    python -m experiments.sweep ... --emit_slurm=sweep.sbatch    # a job array, one group per task
    python -m experiments.sweep --config=configs/grpo.py:tiny --seeds=0,1 --lams=0.05,0.1 --windows=4,8

A config file may declare its study: `get_hyper(h)` returning a list of points built with
`experiments.hyper_grid` (`h.product`, `h.zip`, `h.sweep`); `--sweep` flags replace it. Every point's
config is validated before anything runs. `--lams` / `--windows` are `--sweep=pipo.lam=...` /
`--sweep=pipo.window=...` with PIPO on, and then the PIPO-off point of each seed is the baseline
(`--baseline=none`: no baseline). Writes <out>/sweep.json (provenance, every point's config diff and
metrics, wall and compile time, per metric mean / CI and paired differences), sweep.png, and prints a
table per metric. A finished point is read back from <out>/groups/, not rerun (`experiments.study`).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import time
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from experiments import cli, hyper_grid, overfit, provenance, study, study_report
from experiments.overrides import with_overrides
from experiments.runs import parse_seeds
from pipo_jax.run import atomic

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (tests import this module beside other commands')."""
    config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset")
    flags.DEFINE_multi_string("sweep", [], "KEY=V1,V2,...: an axis of the sweep (repeatable)")
    flags.DEFINE_enum("sweep_mode", "product", ["product", "zip"], "how the --sweep axes combine")
    flags.DEFINE_list("seeds", ["0"], "seeds: 'a-b' (inclusive) or a comma list")
    flags.DEFINE_list("lams", [], "pipo.lam values (PIPO on; the PIPO-off point is the baseline)")
    flags.DEFINE_list("windows", [], "pipo.window (K) values (PIPO on; as --lams)")
    flags.DEFINE_string("baseline", "", "KEY=VALUE[;KEY=VALUE]: the point (added if not swept) the others are "
                        "paired against; 'none' = no baseline")
    flags.DEFINE_string("out", "runs/sweep", "output directory")
    flags.DEFINE_string("base_dir", "", "where the per-seed warmed-up bases are cached; '' = <out>/bases")
    flags.DEFINE_integer("workers", 1, "groups run at a time, each its own process")
    flags.DEFINE_integer("group_index", -1, "run only this group (0-based; a job array's task id)")
    flags.DEFINE_string("group_shard", "", "I/N: run only the groups whose index is I modulo N")
    flags.DEFINE_bool("collect_only", False, "run nothing: write sweep.json from the stored groups")
    flags.DEFINE_string("emit_slurm", "", "write a SLURM job-array script (one group per task) here and exit")
    flags.DEFINE_multi_string("slurm_option", [], "an #SBATCH option of --emit_slurm's script, e.g. "
                              "--gpus-per-task=1 (repeatable)")
    flags.DEFINE_bool("dry_run", False, "validate every point, print the groups and exit")


LAUNCH_FLAGS = ("workers", "group_index", "group_shard", "emit_slurm", "slurm_option", "collect_only", "dry_run")


def parse_baseline(text: str) -> dict[str, Any] | None:
    """'pipo.enabled=false;pipo.lam=0.1' -> {key: text}; '' / 'none' -> None."""
    if text.strip().lower() in ("", "none"):
        return None
    out = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise cli.UsageError(f"--baseline={text}: expected KEY=VALUE[;KEY=VALUE] or none")
        out[key.strip()] = value.strip()
    return out


def config_file(text: str) -> str:
    """The config flag's file ('file.py:preset' as the flag holds its default -> 'file.py')."""
    return text if os.path.isfile(text) else (text.rpartition(":")[0] or text)


def study_grid(config_path: str) -> list[dict[str, Any]] | None:
    """The config file's own sweep (`get_hyper(hyper_grid)`), or None if it declares none."""
    spec = importlib.util.spec_from_file_location("_study_config", config_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_hyper"):
        return None
    try:
        return list(module.get_hyper(hyper_grid))
    except ValueError as e:
        raise cli.UsageError(f"--config={config_path}: get_hyper: {e}") from None


def the_grid(config_path: str, sweeps: list[str], mode: str, lams: list[str], windows: list[str],
             baseline_text: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(the sweep's grid, its baseline overrides) from the flags or the config file's get_hyper."""
    baseline = parse_baseline(baseline_text)
    legacy = [("pipo.lam", cli.parse_list("lams", lams, float)),
              ("pipo.window", cli.parse_list("windows", windows, int))]
    legacy = [(k, v) for k, v in legacy if v]
    try:
        if legacy:
            if sweeps:
                raise cli.UsageError("--lams / --windows: give the grid with --sweep alone (e.g. --sweep=pipo.lam=...)")
            grid = hyper_grid.product([hyper_grid.sweep("pipo.enabled", [True])]
                                      + [hyper_grid.sweep(k, v) for k, v in legacy])
            if not baseline_text:
                baseline = {"pipo.enabled": "false"}
        elif sweeps:
            grid = hyper_grid.from_flags(sweeps, mode)
        else:
            grid = study_grid(config_path) or [{}]
    except ValueError as e:
        if isinstance(e, cli.UsageError):
            raise
        raise cli.UsageError(str(e)) from None
    return grid, baseline


def select_groups(n: int, index: int, shard: str) -> list[int]:
    """The group indices this process runs: `index` (>= 0, --group_index), `shard` 'I/N' (--group_shard: those
    equal to I modulo N), or all `n`."""
    if index >= 0:
        if index >= n:
            raise cli.UsageError(f"--group_index={index}: the sweep has {n} groups (0-{n - 1})")
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
    """This command's flags without the launch flags, plus `flag_values` (e.g. group_index=3)."""
    keep = [a for a in argv if a.lstrip("-").split("=")[0].removeprefix("no") not in LAUNCH_FLAGS]
    return keep + [f"--{k}={v}" for k, v in flag_values.items()]


def slurm_script(argv: list[str], n_groups: int, out: str, options: list[str]) -> str:
    """A SLURM job-array script: task i runs group i of this sweep (`--group_index=$SLURM_ARRAY_TASK_ID`)."""
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "experiments.sweep", *child_argv(argv)])
    lines = ["#!/usr/bin/env bash", "#SBATCH --job-name=pipo_sweep", f"#SBATCH --array=0-{n_groups - 1}",
             f"#SBATCH --output={os.path.abspath(out)}/slurm-%A_%a.log", *(f"#SBATCH {o}" for o in options),
             "set -euo pipefail", f"cd {shlex.quote(os.getcwd())}",  # where the flags' relative paths point
             f'{command} --group_index="${{SLURM_ARRAY_TASK_ID}}"',
             f"# when every task is done: {command} --collect_only"]
    return "\n".join(lines) + "\n"


def run_workers(argv: list[str], indices: list[int], workers: int, out: str) -> None:
    """Runs each group of `indices` as its own process (`--group_index`), `workers` at a time; logs go to
    <out>/logs/group<i>.log. A failed group stops the others (SIGTERM: each saves nothing half-done) and
    is one line naming it and its log."""
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    pending, running = list(indices), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                g = pending.pop(0)
                log = open(os.path.join(out, "logs", f"group{g}.log"), "w")
                proc = subprocess.Popen([sys.executable, "-m", "experiments.sweep", *child_argv(argv, group_index=g)],
                                        stdout=log, stderr=subprocess.STDOUT)  # this cwd: relative paths hold
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


def point_rows(points: list[study.Point], entries: dict[str, dict], base: ml_collections.ConfigDict,
               groups: list[list[study.Point]]) -> list[dict]:
    group_of = {p.name: g for g, members in enumerate(groups) for p in members}
    rows = []
    for p in points:
        e = entries[p.name]
        rows.append({"name": p.name, "label": p.label, "seed": p.seed, "overrides": p.overrides,
                     "config_diff": study.config_diff(base, p.config), "group": group_of[p.name],
                     "metrics": study_report.point_metrics(e["result"]), "group_timing": e["group"],
                     "gap_flag": overfit.heldout_gap_flag(e["result"]["reward"], e["result"]["accuracy"]),
                     "result": e["result"]})
    return rows


def main(argv):
    if len(argv) > 1:
        raise cli.UsageError(f"unexpected arguments {argv[1:]}: give the sweep as flags")
    start, cpu_start = time.perf_counter(), time.process_time()
    origin = provenance.record()
    base = FLAGS.config
    config_path = config_file(config_flags.get_config_filename(flags.FLAGS["config"]))
    if FLAGS.workers < 1:
        raise cli.UsageError(f"--workers={FLAGS.workers}: must be >= 1")
    seeds = parse_seeds(",".join(FLAGS.seeds))
    grid, baseline_overrides = the_grid(config_path, FLAGS.sweep, FLAGS.sweep_mode, FLAGS.lams, FLAGS.windows,
                                        FLAGS.baseline)
    keys = list(dict.fromkeys(k for o in grid for k in o if k != "seed"))
    swept = [k for k in keys if len({str(o.get(k)) for o in grid}) > 1] or keys  # the keys that vary
    if baseline_overrides is not None and baseline_overrides not in grid:
        grid = grid + [baseline_overrides]
    points = study.make_points(base, grid, seeds)  # every point validated before anything runs
    baseline = None
    if baseline_overrides is not None:
        want = study.fingerprint(with_overrides(base, dict(baseline_overrides, seed=seeds[0])))
        baseline = next(p.label for p in points if study.fingerprint(p.config) == want)
    groups = study.group_points(points)
    indices = select_groups(len(groups), FLAGS.group_index, FLAGS.group_shard)
    print(f"{len(points)} points in {len(groups)} program{'s' * (len(groups) != 1)} (groups of equal jit-static "
          "spec)", flush=True)
    if FLAGS.dry_run:
        for g, members in enumerate(groups):
            print(f"group {g}: " + "; ".join(p.name for p in members))
        return
    out = FLAGS.out
    if FLAGS.emit_slurm:
        os.makedirs(out, exist_ok=True)
        with open(FLAGS.emit_slurm, "w") as f:
            f.write(slurm_script(sys.argv[1:], len(groups), out, FLAGS.slurm_option))
        print(f"wrote {FLAGS.emit_slurm}: sbatch it ({len(groups)} tasks), then rerun with --collect_only")
        return
    os.makedirs(out, exist_ok=True)
    code = study.code_version(origin["commit"])
    base_root = FLAGS.base_dir or os.path.join(out, "bases")
    entries = study.stored_points(out, points, code)
    reused = [p.name for g in indices for p in groups[g] if p.name in entries]
    if reused:
        print(f"{len(reused)} point(s) finished earlier: read from {os.path.join(out, study.GROUPS)}", flush=True)
    todo = [g for g in indices if any(p.name not in entries for p in groups[g])]
    if FLAGS.collect_only and todo:
        missing = [p.name for g in todo for p in groups[g] if p.name not in entries]
        raise cli.UsageError(f"--collect_only: {len(missing)} point(s) not finished in {out}, e.g. {missing[0]}")
    if FLAGS.workers > 1 and len(todo) > 1:
        for p in {(p.seed, study.base_dir_of(base_root, p.config)): p for g in todo for p in groups[g]}.values():
            study.base_of(p, base_root)  # each base warmed up once, here, before the groups' processes read it
        run_workers(sys.argv[1:], todo, FLAGS.workers, out)
        entries = study.stored_points(out, points, code)
    else:
        for g in todo:
            pending = [p for p in groups[g] if p.name not in entries]
            done = study.run_points(pending, out, base_root, code)
            entries.update(done)
            timing = next(iter(done.values()))["group"]
            print(f"group {g}: {len(pending)} point(s) in {timing['wall_s']:.0f}s "
                  f"({timing['compile_s']:.0f}s compiling)", flush=True)
    if len(indices) < len(groups):
        return  # one task of a job array: the collecting run writes sweep.json
    missing = [p.name for p in points if p.name not in entries]
    if missing:  # e.g. the sources changed while the groups' processes ran: their results are other code's
        raise RuntimeError(f"{len(missing)} point(s) have no stored result after their groups ran, e.g. {missing[0]} "
                           "(see the lines above)")
    rows = point_rows(points, entries, base, groups)
    summary = study_report.summarise(rows, baseline)
    cpu = time.process_time() - cpu_start
    children = os.times()
    record = {"script": "experiments/sweep.py", "argv": sys.argv[1:], "config_file": config_path, "swept_keys": swept,
              "sweep_mode": FLAGS.sweep_mode, "seeds": seeds, "baseline": baseline, **origin, "code_version": code,
              "groups": [[p.name for p in members] for members in groups],
              "reused_points": reused,
              "wall_time_s": time.perf_counter() - start, "cpu_time_s": cpu + children.children_user
              + children.children_system, "summary": summary, "points": rows}
    atomic.write_json_atomic(os.path.join(out, "sweep.json"), record, indent=1)
    study_report.plot(rows, swept, summary, os.path.join(out, "sweep.png"))
    print(study_report.format_tables(summary))
    for r in rows:  # a training reward that rose while held-out accuracy did not (`overfit.heldout_gap_flag`)
        if r["gap_flag"]:
            print(f"{r['name']}: {r['gap_flag']}")
    print(f"wrote {os.path.join(out, 'sweep.json')} and sweep.png ({record['wall_time_s']:.0f}s wall, "
          f"{record['cpu_time_s']:.0f}s CPU)")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
