"""Fused LM-head log-probs: time and peak memory of each implementation against `reference`.

For each LM-head shape (Qwen3-4B: D = 2560, Qwen3-8B: D = 4096; V = 151,936, bf16
hidden states and head) and each implementation of `pipo_jax.kernels.logprobs.
token_logprobs` (with entropy, as the PPO loss uses it):

* time: median over `--repeats` runs (after a compile + warm-up call) of the forward and
  of forward + backward (grad of sum(g * logp) + sum(g' * entropy) w.r.t. hidden and w),
  at `--tokens` tokens;
* memory: the compiled program's `memory_analysis()` (compile only, nothing runs) at
  `--mem_tokens` tokens: "peak" = temporaries + outputs, i.e. what the call allocates
  beyond its inputs (the [D, V] head and [N, D] hidden are the caller's);
* ratios of both against `reference` measured in the same process, and the throughput
  of forward + backward counting 8 N D V FLOPs (logits, recompute, two gradient matmuls)
  together with the share of `--peak_tflops` when that is given or the device is known.

On CPU the default token count is reduced (the reference forward of one [256, 2560] x
[2560, 151936] head is ~0.2 TFLOP) and Pallas is not timed: it can only run in interpret
mode there, which is a correctness tool, not a performance path (shown as "n/a").

Prints a table; `--out FILE.json` writes every number. Timings are never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from pipo_jax import platforms
from pipo_jax.kernels import logprobs as lp

VOCAB = 151_936
HEADS = {"qwen3-4b": 2560, "qwen3-8b": 4096}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0,
               "TPU v5p": 459.0, "TPU v4": 275.0, "TPU v6": 918.0}


def parse_args(argv=None) -> argparse.Namespace:
    backend = jax.default_backend()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="qwen3-4b,qwen3-8b", help=f"comma list of {sorted(HEADS)}")
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--tokens", default="256" if backend == "cpu" else "8192,16384",
                   help="comma list of token counts to time (default 256 on CPU, 8192,16384 elsewhere)")
    p.add_argument("--mem_tokens", default="8192,16384", help="comma list of token counts for memory analysis")
    p.add_argument("--impls", default="reference,chunked,pallas", help="comma list; reference is always included")
    p.add_argument("--chunked_blocks", default="",
                   help="extra chunked configurations 'block_n x block_v', e.g. '1024x16384,2048x8192'")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak_tflops", type=float, default=None, help="bf16 peak of the device, for the MFU column")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def _platform() -> str:
    """The platform of this host's devices: the benchmark times programs built for them."""
    return platforms.of_devices(jax.devices())


def _variants(args) -> list[tuple[str, str, dict]]:
    """(row label, impl, kernel kwargs) for every configuration to measure."""
    impls = [s for s in args.impls.split(",") if s]
    for impl in impls:
        if impl not in ("reference", "chunked", "pallas"):
            raise SystemExit(f"--impls: unknown implementation {impl!r}")
    rows = [("reference", "reference", {})]
    if "chunked" in impls:
        bn, bv = lp.CHUNKED_BLOCKS[_platform()]
        rows.append((f"chunked {bn}x{bv}", "chunked", {}))
    for spec in filter(None, args.chunked_blocks.split(",")):
        try:
            bn, bv = (int(x) for x in spec.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--chunked_blocks: expected 'block_n x block_v', got {spec!r}") from None
        rows.append((f"chunked {bn}x{bv}", "chunked", {"block_n": bn, "block_v": bv}))
    if "pallas" in impls:
        rows.append(("pallas", "pallas", {}))
    return rows


def _functions(impl: str, kwargs: dict):
    """(forward, forward+backward), both jitted, of (hidden, w, targets, g_logp, g_entropy)."""

    def forward(h, w, t, g_lp, g_ent):
        return lp.token_logprobs(h, w, t,
                                 lp.kernel_config(with_entropy=True, impl=impl, platform=_platform(), **kwargs))

    def loss(h, w, t, g_lp, g_ent):
        logp, ent = forward(h, w, t, g_lp, g_ent)
        return jnp.sum(g_lp * logp) + jnp.sum(g_ent * ent)

    return jax.jit(forward), jax.jit(jax.grad(loss, (0, 1)))


def _abstract_args(n: int, d: int, v: int):
    return (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, v), jnp.bfloat16),
            jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.float32))


def _concrete_args(n: int, d: int, v: int, seed: int = 0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    h = jax.random.normal(k[0], (n, d), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(k[1], (d, v), jnp.float32) * d**-0.5).astype(jnp.bfloat16)
    t = jax.random.randint(k[2], (n,), 0, v)
    return h, w, t, jax.random.normal(k[3], (n,)), jax.random.normal(k[4], (n,))


def peak_bytes(fn, args) -> dict:
    """Compiled memory analysis of fn at abstract args: temporaries, outputs, arguments."""
    stats = fn.lower(*args).compile().memory_analysis()
    temp, out, arg = stats.temp_size_in_bytes, stats.output_size_in_bytes, stats.argument_size_in_bytes
    return {"temp_bytes": temp, "output_bytes": out, "argument_bytes": arg, "peak_bytes": temp + out}


def median_seconds(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_tflops(args) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    kind = jax.devices()[0].device_kind
    return next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)


def run(args) -> dict:
    backend = jax.default_backend()
    time_pallas = backend != "cpu"
    variants = _variants(args)
    peak = _peak_tflops(args)
    results = {
        "device": jax.devices()[0].device_kind, "backend": backend, "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "jax": jax.__version__, "vocab": args.vocab,
        "repeats": args.repeats, "peak_tflops": peak, "timing": [], "memory": [],
        "notes": [] if time_pallas else ["pallas not timed on CPU: interpret mode is not a performance path"],
    }
    for head in filter(None, args.heads.split(",")):
        if head not in HEADS:
            raise SystemExit(f"--heads: unknown head {head!r}; choose from {sorted(HEADS)}")
        d = HEADS[head]
        for n in (int(x) for x in filter(None, args.mem_tokens.split(","))):
            ref = None
            for label, impl, kw in variants:
                if impl == "pallas" and not time_pallas:
                    results["memory"].append({"head": head, "d": d, "tokens": n, "impl": label, "fwd": None, "fwd_bwd": None})
                    continue
                fwd, fwd_bwd = _functions(impl, kw)
                row = {"head": head, "d": d, "tokens": n, "impl": label,
                           "fwd": peak_bytes(fwd, _abstract_args(n, d, args.vocab)),
                           "fwd_bwd": peak_bytes(fwd_bwd, _abstract_args(n, d, args.vocab))}
                ref = row if impl == "reference" else ref
                for key in ("fwd", "fwd_bwd"):
                    row[key]["ratio"] = row[key]["peak_bytes"] / ref[key]["peak_bytes"]
                results["memory"].append(row)
                print(_memory_line(row), flush=True)
        for n in (int(x) for x in filter(None, args.tokens.split(","))):
            data = _concrete_args(n, d, args.vocab)
            ref = None
            for label, impl, kw in variants:
                row = {"head": head, "d": d, "tokens": n, "impl": label, "fwd_s": None, "fwd_bwd_s": None}
                if impl != "pallas" or time_pallas:
                    fwd, fwd_bwd = _functions(impl, kw)
                    row["fwd_s"] = median_seconds(fwd, data, args.repeats)
                    row["fwd_bwd_s"] = median_seconds(fwd_bwd, data, args.repeats)
                    ref = row if impl == "reference" else ref
                    row["fwd_ratio"] = row["fwd_s"] / ref["fwd_s"]
                    row["fwd_bwd_ratio"] = row["fwd_bwd_s"] / ref["fwd_bwd_s"]
                    row["fwd_bwd_tflops_8ndv"] = 8 * n * d * args.vocab / row["fwd_bwd_s"] / 1e12
                    if peak:
                        row["fwd_bwd_mfu_8ndv"] = row["fwd_bwd_tflops_8ndv"] / peak
                results["timing"].append(row)
                print(_timing_line(row), flush=True)
    return results


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def _memory_line(r) -> str:
    f, b = r["fwd"], r["fwd_bwd"]
    return (f"memory {r['head']:9s} N={r['tokens']:6d} {r['impl']:20s} fwd peak {f['peak_bytes'] / 2**20:9.1f} MiB "
            f"({f['ratio']:.3f}x ref)  fwd+bwd peak {b['peak_bytes'] / 2**20:9.1f} MiB ({b['ratio']:.3f}x ref)")


def _timing_line(r) -> str:
    return (f"time   {r['head']:9s} N={r['tokens']:6d} {r['impl']:20s} fwd {_fmt(r['fwd_s'], '8.3f')} s "
            f"({_fmt(r.get('fwd_ratio'), '.2f')}x ref)  fwd+bwd {_fmt(r['fwd_bwd_s'], '8.3f')} s "
            f"({_fmt(r.get('fwd_bwd_ratio'), '.2f')}x ref)")


def table(results: dict) -> str:
    """Markdown tables of the results (memory at mem_tokens, time at tokens)."""
    header = (f"device: {results['device']} ({results['backend']}, {results['cpu_count']} CPUs), "
              f"jax {results['jax']}, V = {results['vocab']}, bf16, with entropy; median of {results['repeats']}")
    lines = [header, ""]
    lines += ["| head | tokens | impl | fwd peak MiB | vs ref | fwd+bwd peak MiB | vs ref |",
              "|---|---:|---|---:|---:|---:|---:|"]
    for r in results["memory"]:
        if r["fwd"] is None:
            lines.append(f"| {r['head']} | {r['tokens']} | {r['impl']} | n/a | | n/a | |")
            continue
        f, b = r["fwd"], r["fwd_bwd"]
        lines.append(f"| {r['head']} | {r['tokens']} | {r['impl']} | {f['peak_bytes'] / 2**20:.1f} | "
                     f"{f['ratio']:.3f} | {b['peak_bytes'] / 2**20:.1f} | {b['ratio']:.3f} |")
    lines += ["", "| head | tokens | impl | fwd s | vs ref | fwd+bwd s | vs ref | TFLOP/s (8NDV) |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results["timing"]:
        lines.append(f"| {r['head']} | {r['tokens']} | {r['impl']} | {_fmt(r['fwd_s'], '.3f')} | "
                     f"{_fmt(r.get('fwd_ratio'), '.2f')} | {_fmt(r['fwd_bwd_s'], '.3f')} | "
                     f"{_fmt(r.get('fwd_bwd_ratio'), '.2f')} | {_fmt(r.get('fwd_bwd_tflops_8ndv'), '.3f')} |")
    lines += [f"note: {n}" for n in results["notes"]]
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    results = run(args)
    print()
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
