"""The README's main job over several seeds, each exactly as a user runs it:

    python -m experiments.train --config=configs/grpo.py:tiny --config.pipo.enabled=true \\
        --workdir=<out>/seed<s> --config.seed=<s>

    python -m experiments.main_job_seeds --seeds=0-4 --workers=2 --out=runs/main_job_seeds

Seeds stand in for other machines' floating-point numerics (each seed has its own
warm-up, so its own base model). Writes <out>/main_job_seeds.json: per seed the held-out
greedy accuracy of the base and after RL, the warm-up's teacher accuracies, the wall and
CPU time of the process; the commit, package versions, CPU model and the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from absl import flags

from experiments import cli, provenance
from experiments.runs import parse_seeds
from pipo_jax.run import observe

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (tests import this module beside other commands')."""
    flags.DEFINE_string("seeds", "0-4", "seeds: 'a-b' (inclusive) or a comma list")
    flags.DEFINE_integer("workers", 1, "runs at a time (each is a whole training process)")
    flags.DEFINE_string("out", "runs/main_job_seeds", "output directory (one workdir per seed)")
    flags.DEFINE_list("extra", [], "further --config.* overrides, e.g. config.iterations=100")
    flags.DEFINE_bool("collect_only", False, "run nothing: summarise the seeds whose workdirs in --out "
                      "hold a finished run (wall / CPU time as printed in <out>/seed<s>.time, if any)")


COMMAND = ["-m", "experiments.train", "--config=configs/grpo.py:tiny", "--config.pipo.enabled=true"]


def seed_command(seed: int, workdir: str, extra: list[str]) -> list[str]:
    return [sys.executable, *COMMAND, f"--workdir={workdir}", f"--config.seed={seed}",
            "--config.log.progress=false", *(f"--{e}" for e in extra)]


def last_line(path: str) -> str:
    """The last non-empty line of a log file."""
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "(empty log)"


def seed_result(workdir: str) -> dict:
    """Accuracy curve and warm-up numbers of a finished run, from its metrics.jsonl / summary.json."""
    rows = observe.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    first = rows[0]
    acc = [(r["step"], r["heldout_accuracy"]) for r in rows if "heldout_accuracy" in r]
    return {"initial_accuracy": summary["initial_accuracy"], "final_accuracy": summary["final_accuracy"],
            "gain": summary["final_accuracy"] - summary["initial_accuracy"],
            "acc_steps": [a[0] for a in acc], "accuracy": [a[1] for a in acc],
            "warmup_steps": first.get("warmup_steps"), "warmup_time_s": first.get("warmup_time_s"),
            "warmup_teacher_solution_accuracy": first.get("warmup_teacher_solution_accuracy"),
            "warmup_teacher_feedback_accuracy": first.get("warmup_teacher_feedback_accuracy")}


def run_seeds(seeds: list[int], out: str, workers: int, extra: list[str]) -> dict:
    """Runs the main job for every seed (`workers` processes at a time); returns the record."""
    os.makedirs(out, exist_ok=True)
    pending, running, results = list(seeds), {}, {}
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < workers:
            seed = pending.pop(0)
            workdir = os.path.join(out, f"seed{seed}")
            log = open(os.path.join(out, f"seed{seed}.log"), "w")
            proc = subprocess.Popen(seed_command(seed, workdir, extra), stdout=log, stderr=subprocess.STDOUT)
            running[proc.pid] = (seed, workdir, time.perf_counter(), log)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        seed, workdir, t0, log = running.pop(pid)
        log.close()
        code = os.waitstatus_to_exitcode(status)
        if code == cli.EXIT_USER_ERROR:  # the main job refused its flags (e.g. a bad --extra): its one line
            raise cli.UsageError(f"seed {seed}: the main job refused its flags: {last_line(log.name)}")
        if code != 0:
            raise RuntimeError(f"seed {seed}: the main job failed (exit {code}); see {log.name}")
        results[seed] = seed_result(workdir) | {"seed": seed, "wall_time_s": time.perf_counter() - t0,
                                                "cpu_time_s": usage.ru_utime + usage.ru_stime}
        with open(os.path.join(out, f"seed{seed}.time"), "w") as f:
            json.dump({k: results[seed][k] for k in ("wall_time_s", "cpu_time_s")}, f)
        print(f"seed {seed}: {results[seed]['initial_accuracy']:.3f} -> {results[seed]['final_accuracy']:.3f} "
              f"({results[seed]['wall_time_s']:.0f}s wall, {results[seed]['cpu_time_s']:.0f}s CPU)", flush=True)
    return aggregate([results[s] for s in seeds], seeds, workers, extra, time.perf_counter() - start)


def collect(seeds: list[int], out: str, extra: list[str]) -> dict:
    """The record of the seeds already finished in `out` (others are left out and listed)."""
    per_seed = []
    for seed in seeds:
        workdir = os.path.join(out, f"seed{seed}")
        if not os.path.exists(os.path.join(workdir, "summary.json")):
            continue
        row = seed_result(workdir) | {"seed": seed, "wall_time_s": None, "cpu_time_s": None}
        timing = os.path.join(out, f"seed{seed}.time")
        if os.path.exists(timing):
            with open(timing) as f:
                row.update(json.load(f))
        per_seed.append(row)
    if not per_seed:
        raise cli.UsageError(f"--collect_only: no finished run (seed<s>/summary.json) for --seeds={','.join(map(str, seeds))} "
                             f"in --out={out}")
    record = aggregate(per_seed, [r["seed"] for r in per_seed], 0, extra, None)
    record["seeds_not_finished"] = [s for s in seeds if s not in record["seeds"]]
    return record


def aggregate(per_seed: list[dict], seeds: list[int], workers: int, extra: list[str], wall: float | None) -> dict:
    if not per_seed:
        raise ValueError("main_job_seeds: no finished seed to summarise")
    gains = np.array([r["gain"] for r in per_seed])
    return {"script": "experiments/main_job_seeds.py", "command": "python " + " ".join(COMMAND) + " " +
            " ".join(f"--{e}" for e in extra), "seeds": seeds, "workers": workers, **provenance.record(),
            "total_wall_time_s": wall,
            "gain_mean": float(gains.mean()), "gain_min": float(gains.min()),
            "initial_accuracy_mean": float(np.mean([r["initial_accuracy"] for r in per_seed])),
            "final_accuracy_mean": float(np.mean([r["final_accuracy"] for r in per_seed])),
            "runs": per_seed}


def main(argv):
    del argv
    seeds = parse_seeds(FLAGS.seeds)
    if FLAGS.workers < 1:
        raise cli.UsageError(f"--workers={FLAGS.workers}: must be >= 1")
    bad = [e for e in FLAGS.extra if not e.startswith("config.") or "=" not in e]
    if bad:
        raise cli.UsageError(f"--extra={','.join(FLAGS.extra)}: each entry must read config.<key>=<value>, not {bad[0]!r}")
    if FLAGS.collect_only:
        record = collect(seeds, FLAGS.out, FLAGS.extra)
    else:
        record = run_seeds(seeds, FLAGS.out, FLAGS.workers, FLAGS.extra)
    path = os.path.join(FLAGS.out, "main_job_seeds.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"gain mean {record['gain_mean']:+.3f}, min {record['gain_min']:+.3f}; wrote {path}")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
