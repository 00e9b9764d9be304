"""Per-device temporary memory of `learn.prepare` (the passes over the whole rollout) at two
rollout sizes, compiled on simulated CPU devices from abstract inputs (nothing allocated).

    python -m experiments.benchmarks.prepare_memory --preset qwen3_8b --rows 128,1024 --out prepare.json

The policy, reference, GRPO prompts of `--prompt_len` tokens and `--response_len` response
tokens (paper Table 5: 512 + 4096), fp32 master weights with bf16 compute and full remat,
`--micro` sequences per device per micro-batch, on an fsdp=`--devices` mesh. With the
rollout passes micro-batched the temporaries should not depend on the row count.
"""

from __future__ import annotations

import os
import sys

# 8 simulated devices when run as the benchmark; never on import (a caller keeps its own devices).
from pipo_jax import platforms  # noqa: E402  (imports no jax)

if __name__ == "__main__":
    platforms.simulate_cpu_devices(platforms.requested_cpu_devices(os.environ, default=8))

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import grpo  # noqa: E402
from pipo_jax import parallel  # noqa: E402
from pipo_jax.models import qwen3  # noqa: E402
from pipo_jax.parallel.shardings import batch_shardings  # noqa: E402
from pipo_jax.rl import learn  # noqa: E402
from pipo_jax.config.sections import RunConfig  # noqa: E402
from pipo_jax.rl.spec import spec_from_config  # noqa: E402
from pipo_jax.run import sharded_steps  # noqa: E402
from pipo_jax.tasks.dataset import DatasetTask  # noqa: E402


def table5_spec(preset: str, rows: int, prompt_len: int, response_len: int, micro: int):
    """GRPO (G = 8) at `rows` sequences on `preset`, with a stand-in prompt table of the right width."""
    c = grpo.get_config("micro")
    c.rollout.prompts_per_batch, c.rollout.group_size, c.rollout.max_new_tokens = rows // 8, 8, response_len
    c.train.mini_batch_prompts, c.train.micro_batch_size_per_device = min(rows, 512) // 8, micro
    n = 64
    task = DatasetTask(kind="math", prompt_tokens_np=np.zeros((n, prompt_len), np.int32),
                       prompt_lengths_np=np.full((n,), prompt_len, np.int32), references=("0",) * n,
                       train_rows_np=np.arange(n, dtype=np.int32), heldout_rows_np=np.zeros((0,), np.int32),
                       stop_token_ids=(2,), pad_id=0)
    model = qwen3.preset(preset, param_dtype="float32", dtype="bfloat16", remat="full")
    return spec_from_config(RunConfig.from_config(c), model, task)


def prepare_memory(spec, mesh) -> dict:
    state = sharded_steps.abstract_train_state(spec)
    ro = sharded_steps.abstract_rollout(spec, spec.rollout.prompts_per_batch)
    with parallel.sharding_context(mesh):
        compiled = jax.jit(lambda s, r: learn.prepare(spec, s, r),
                           in_shardings=(sharded_steps.state_shardings(spec, mesh), batch_shardings(ro, mesh))
                           ).lower(state, ro).compile()
    m = compiled.memory_analysis()
    return {"temp_bytes": int(m.temp_size_in_bytes), "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3_8b")
    ap.add_argument("--rows", default="128,1024")
    ap.add_argument("--prompt_len", type=int, default=512)
    ap.add_argument("--response_len", type=int, default=4096)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    mesh = parallel.make_mesh(1, args.devices, 1)
    result = {"preset": args.preset, "prompt_len": args.prompt_len, "response_len": args.response_len,
              "micro_batch_size_per_device": args.micro, "mesh": parallel.describe(mesh), "per_device": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        spec = table5_spec(args.preset, rows, args.prompt_len, args.response_len, args.micro)
        result["per_device"][str(rows)] = m = prepare_memory(spec, mesh)
        print(f"{args.preset} prepare, {rows} rows: temp {m['temp_bytes'] / 2**30:.2f} GiB, "
              f"args {m['argument_bytes'] / 2**30:.2f} GiB, out {m['output_bytes'] / 2**30:.3f} GiB per device",
              flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result["env"] = {"commit": commit, "jax": jax.__version__, "platform": platform.platform(),
                     "cpus": os.cpu_count(), "backend": jax.default_backend(), "seed": None}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
