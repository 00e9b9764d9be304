"""Sampler throughput: one-jit `generate` and the continuous-batching engine vs transformers.

Same random Qwen3-shaped weights (saved once with `hf.save`, loaded by both JAX and
`transformers`), same prompts, greedy, no stop tokens, in one run:

1. decode tokens/s at batch 1, 8, 32 of `sampler.generate`, of `continuous_batching.
   rollout` on an `Engine` with as many slots as rows, and of `transformers` `generate`
   (torch CPU). Both JAX systems run XLA's ops (the decode path of
   `sampling/decode.py`: one layer scan over the stored weights). Decode rate = `B * (N - 1) /
   (t(N new tokens) - t(1 new token))`, so prefill is excluded. The systems run
   interleaved, one after the other in each of `--repeats` rounds, and the table gives
   medians: of each system's rate and, for the ratios, of the per-round ratios (the
   machine's memory bandwidth drifts with the other tenants of its host, so only
   neighbouring measurements compare fairly).
2. a long-tail mix (most responses short, a few long; lengths set per request through
   the budgets): the engine vs static batching (`sampler.generate` on consecutive
   batches of as many requests as the engine has slots, each batch running until its
   longest response is done).
3. machine limits measured in the same run, before and after the decode measurements
   (the larger of the two counts, so a quiet moment raises the bound, not the score):
   fp32 FLOP/s of a large matmul, the memory-copy bandwidth (`2 * bytes / time` of a
   large array copy) and the read-only bandwidth (one pass over a 256 MB matrix: XLA's
   matrix-vector product, torch's two-thread sum); the decode step's
   FLOP/s at batch 32 and its weight + KV bytes per step at batch 1 as fractions of
   them (the limits as the best of their passes, the step at its median rate); at
   batch 1 also paired: per round, the decode against one read and one copy pass run
   right after it (median of the per-round fractions). Decoding only reads, and on
   this machine every read-only pass tops out near 0.75-0.8 of the copy figure (a
   copy's writes drain without holding up reads).

Prints a table; `--out FILE.json` writes every number. `--quick` runs a shorter version.
Timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.models import hf, qwen3
from pipo_jax.sampling import continuous_batching, sampler
from pipo_jax.sampling.engine import Engine
from pipo_jax.sampling.sampling_params import SamplingParams


def bench_config(intermediate: int) -> qwen3.Qwen3Config:
    """Qwen3-shaped model of ~40M parameters (untied LM head)."""
    return qwen3.Qwen3Config(
        vocab_size=8192, hidden_size=512, intermediate_size=intermediate, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64, rope_theta=1_000_000.0,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )


def best_time(fn, repeats: int) -> float:
    """Minimum wall time of `fn()` over `repeats` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


# ----------------------------------------------------------------------------- machine limits


def matmul_flops(n: int, repeats: int) -> dict:
    """fp32 FLOP/s of an `n x n @ n x n` matmul: XLA, torch (if installed), and the best."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    out = {"xla": 2 * n**3 / best_time(lambda: mm(a, b).block_until_ready(), repeats)}
    try:
        import torch

        ta, tb = torch.from_numpy(np.array(a)), torch.from_numpy(np.array(b))
        out["torch"] = 2 * n**3 / best_time(lambda: ta @ tb, repeats)
    except ImportError:
        pass
    out["best"] = max(out.values())
    return out


def copy_passes(nbytes: int) -> dict:
    """Large pre-faulted copies, `name -> (fn, bytes moved)` (read + write: `2 * size`).

    numpy's copy is single-threaded; torch's `copy_` and an in-place XLA update use both cores.
    """
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    passes = {"numpy": (lambda: np.copyto(dst, src), 2 * src.nbytes)}
    try:
        import torch

        tsrc, tdst = torch.from_numpy(src), torch.from_numpy(dst)
        passes["torch"] = (lambda: tdst.copy_(tsrc), 2 * src.nbytes)
    except ImportError:
        pass
    scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    state = {"x": jnp.ones(nbytes // 4, jnp.float32)}

    def xla_update():
        state["x"] = scale(state["x"])
        state["x"].block_until_ready()

    passes["xla_inplace"] = (xla_update, 2 * src.nbytes)
    return passes


def read_passes(nbytes: int) -> dict:
    """Large read-only passes (nothing written back), `name -> (fn, bytes read)`: a
    matrix-vector product over one `[rows, 2048]` fp32 matrix (the decode step's access
    pattern, at its best) by XLA, and torch's two-thread sum."""
    rows = nbytes // (4 * 2048)
    w = jnp.ones((rows, 2048), jnp.float32)
    x = jnp.ones((1, 2048), jnp.float32)
    matvec = jax.jit(lambda x, w: jnp.einsum("bi,oi->bo", x, w))
    passes = {"xla_matvec": (lambda: matvec(x, w).block_until_ready(), w.nbytes)}
    try:
        import torch

        t = torch.ones(rows * 2048)
        passes["torch_sum"] = (lambda: t.sum(), t.numel() * 4)
    except ImportError:
        pass
    return passes


def bandwidth(passes: dict, repeats: int) -> dict:
    """Bytes/s of each pass (its best of `repeats`) and `best`, the largest."""
    out = {name: nbytes / best_time(fn, repeats) for name, (fn, nbytes) in passes.items()}
    out["best"] = max(out.values())
    return out


def paired_fractions(run_n, run_1, new_tokens: int, step_bytes: float, passes: dict, repeats: int) -> dict:
    """Batch-1 decode bytes/s as a fraction of the read and copy bandwidth measured beside it.

    The machine's bandwidth drifts during a run (other tenants), so each repeat times the
    decode (`N` and 1 new tokens) and then every read and copy pass once, and forms the
    ratio of the decode's bytes/s to the best read / copy pass of that repeat. Returns the
    medians (and all values) of those per-repeat ratios.
    """
    for fn in (run_n, run_1, *(fn for fn, _ in passes["read"].values()), *(fn for fn, _ in passes["copy"].values())):
        fn()
    reads, copies = [], []
    for _ in range(repeats):
        rate = step_bytes * (new_tokens - 1) / max(timed(run_n) - timed(run_1), 1e-9)
        best = {}
        for kind in ("read", "copy"):
            rates = [nbytes / timed(fn) for fn, nbytes in passes[kind].values()]
            best[kind] = max(rates)
        reads.append(rate / best["read"])
        copies.append(rate / best["copy"])
    return dict(read=float(np.median(reads)), copy=float(np.median(copies)), read_all=reads, copy_all=copies)


def machine_limits(passes: dict) -> dict:
    """FLOP/s of a large matmul, copy and read-only bandwidth (bytes/s) of `passes["copy"]` /
    `passes["read"]`, with each method's figure."""
    mm, cp, rd = matmul_flops(2048, 5), bandwidth(passes["copy"], 5), bandwidth(passes["read"], 5)
    return dict(matmul_flops=mm["best"], copy_bytes_s=cp["best"], read_bytes_s=rd["best"], matmul_detail=mm,
                copy_detail=cp, read_detail=rd)


def step_params(config: qwen3.Qwen3Config) -> int:
    """Parameters one decode step reads: all but the embedding table (one row per token)
    when the head is untied; with a tied head the table is the head and is read whole."""
    c = config
    return c.num_params - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size)


def decode_costs(config: qwen3.Qwen3Config, batch: int, context: float,
                 cache_bytes_per_el: int = 4) -> tuple[float, float]:
    """(FLOPs, bytes) of one fp32 decode step: weight matmuls + attention over `context` slots."""
    c = config
    matmul_params = step_params(c)
    attn_flops = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context
    kv_bytes = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * context * cache_bytes_per_el
    return batch * (2 * matmul_params + attn_flops), 4 * matmul_params + batch * kv_bytes


# ----------------------------------------------------------------------------- systems


def jax_generate_fn(config, params, prompts_bp, new_tokens: int):
    tokens = jnp.asarray(prompts_bp)
    mask = jnp.ones_like(tokens)
    sp = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)

    def run():
        out = sampler.generate(config, params, tokens, mask, jax.random.key(0), sp)
        return np.asarray(out.tokens_br)

    return run


def engine_fn(config, eparams, engine: Engine, prompts_bp, new_tokens: int):
    prompts = [list(p) for p in prompts_bp]

    def run():
        res = continuous_batching.rollout(engine, eparams, prompts, 1, jax.random.key(0),
                                          max_new_tokens=[new_tokens] * len(prompts))
        return res.padded(new_tokens)[0]

    return run


def hf_fn(model, prompts_bp, new_tokens: int):
    import torch

    ids = torch.tensor(prompts_bp, dtype=torch.long)

    def run():
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[:, ids.shape[1]:].numpy()

    return run


# Pause before each timed call: torch's OpenMP threads and XLA's pool spin for a while
# after a parallel region, and in interleaved rounds that spinning would land on the
# next system's time.
SETTLE_S = 0.2


def timed(fn) -> float:
    """Wall time of `fn()` (after `SETTLE_S` of idling)."""
    time.sleep(SETTLE_S)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved_decode_rates(makers: dict, batch: int, new_tokens: int, repeats: int) -> tuple[dict, dict]:
    """Decode tokens/s of each system per repeat, and each system's greedy tokens.

    `makers[name](n)` builds a call generating `n` new tokens. Each repeat times every
    system once (`N` and 1 new tokens) one after the other, so per-repeat ratios compare
    systems under the same machine conditions (the bandwidth drifts during a run).
    """
    runs = {name: (make(new_tokens), make(1)) for name, make in makers.items()}
    tokens = {name: run_n() for name, (run_n, run_1) in runs.items()}  # warm-up (compiles)
    for _, run_1 in runs.values():
        run_1()
    rates: dict = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (run_n, run_1) in runs.items():
            rates[name].append(batch * (new_tokens - 1) / max(timed(run_n) - timed(run_1), 1e-9))
    return rates, tokens


def median_ratio(a: list, b: list) -> float:
    """Median over repeats of `a[r] / b[r]`."""
    return float(np.median(np.asarray(a) / np.asarray(b)))


# ----------------------------------------------------------------------------- long tail


def long_tail_budgets(n: int, short: tuple[int, int], long: int, long_frac: float, seed: int) -> np.ndarray:
    """Per-request response lengths: uniform in `short` except a `long_frac` share at `long`."""
    rng = np.random.RandomState(seed)
    budgets = rng.randint(short[0], short[1] + 1, n)
    n_long = max(1, int(round(long_frac * n)))
    budgets[rng.choice(n, n_long, replace=False)] = long
    return budgets


def long_tail(config, params, eparams_engine, prompts_rp, budgets, slots: int, repeats: int) -> dict:
    engine, eparams = eparams_engine
    sp = engine.sampling
    prompts = [list(p) for p in prompts_rp]
    n = len(prompts)
    width = int(budgets.max())

    def run_engine():
        return continuous_batching.rollout(engine, eparams, prompts, 1, jax.random.key(1), max_new_tokens=budgets)

    def run_static():
        lengths = []
        for start in range(0, n, slots):
            chunk = jnp.asarray(prompts_rp[start : start + slots])
            out = sampler.generate(config, params, chunk, jnp.ones_like(chunk),
                                   jax.random.fold_in(jax.random.key(1), start), sp.replace(max_new_tokens=width),
                                   max_new_b=jnp.asarray(budgets[start : start + slots]))
            lengths.append(np.asarray(out.lengths_b))
        return np.concatenate(lengths)

    run_engine(), run_static()  # compiles
    t_engine, t_static = [], []
    for _ in range(repeats):  # interleaved; medians and the median per-repeat ratio
        t_engine.append(timed(run_engine))
        t_static.append(timed(run_static))
    speedup = median_ratio(t_static, t_engine)
    t_engine, t_static = float(np.median(t_engine)), float(np.median(t_static))
    res = run_engine()
    assert (res.lengths == budgets).all() and (run_static() == budgets).all()
    total = int(budgets.sum())
    return dict(
        requests=n, slots=slots, total_tokens=total, budgets_short=f"{int(budgets.min())}..",
        longest=width, engine_s=t_engine, static_s=t_static, engine_tok_s=total / t_engine,
        static_tok_s=total / t_static, speedup=speedup,
        engine_slot_utilisation=res.stats["slot_steps_used"] / max(res.stats["slot_steps_total"], 1),
        engine_decode_steps=res.stats["decode_steps"],
    )


# ----------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer tokens / repeats / requests")
    ap.add_argument("--out", help="write all numbers to this JSON file")
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (medians are reported)")
    ap.add_argument("--intermediate", type=int, default=2048, help="MLP width (2048: 39.9M parameters)")
    ap.add_argument("--paired-repeats", type=int, default=15,
                    help="repeats of the batch-1 decode / read / copy triple (median of the per-repeat ratios)")
    ap.add_argument("--skip-hf", action="store_true", help="skip transformers (JAX systems only)")
    ap.add_argument("--tail-requests", type=int, default=64)
    ap.add_argument("--tail-slots", type=int, default=16)
    ap.add_argument("--tail-long", type=int, default=256)
    args = ap.parse_args(argv)
    if args.quick:
        args.new_tokens = min(args.new_tokens, 48)
        args.repeats = min(args.repeats, 2)
        args.paired_repeats = min(args.paired_repeats, 3)
        args.tail_requests = min(args.tail_requests, 32)
        args.tail_slots = min(args.tail_slots, 8)
        args.tail_long = min(args.tail_long, 128)
    batches = [int(b) for b in args.batches.split(",")]

    config = bench_config(args.intermediate)
    params0 = qwen3.init_params(config, jax.random.key(0))
    tmp = tempfile.mkdtemp(prefix="pipo_sampler_bench_")
    hf.save(tmp, config, params0)
    config, params = hf.load(tmp)
    prompts = np.random.RandomState(0).randint(1, config.vocab_size, (max(batches), args.prompt_len)).astype(np.int32)
    model = None
    if not args.skip_hf:
        import torch
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()

    passes = dict(read=read_passes(256 << 20), copy=copy_passes(256 << 20))
    limits = machine_limits(passes)
    results: dict = dict(
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(), jax=jax.__version__, device=str(jax.devices()[0]),
                     commit=_commit(), torch=_version("torch"), transformers=_version("transformers")),
        seeds=dict(params=0, prompts=0, long_tail=1),
        model=dict(params=config.num_params, intermediate=config.intermediate_size, dtype="float32"),
        args=vars(args), limits=limits, batches={},
    )
    max_len = args.prompt_len + max(args.new_tokens, args.tail_long)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    for b in batches:
        log(f"batch {b}: one-jit generate, engine, transformers")
        pb = prompts[:b]
        engine = Engine(config, greedy, max_concurrent_decodes=b, max_len=max_len)
        eparams = engine.load_params(params)
        makers = {
            "jax": lambda n: jax_generate_fn(config, params, pb, n),
            "engine": lambda n: engine_fn(config, eparams, engine, pb, n),
        }
        if model is not None:
            makers["hf"] = lambda n: hf_fn(model, pb, n)
        rates, toks = interleaved_decode_rates(makers, b, args.new_tokens, args.repeats)
        row = {f"{name}_tok_s": float(np.median(r)) for name, r in rates.items()}
        row["rates_per_repeat"] = rates
        row["engine_matches_jax"] = float(np.mean(toks["engine"] == toks["jax"]))
        if model is not None:
            row["hf_matches_jax"] = float(np.mean(toks["hf"] == toks["jax"]))
            row["jax_vs_hf"] = median_ratio(rates["jax"], rates["hf"])
            row["engine_vs_hf"] = median_ratio(rates["engine"], rates["hf"])
        context = args.prompt_len + args.new_tokens / 2
        row["flops_per_step"], row["bytes_per_step"] = decode_costs(config, b, context)
        row["step_ms"] = 1e3 * b / row["jax_tok_s"]
        if b == 1:
            paired = paired_fractions(jax_generate_fn(config, params, pb, args.new_tokens),
                                      jax_generate_fn(config, params, pb, 1), args.new_tokens, row["bytes_per_step"],
                                      passes, args.paired_repeats)
            row["paired_frac_of_read_bw"], row["paired_frac_of_copy_bw"] = paired["read"], paired["copy"]
            row["paired_detail"] = paired
        results["batches"][b] = row
        del engine, eparams

    after = machine_limits(passes)  # the bound is the larger of the two measurements
    for key in ("matmul_flops", "copy_bytes_s", "read_bytes_s"):
        limits[key] = max(limits[key], after[key])
    limits["after_detail"] = after
    for row in results["batches"].values():
        steps_s = 1e3 / row["step_ms"]
        row["flops_frac_of_matmul"] = row["flops_per_step"] * steps_s / limits["matmul_flops"]
        row["bytes_frac_of_copy_bw"] = row["bytes_per_step"] * steps_s / limits["copy_bytes_s"]
        row["bytes_frac_of_read_bw"] = row["bytes_per_step"] * steps_s / limits["read_bytes_s"]

    log("long-tail mix: engine vs static batching")
    budgets = long_tail_budgets(args.tail_requests, (4, 16), args.tail_long, 1 / 16, seed=0)
    tail_prompts = np.random.RandomState(1).randint(1, config.vocab_size, (args.tail_requests, args.prompt_len))
    tail_sp = SamplingParams(temperature=1.0, max_new_tokens=args.tail_long)
    tail_engine = Engine(config, tail_sp, max_concurrent_decodes=args.tail_slots, max_len=max_len)
    results["long_tail"] = long_tail(config, params, (tail_engine, tail_engine.load_params(params)),
                                     tail_prompts.astype(np.int32), budgets, args.tail_slots, args.repeats)
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2, default=float)
    return results


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    return out.stdout.strip() or "unknown"


def _version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def print_table(r: dict) -> None:
    lim = r["limits"]
    print(f"model: {r['model']['params'] / 1e6:.1f}M params fp32 | machine: {r['machine']['cpus']} CPUs, "
          f"matmul {lim['matmul_flops'] / 1e9:.0f} GFLOP/s, copy {lim['copy_bytes_s'] / 1e9:.1f} GB/s, "
          f"read {lim['read_bytes_s'] / 1e9:.1f} GB/s (XLA large matvec {lim['read_detail']['xla_matvec'] / 1e9:.1f})")
    print(f"{'batch':>5} | {'one-jit tok/s':>13} | {'engine tok/s':>12} | {'HF tok/s':>9} | "
          f"{'jax/HF':>6} | {'eng/HF':>6} | {'step ms':>7} | {'FLOP frac':>9} | {'BW/copy':>7} | {'BW/read':>7} | "
          f"{'eq HF':>5}")
    for b, row in r["batches"].items():
        hf_s = row.get("hf_tok_s", float("nan"))
        print(f"{b:>5} | {row['jax_tok_s']:>13.1f} | {row['engine_tok_s']:>12.1f} | "
              f"{hf_s:>9.1f} | "
              f"{row.get('jax_vs_hf', float('nan')):>6.2f} | {row.get('engine_vs_hf', float('nan')):>6.2f} | "
              f"{row['step_ms']:>7.2f} | {row['flops_frac_of_matmul']:>9.2f} | {row['bytes_frac_of_copy_bw']:>7.2f} | "
              f"{row.get('bytes_frac_of_read_bw', float('nan')):>7.2f} | "
              f"{row.get('hf_matches_jax', float('nan')):>5.2f}")
    one = r["batches"].get(1) or r["batches"].get("1")
    if one and "paired_frac_of_read_bw" in one:
        print(f"batch 1, paired with the bandwidth passes (median of {len(one['paired_detail']['read_all'])}): "
              f"{one['paired_frac_of_read_bw']:.2f} of read, {one['paired_frac_of_copy_bw']:.2f} of copy bandwidth")
    t = r["long_tail"]
    print(f"long tail: {t['requests']} requests, {t['slots']} slots, {t['total_tokens']} tokens (longest "
          f"{t['longest']}): engine {t['engine_tok_s']:.1f} tok/s ({t['engine_s']:.2f} s, slot use "
          f"{t['engine_slot_utilisation']:.2f}) vs static {t['static_tok_s']:.1f} tok/s ({t['static_s']:.2f} s): "
          f"{t['speedup']:.2f}x")


if __name__ == "__main__":
    main()
