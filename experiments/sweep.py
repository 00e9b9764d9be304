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
table per metric. A finished point is read back from <out>/groups/, not rerun (`experiments.study`). The
launch flags (`--workers`, `--emit_slurm`, `--group_index`, `--group_shard`, `--collect_only`, `--dry_run`)
are `experiments.schedule`'s, which `experiments.compare` (a sweep with paired arms) takes too.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Any

from absl import flags
from ml_collections import config_flags

from experiments import cli, hyper_grid, overfit, provenance, schedule, study, study_report
from experiments.overrides import with_overrides
from experiments.runs import parse_seeds
from pipo_jax.config.sections import RunConfig
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
    schedule.define_flags()


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


def point_rows(points: list[study.Point], entries: dict[str, dict], base: RunConfig,
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
    launch = schedule.Launch.from_flags()
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
        baseline_config = with_overrides(base, dict(baseline_overrides, seed=seeds[0]))
        want = study.fingerprint(RunConfig.from_config(baseline_config))
        baseline = next(p.label for p in points if study.fingerprint(p.config) == want)
    groups = study.group_points(points)
    out = FLAGS.out
    code = study.code_version(origin["commit"])
    base_root = FLAGS.base_dir or os.path.join(out, "bases")
    done = schedule.run_study("experiments.sweep", points, groups, out, lambda p: study.base_of(p, base_root), code,
                              launch)
    if done is None:
        return
    entries, reused = done
    rows = point_rows(points, entries, RunConfig.from_config(base), groups)
    summary = study_report.summarise(rows, baseline)
    cpu = time.process_time() - cpu_start
    children = os.times()
    record = {"script": "experiments/sweep.py", "argv": sys.argv[1:], "config_file": config_path, "swept_keys": swept,
              "sweep_mode": FLAGS.sweep_mode, "seeds": seeds, "baseline": baseline, "members": launch.members,
              **origin, "code_version": code,
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
