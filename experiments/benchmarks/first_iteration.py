"""Time to the main job's first RL iteration with an empty and with a filled compilation cache.

Runs the main job's command (`python -m experiments.train --config=configs/grpo.py:tiny
--config.pipo.enabled=true`, its warm-up included) twice against one fresh cache directory
(`--compilation_cache`, `pipo_jax/run/compile_cache.py`): "cold" (nothing stored: every program is
compiled and stored) then "warm" (a rerun in a new workdir: the programs load). Each run is stopped
(SIGTERM, which saves a checkpoint and exits) once its first metrics row of an RL iteration is written,
i.e. after the first chunk of `log.every` iterations. Reports, per run: wall seconds from the start of
the process to that row and to the first RL line the console printed, the process's CPU seconds by
then, and what the trainer's phases said they built (the warm-up's programs, the base model's
evaluation, the RL iteration program: `compiled N programs, loaded M from the compilation cache in S s`).

    python -m experiments.benchmarks.first_iteration --out=experiments/results/first_iteration.json

Prints a table; `--out` writes every number with the machine's provenance. Timings are never asserted;
on a machine other jobs share they vary with its load (recorded: the load average at each start).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from experiments import provenance
from pipo_jax.run import atomic, compile_cache, observe

COMMAND = ["-m", "experiments.train", "--config=configs/grpo.py:tiny", "--config.pipo.enabled=true"]
# A phase's line of what it built (pipo_jax/run/heartbeat.py:describe_builds).
BUILT = re.compile(r"\] (in the warm-up|evaluating the base model|running RL iterations? [\d-]+): (.*)$")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (Linux /proc), NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def first_iteration(cache_dir: str, workdir: str, extra: list[str], timeout_s: float) -> dict:
    """One run of the main job until its first RL metrics row; see the module docstring."""
    env = {k: v for k, v in os.environ.items() if k != compile_cache.JAX_ENV}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *COMMAND, f"--workdir={workdir}", f"--compilation_cache={cache_dir}",
                             *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:  # universal newlines: the progress bar's \r ends a line too
            lines.append((time.perf_counter() - start, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    metrics = os.path.join(workdir, "metrics.jsonl")
    first_row = cpu = None
    while time.perf_counter() - start < timeout_s and proc.poll() is None:
        if any("reward_mean" in r for r in observe.read_metrics(metrics)):
            first_row, cpu = time.perf_counter() - start, _cpu_seconds(proc.pid)
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # saves a checkpoint, exits 143
        proc.wait(timeout=300)
    reader.join(timeout=10)
    if first_row is None:
        tail = "\n".join(line for _, line in lines[-20:])
        raise RuntimeError(f"no RL metrics row within {timeout_s:.0f} s (exit {proc.returncode}):\n{tail}")
    rl_line = next((t for t, line in lines if re.search(r"(s/it|it/s), reward=", line)), float("nan"))
    built = {m.group(1): m.group(2) for _, line in lines if (m := BUILT.search(line))}
    return {"first_rl_row_s": first_row, "first_rl_console_line_s": rl_line, "cpu_s_by_then": cpu,
            "load_average_at_start": load, "phases_built": built}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="", help="JSON path for the results (none: print only)")
    ap.add_argument("--timeout_s", type=float, default=1800, help="give up on a run after this long")
    ap.add_argument("--extra", action="append", default=[], help="more flags for experiments.train (repeatable)")
    args = ap.parse_args(argv)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="first_iteration_") as tmp:
        cache = os.path.join(tmp, "jax_cache")
        for name in ("cold", "warm"):
            runs[name] = first_iteration(cache, os.path.join(tmp, name), args.extra, args.timeout_s)
            runs[name]["cache_after"] = compile_cache.describe_contents(cache)
            print(f"{name}: first RL row after {runs[name]['first_rl_row_s']:.0f} s", flush=True)
    print("\n| cache | to the first RL row (s) | to the first RL console line (s) | CPU s by then | load avg at "
          "start | the RL program |\n| --- | ---: | ---: | ---: | ---: | --- |")
    for name, r in runs.items():
        program = next((v for k, v in r["phases_built"].items() if k.startswith("running RL")), "-")
        print(f"| {name} | {r['first_rl_row_s']:.0f} | {r['first_rl_console_line_s']:.0f} | {r['cpu_s_by_then']:.0f} "
              f"| {r['load_average_at_start']:.1f} | {program} |")
    if args.out:
        atomic.write_json_atomic(args.out, {"script": "experiments.benchmarks.first_iteration",
                                            "command": " ".join(["python", *COMMAND, *args.extra]),
                                            "runs": runs, **provenance.record()})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
