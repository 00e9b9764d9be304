"""The CPU decode kernels against XLA on the sampler benchmark's model, in one run.

1. `cpu_gemv.gemv` vs XLA's matmul (`gemv_reference`) for 1-64 rows: a dependent chain
   of one decode step's 33 products (8 layers of qkv / o / gate_up / down, then the LM
   head; the weights of `decode.prepare_weights`, 160 MB, so they stream from memory
   as in decoding). Up to 8 rows the kernel streams each weight row once; above, it is
   a packed-panel GEMM. This sets `decode.KERNEL_MAX_ROWS`.
2. `cpu_attention.decode_attention` vs `decode._attend` (XLA) over a full cache of the
   model's 8 layers (keys + values, every slot attended), for several batch sizes and
   widths.

Systems are timed interleaved, round by round (the VM's memory bandwidth drifts), and
the table gives medians of each rate and of the per-round ratios. Prints a table;
`--out FILE.json` writes every number. `--quick` runs a shorter version. Needs the
kernels (`cpu_ffi.available()`: a single-device CPU with a C++ compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.sampler import bench_config, log
from pipo_jax.kernels import cpu_attention, cpu_ffi, cpu_gemv
from pipo_jax.models import qwen3
from pipo_jax.sampling import decode


def interleaved(fns: dict, repeats: int, calls: int) -> dict:
    """Median seconds per call of each `fns[name]()` in each of `repeats` rounds (all systems per round)."""
    for fn in fns.values():
        fn()  # compile / warm up
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(0.1)  # let the previous system's spinning threads go idle
            ts = []
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - start)
            times[name].append(float(np.median(ts)))
    return times


def step_matrices(weights: decode.DecodeWeights) -> list:
    """One decode step's weight matrices `[out, in]` in the order the step uses them."""
    mats = [m for lw in weights.layers for m in (lw["qkv"], lw["o"], lw["gate_up"], lw["down"])]
    return mats + [weights.lm_head]


def product_chain(matmul, mats):
    """Jitted dependent chain `x -> x @ w.T` over `mats` (each input the previous output, cut or tiled)."""

    def chain(x, mats):
        for w in mats:
            k = w.shape[1]
            x = x[:, :k] if x.shape[1] >= k else jnp.tile(x, (1, k // x.shape[1]))
            x = jnp.tanh(matmul(x, w))
        return x

    return jax.jit(chain)


def bench_gemv(mats, rows_list, repeats: int, calls: int) -> list:
    flops_per_row = sum(2 * w.size for w in mats)
    nbytes = sum(w.nbytes for w in mats)
    kernel, xla = product_chain(cpu_gemv.gemv, mats), product_chain(cpu_gemv.gemv_reference, mats)
    out = []
    for rows in rows_list:
        x = jax.random.normal(jax.random.key(rows), (rows, mats[0].shape[1]), jnp.float32)
        diff = float(jnp.max(jnp.abs(kernel(x, mats) - xla(x, mats))))
        times = interleaved({"kernel": lambda: kernel(x, mats).block_until_ready(),
                             "xla": lambda: xla(x, mats).block_until_ready()}, repeats, calls)
        ratio = float(np.median(np.array(times["xla"]) / np.array(times["kernel"])))
        row = {"rows": rows, "max_abs_diff": diff, "kernel_over_xla": ratio}
        for name, ts in times.items():
            t = float(np.median(ts))
            row[name] = {"ms": 1e3 * t, "gflop_s": rows * flops_per_row / t / 1e9, "weight_gb_s": nbytes / t / 1e9}
        out.append(row)
        log(f"gemv rows {rows}: kernel {row['kernel']['gflop_s']:.1f} GFLOP/s, XLA {row['xla']['gflop_s']:.1f}, "
            f"ratio {ratio:.2f}")
    return out


def bench_attention(config, batches, widths, repeats: int, calls: int) -> list:
    h, k, dh, layers = config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.num_hidden_layers
    out = []
    for b in batches:
        for s in widths:
            rs = np.random.RandomState(b * 7 + s)
            q = jnp.asarray(rs.randn(b, h, dh).astype(np.float32))
            keys = [jnp.asarray(rs.randn(b, k, dh, s).astype(np.float32)) for _ in range(layers)]
            vals = [jnp.asarray(rs.randn(b, k, s, dh).astype(np.float32)) for _ in range(layers)]
            positions = jnp.full((b,), s - 1, jnp.int32)
            allowed = jnp.ones((b, 1, s), bool)

            def all_layers(attend):
                return jax.jit(lambda q, keys, vals: sum(attend(q, kk, vv) for kk, vv in zip(keys, vals)))

            kernel = all_layers(lambda q, kk, vv: cpu_attention.decode_attention(q, kk, vv, positions))
            xla = all_layers(lambda q, kk, vv: decode._attend(q[:, None], kk, vv, allowed, jnp.float32)
                             .reshape(q.shape))
            diff = float(jnp.max(jnp.abs(kernel(q, keys, vals) - xla(q, keys, vals))))
            times = interleaved({"kernel": lambda: kernel(q, keys, vals).block_until_ready(),
                                 "xla": lambda: xla(q, keys, vals).block_until_ready()}, repeats, calls)
            nbytes = sum(x.nbytes for x in keys + vals)
            row = {"batch": b, "width": s, "cache_mb": nbytes / 1e6, "max_abs_diff": diff,
                   "kernel_over_xla": float(np.median(np.array(times["xla"]) / np.array(times["kernel"])))}
            for name, ts in times.items():
                t = float(np.median(ts))
                row[name] = {"ms": 1e3 * t, "cache_gb_s": nbytes / t / 1e9}
            out.append(row)
            log(f"attention batch {b} width {s}: kernel {row['kernel']['cache_gb_s']:.1f} GB/s, "
                f"XLA {row['xla']['cache_gb_s']:.1f}, ratio {row['kernel_over_xla']:.2f}")
    return out


def print_table(r: dict) -> None:
    print(f"cpu_gemv vs XLA matmul: chain of one decode step's 33 products "
          f"({r['model']['step_weight_mb']:.0f} MB of weights)")
    print(f"{'rows':>4} | {'kernel GFLOP/s':>14} | {'XLA GFLOP/s':>11} | {'kernel GB/s':>11} | {'kernel/XLA':>10}")
    for row in r["gemv"]:
        print(f"{row['rows']:>4} | {row['kernel']['gflop_s']:>14.1f} | {row['xla']['gflop_s']:>11.1f} | "
              f"{row['kernel']['weight_gb_s']:>11.1f} | {row['kernel_over_xla']:>10.2f}")
    print("cpu_attention vs XLA (decode._attend): 8 layers, every slot attended")
    print(f"{'batch':>5} | {'width':>5} | {'cache MB':>8} | {'kernel GB/s':>11} | {'XLA GB/s':>8} | {'kernel/XLA':>10}")
    for row in r["attention"]:
        print(f"{row['batch']:>5} | {row['width']:>5} | {row['cache_mb']:>8.1f} | "
              f"{row['kernel']['cache_gb_s']:>11.1f} | "
              f"{row['xla']['cache_gb_s']:>8.1f} | {row['kernel_over_xla']:>10.2f}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--out", help="write all numbers to this JSON file")
    ap.add_argument("--rows", default="1,4,8,9,16,32,48,64", help="comma-separated row counts for cpu_gemv")
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes for cpu_attention")
    ap.add_argument("--widths", default="160,512", help="comma-separated cache widths for cpu_attention")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (medians are reported)")
    ap.add_argument("--calls", type=int, default=5, help="timed calls per system per round (median)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.batches, args.widths, args.repeats, args.calls = "1,32", "32", "160", 2, 2
    if not cpu_ffi.available():
        raise SystemExit("the CPU kernels are not available here (needs a single-device CPU and a C++ compiler)")
    config = bench_config(2048)
    weights = decode.prepare_weights(config, qwen3.init_params(config, jax.random.key(0)))
    mats = step_matrices(weights)
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "jax": jax.__version__},
        "model": {"step_weight_mb": sum(w.nbytes for w in mats) / 1e6},
        "gemv": bench_gemv(mats, [int(x) for x in args.rows.split(",")], args.repeats, args.calls),
        "attention": bench_attention(config, [int(x) for x in args.batches.split(",")],
                                     [int(x) for x in args.widths.split(",")], args.repeats, args.calls),
    }
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
