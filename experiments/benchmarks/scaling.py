"""Sharded PIPO iteration: time and per-device memory over 1, 2, 4, 8 devices, and the
single-device MFU of a policy train step.

1. For each model size (`tiny`: the built-in task model, ~0.3M parameters; `mid`: a
   Qwen3-shaped 8-layer model of ~25M parameters on the same task) and each mesh, one
   GRPO + PIPO iteration (sample, reward, PI step, base step) is jitted with
   `run.sharded_steps.sharded_scan_chunk` and measured: compile time, iteration time (best
   of `--repeats` after one warm-up) and the compiled program's per-device memory
   (`memory_analysis()`: arguments = the train state shard, temporaries, outputs).
   Without accelerators the devices are simulated CPU devices
   (`--xla_force_host_platform_device_count`) that share this machine's cores, so the
   times show partitioning overhead, not speed-up; the memory columns are what each
   device of a real mesh would hold.
2. `--mfu`: one policy train step (forward + backward through Qwen3 and the fused
   log-prob head, AdamW update) on one device at the `--mfu_preset` shape (default
   Qwen3-0.6B, bf16): time, FLOPs (XLA cost analysis and the analytic 6 N T +
   attention + head count) and MFU against the device's peak (`--peak_tflops`, or a table of
   known accelerators).

Prints tables; `--out FILE.json` writes every number. Timings are never asserted.
"""

from __future__ import annotations

import os
import sys

from pipo_jax import platforms  # noqa: E402  (imports no jax)

platforms.simulate_cpu_devices(platforms.requested_cpu_devices(os.environ, default=8))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from configs import grpo  # noqa: E402
from pipo_jax import parallel  # noqa: E402
from pipo_jax.models import qwen3  # noqa: E402
from pipo_jax.rl.response_logprobs import response_logprobs  # noqa: E402
from pipo_jax.rl.spec import TrainSpec  # noqa: E402
from pipo_jax.run import sharded_steps  # noqa: E402
from pipo_jax.config.sections import RunConfig
from pipo_jax.run.setup import train_spec

DEFAULT_MESHES = "1x1x1,1x2x1,1x2x2,2x2x2"
# Dense bf16 peak TFLOP/s per device (vendor data sheets), keyed by a substring of device_kind.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0,
               "TPU v5p": 459.0, "TPU v4": 275.0, "TPU v6": 918.0}


def model_spec(size: str) -> TrainSpec:
    """GRPO + PIPO on the built-in task (tiny preset batch: 16 prompts x 8) with the `size` model."""
    c = grpo.get_config("tiny")
    c.pipo.enabled = True
    spec = train_spec(RunConfig.from_config(c))
    if size == "mid":
        spec = dataclasses.replace(spec, model=spec.model.replace(
            hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64))
    elif size != "tiny":
        raise ValueError(f"--sizes: unknown size {size!r} (tiny, mid)")
    return spec


def parse_mesh(text: str) -> tuple[int, int, int]:
    try:
        d, f, t = (int(x) for x in text.split("x"))
    except ValueError as e:
        raise ValueError(f"--meshes: {text!r} is not DATAxFSDPxTENSOR") from e
    return d, f, t


def measure_iteration(spec: TrainSpec, shape: tuple[int, int, int], repeats: int) -> dict:
    n = int(np.prod(shape))
    mesh = parallel.make_mesh(*shape, devices=jax.devices()[:n])
    chunk = sharded_steps.sharded_scan_chunk(spec, mesh, 1)
    state = sharded_steps.init_sharded_train_state(spec, mesh, None, seed=0)
    t0 = time.perf_counter()
    compiled = chunk.lower(state).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    state, _ = chunk(state)  # warm-up (the same executable: jit caches the compile above)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    return {
        "mesh": "x".join(map(str, shape)), "devices": n, "compile_s": compile_s, "iteration_s": min(times),
        "iteration_s_all": times,
        "argument_mib_per_device": mem.argument_size_in_bytes / 2**20,
        "temp_mib_per_device": mem.temp_size_in_bytes / 2**20,
        "output_mib_per_device": mem.output_size_in_bytes / 2**20,
        "state_mib_total": sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20,
        "reward_mean": float(np.asarray(metrics["reward_mean"])[0]),
    }


def analytic_train_flops(cfg: qwen3.Qwen3Config, batch: int, seq: int, head_tokens: int) -> float:
    """Model FLOPs of one forward + backward (3x forward), recomputation not counted (the MFU convention).

    Per token 2 x (non-embedding matmul params) through the decoder, causal attention
    (QK^T and PV over on average seq / 2 keys), and 2 x D x V for the LM head on the
    `head_tokens` response positions of each row.
    """
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq, hkv, dh, v = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    per_layer = d * dh * (hq + 2 * hkv) + hq * dh * d + 3 * d * f
    decoder = 2.0 * L * per_layer * batch * seq
    attention = 2.0 * 2.0 * L * hq * dh * (seq * seq / 2) * batch
    head = 2.0 * d * v * batch * head_tokens
    return 3.0 * (decoder + attention + head)


def measure_mfu(preset: str, batch: int, seq: int, repeats: int, peak_tflops: float | None) -> dict:
    cfg = qwen3.preset(preset, param_dtype="bfloat16", dtype="bfloat16", remat="full")
    device = jax.devices()[0]
    params = jax.jit(lambda: qwen3.init_params(cfg, jax.random.PRNGKey(0)))()
    opt = optax.adamw(1e-6)
    opt_state = opt.init(params)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, seq), 0, cfg.vocab_size)
    mask = jnp.ones((batch, seq), jnp.int32)
    prompt = seq // 4

    def step(params, opt_state, tokens, mask):
        def loss_fn(p):
            logp, _ = response_logprobs(cfg, p, tokens, mask, prompt)
            return -jnp.mean(logp)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    compiled = jitted.lower(params, opt_state, tokens, mask).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    params, opt_state, loss = compiled(params, opt_state, tokens, mask)
    jax.block_until_ready(loss)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, tokens, mask)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
    best = min(times)
    flops = analytic_train_flops(cfg, batch, seq, head_tokens=seq - prompt)
    if peak_tflops is None:
        peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in device.device_kind), None)
    out = {"preset": preset, "device_kind": device.device_kind, "batch": batch, "seq": seq, "step_s": best,
           "xla_flops": float(cost.get("flops", float("nan"))) if cost else float("nan"),
           "analytic_flops": flops, "achieved_tflops": flops / best / 1e12, "peak_tflops": peak_tflops,
           "loss": float(loss)}
    out["mfu"] = out["achieved_tflops"] / peak_tflops if peak_tflops else None
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,mid")
    ap.add_argument("--meshes", default=DEFAULT_MESHES, help="comma-separated DATAxFSDPxTENSOR")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mfu", action="store_true", help="also measure single-device MFU of a train step")
    ap.add_argument("--mfu_preset", default="qwen3_0.6b")
    ap.add_argument("--mfu_batch", type=int, default=8)
    ap.add_argument("--mfu_seq", type=int, default=2048)
    ap.add_argument("--peak_tflops", type=float, default=None, help="device peak for MFU (default: by device kind)")
    ap.add_argument("--skip_scaling", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
                          "device_kind": jax.devices()[0].device_kind, "devices": jax.device_count()},
              "scaling": [], "mfu": None}
    if not args.skip_scaling:
        meshes = [parse_mesh(m) for m in args.meshes.split(",") if m]
        too_big = [m for m in meshes if np.prod(m) > jax.device_count()]
        if too_big:
            raise ValueError(f"--meshes {too_big} need more than the {jax.device_count()} devices")
        print(f"{'size':5} {'params':>8} {'mesh':>6} {'dev':>3} {'compile s':>9} {'iter s':>8} "
              f"{'args MiB/dev':>12} {'temp MiB/dev':>12} {'state MiB':>9}")
        for size in args.sizes.split(","):
            spec = model_spec(size)
            for shape in meshes:
                row = dict(measure_iteration(spec, shape, args.repeats), size=size, params=spec.model.num_params)
                result["scaling"].append(row)
                print(f"{size:5} {row['params'] / 1e6:7.2f}M {row['mesh']:>6} {row['devices']:3d} "
                      f"{row['compile_s']:9.1f} {row['iteration_s']:8.3f} {row['argument_mib_per_device']:12.2f} "
                      f"{row['temp_mib_per_device']:12.2f} {row['state_mib_total']:9.2f}", flush=True)
    if args.mfu:
        m = measure_mfu(args.mfu_preset, args.mfu_batch, args.mfu_seq, args.repeats, args.peak_tflops)
        result["mfu"] = m
        mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] is not None else "n/a (unknown peak: pass --peak_tflops)"
        print(f"\ntrain step {m['preset']} B={m['batch']} T={m['seq']} on {m['device_kind']}: {m['step_s']:.4f} s, "
              f"{m['achieved_tflops'] * 1e3:.2f} GFLOP/s (model {m['analytic_flops'] / 1e9:.3f} GFLOP per step, "
              f"XLA cost analysis {m['xla_flops'] / 1e9:.3f} GFLOP), MFU {mfu}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
