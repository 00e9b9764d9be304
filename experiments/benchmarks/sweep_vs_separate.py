"""A sweep against the same points run as separate main-job commands: wall and CPU time, and every
point's result against its separate run.

    python -m experiments.benchmarks.sweep_vs_separate --out=runs/sweep_vs_separate         # 4 lam x 2 lr x 3 seeds
    python -m experiments.benchmarks.sweep_vs_separate --members=map --out=runs/sweep_vs_separate   # the map form
    python -m experiments.benchmarks.sweep_vs_separate --lams=0.05,0.1 --lrs=1e-4 --seeds=0-1 \
        --iterations=4 --warmup_steps=100 --out=runs/sweep_vs_separate_small              # a reduced version

The sweep: `python -m experiments.sweep --config=configs/grpo.py:tiny --config.pipo.enabled=true
--sweep=pipo.lam=... --sweep=train.lr=... --seeds=... [--members=map]` (one process: the seeds' warm-ups once,
each group of points one program, its members batched or, with `--members=map`, one after another). The
separate runs: per point `python -m experiments.train` with the same config and `--config.pipo.lam / train.lr /
seed` (each its own warm-up, as a user runs the main job), one after the other, shared by both forms. Both get
the same `--iterations` / `--warmup_steps` overrides. CPU time is the processes' user + system time
(`os.wait4`). Per point: the batch reward of every iteration (and the first that differs), the held-out greedy
accuracy at every evaluation, the final pass@1 of the sweep against the separate run's metrics.jsonl /
summary.json (exactly equal, or the largest difference). Prints a table; writes
<out>/sweep_vs_separate[_map].json with provenance and where the time went (the sweep's programs against its
start-up and warm-ups; the separate runs' warm-ups). Run again with the same flags, what finished is read, not
rerun: the sweep's time from <out>/sweep[_map]_time.json, a separate run's from `<workdir>.time.json`. Timings
are never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

from experiments import provenance, schedule, vmapped
from experiments.runs import parse_seeds, summarise
from pipo_jax.run import atomic, observe


def timed(argv: list[str], log_path: str) -> dict[str, float]:
    """Runs `python argv` (output appended to `log_path`, `schedule.appended_log`); its wall and CPU seconds.
    A failure raises naming the log."""
    t0 = time.perf_counter()
    command = [sys.executable, *argv]
    with schedule.appended_log(log_path, command) as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"`python {' '.join(argv)}` failed; see {log_path}")
    return {"wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime}


def timed_once(argv: list[str], output: str, path: str, log_path: str, commit: str) -> tuple[dict[str, float], str]:
    """`timed(argv, log_path)` and the commit it ran at (`commit` now), kept in `path`: run again with the same
    command, a finished run (its `output` file written) is read, not rerun, so a stopped benchmark continues
    ("unrecorded": a file written before the commit was kept)."""
    if os.path.exists(path) and os.path.exists(output):
        with open(path) as f:
            stored = json.load(f)
        if stored.get("argv") == argv:
            return stored["time"], stored.get("commit", "unrecorded")
    t = timed(argv, log_path)
    atomic.write_json_atomic(path, {"argv": argv, "time": t, "commit": commit})
    return t, commit


def warmup_seconds(workdir: str) -> float:
    """The separate run's warm-up wall seconds (its metrics.jsonl's `warmup_time_s`)."""
    rows = observe.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    return next(r["warmup_time_s"] for r in rows if "warmup_time_s" in r)


def overrides(args) -> list[str]:
    out = ["--config=configs/grpo.py:tiny", "--config.pipo.enabled=true"]
    if args.iterations:
        out.append(f"--config.iterations={args.iterations}")
    if args.warmup_steps:
        out.append(f"--config.warmup.steps={args.warmup_steps}")
    return out


def largest_difference(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def compare_point(row: dict, workdir: str) -> dict:
    """The sweep's `row` of a point against its separate run in `workdir`."""
    alone = summarise(workdir)
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    got = row["result"]
    parted = [i for i, (x, y) in enumerate(zip(got["reward"], alone["reward"])) if x != y]
    out = {"reward_equal": got["reward"] == alone["reward"],
           "first_unequal_iteration": parted[0] + 1 if parted else None,
           "reward_max_abs_diff": largest_difference(got["reward"], alone["reward"]),
           "accuracy_equal": got["acc_steps"] == alone["acc_steps"] and got["accuracy"] == alone["accuracy"],
           "accuracy_max_abs_diff": largest_difference(got["accuracy"], alone["accuracy"]),
           "final_accuracy": [got["final_accuracy"], summary["final_accuracy"]]}
    alone_pass = summary.get("final_pass_at_1", summary.get("final_pass@1"))  # summary.json's key, new or old
    if "final_pass_at_1" in got and alone_pass is not None:
        out["final_pass_at_1"] = [got["final_pass_at_1"], alone_pass]
    out["equal"] = (out["reward_equal"] and out["accuracy_equal"]
                    and out["final_accuracy"][0] == out["final_accuracy"][1]
                    and ("final_pass_at_1" not in out or out["final_pass_at_1"][0] == out["final_pass_at_1"][1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lams", default="0.05,0.1,0.2,0.4")
    parser.add_argument("--lrs", default="1e-4,3e-4")
    parser.add_argument("--seeds", default="0-2")
    parser.add_argument("--iterations", type=int, default=0, help="RL iterations; 0 = the tiny preset's")
    parser.add_argument("--warmup_steps", type=int, default=0, help="warm-up steps; 0 = the tiny preset's")
    parser.add_argument("--members", default="vmap", choices=vmapped.MEMBERS,
                        help="the sweep's --members (vmap: batched; map: each point bit-equal to its separate run); "
                             "the separate runs are shared by both")
    parser.add_argument("--out", default="runs/sweep_vs_separate")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    lams, lrs = args.lams.split(","), args.lrs.split(",")
    os.makedirs(args.out, exist_ok=True)
    origin = provenance.record()

    form = "" if args.members == "vmap" else f"_{args.members}"  # the vmap form keeps the plain names
    sweep_out = os.path.join(args.out, f"sweep{form}")
    sweep_argv = ["-m", "experiments.sweep", *overrides(args), f"--sweep=pipo.lam={args.lams}",
                  f"--sweep=train.lr={args.lrs}", f"--seeds={args.seeds}", f"--out={sweep_out}"]
    if args.members != "vmap":
        sweep_argv.append(f"--members={args.members}")
    print("sweep:", " ".join(sweep_argv[1:]), flush=True)
    sweep_time, sweep_ran_at = timed_once(sweep_argv, os.path.join(sweep_out, "sweep.json"),
                                          os.path.join(args.out, f"sweep{form}_time.json"),
                                          os.path.join(args.out, f"sweep{form}.log"), origin["commit"])
    with open(os.path.join(sweep_out, "sweep.json")) as f:
        record = json.load(f)
    rows = {r["name"]: r for r in record["points"]}
    print(f"sweep: {sweep_time['wall_s']:.0f}s wall, {sweep_time['cpu_s']:.0f}s CPU, {len(rows)} points in "
          f"{len(record['groups'])} programs", flush=True)

    separate, points = {"wall_s": 0.0, "cpu_s": 0.0}, []
    os.makedirs(os.path.join(args.out, "separate"), exist_ok=True)
    for lam, lr, seed in itertools.product(lams, lrs, seeds):
        name = f"pipo.lam={lam},train.lr={lr}/seed{seed}"
        workdir = os.path.join(args.out, "separate", name.replace("/", "_"))
        argv = ["-m", "experiments.train", *overrides(args), f"--config.pipo.lam={lam}", f"--config.train.lr={lr}",
                f"--config.seed={seed}", "--config.log.progress=false", f"--workdir={workdir}"]
        t, ran_at = timed_once(argv, os.path.join(workdir, "summary.json"), workdir + ".time.json", workdir + ".log",
                               origin["commit"])
        separate["wall_s"] += t["wall_s"]
        separate["cpu_s"] += t["cpu_s"]
        check = compare_point(rows[name], workdir)
        points.append({"name": name, **t, "commit": ran_at, "warmup_wall_s": warmup_seconds(workdir), **check})
        print(f"{name}: {t['wall_s']:.0f}s wall, {t['cpu_s']:.0f}s CPU; equal to the sweep's point: {check['equal']} "
              f"(reward max |diff| {check['reward_max_abs_diff']:.3g}, accuracy max |diff| "
              f"{check['accuracy_max_abs_diff']:.3g})", flush=True)

    group_wall = sum(rows[g[0]]["group_timing"]["wall_s"] for g in record["groups"])
    result = {"script": "experiments/benchmarks/sweep_vs_separate.py", "args": vars(args), **origin,
              "sweep_command": "python " + " ".join(sweep_argv), "members": args.members, "sweep": sweep_time | {
                  "programs": len(record["groups"]), "points": len(rows),
                  "compile_s": sum(rows[g[0]]["group_timing"]["compile_s"] for g in record["groups"]),
                  "groups_wall_s": group_wall, "outside_groups_wall_s": sweep_time["wall_s"] - group_wall,
                  "commit": sweep_ran_at},
              "separate": separate | {"processes": len(points), "commits": sorted({p["commit"] for p in points}),
                                      "warmup_wall_s": sum(p["warmup_wall_s"] for p in points)},
              "speedup_wall": separate["wall_s"] / sweep_time["wall_s"],
              "speedup_cpu": separate["cpu_s"] / sweep_time["cpu_s"],
              "points_equal": sum(p["equal"] for p in points), "points": points}
    atomic.write_json_atomic(os.path.join(args.out, f"sweep_vs_separate{form}.json"), result, indent=1)
    print("\n| form | programs / processes | wall s | CPU s |\n| --- | --- | --- | --- |")
    print(f"| sweep | {result['sweep']['programs']} programs, 1 process | {sweep_time['wall_s']:.0f} | "
          f"{sweep_time['cpu_s']:.0f} |")
    print(f"| separate main-job commands | {len(points)} processes | {separate['wall_s']:.0f} | "
          f"{separate['cpu_s']:.0f} |")
    print(f"\nsweep: {group_wall:.0f}s wall in its programs (evaluations included), "
          f"{sweep_time['wall_s'] - group_wall:.0f}s outside them (start-up, the warm-ups of {len(seeds)} seeds, "
          "the report); "
          f"separate: {result['separate']['warmup_wall_s']:.0f}s of warm-ups")
    print(f"speed-up: {result['speedup_wall']:.2f}x wall, {result['speedup_cpu']:.2f}x CPU; "
          f"{result['points_equal']} of {len(points)} points equal to their separate run")


if __name__ == "__main__":
    main()
