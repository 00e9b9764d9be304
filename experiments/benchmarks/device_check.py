"""Device check: one command on one GPU (or TPU) that runs what the CPU tests can only export.

    python -m experiments.benchmarks.device_check [--cpu_smoke] [--out FILE.json]

On the machine's first device (its platform is the target platform of every program):

(a) **kernels** against the XLA reference, values and gradients, in bf16: the fused
    log-prob Pallas kernel (`kernels/logprobs.py` impl `pallas`: Triton on a GPU, Mosaic on
    a TPU) and the fused attention the platform's bf16 programs use (`attention.cudnn` on a
    GPU, padded to its length; splash on a TPU), at an odd length with left- and
    right-padded rows;
(b) **training**: a Qwen3-0.6B-shaped random model (28 layers, hidden 1024, 16 / 8 heads,
    head_dim 128, intermediate 3072, vocab 151936) in bf16 compute over float32 master
    weights, a few GRPO + PIPO iterations on the built-in task through the host loop (the
    trainer's generate -> reward -> learn programs): finite losses, the PIPO window filling
    (count grows to K, the window holds the last K batch means);
(c) **speed**: greedy decode tokens/s at batch 1 / 32 / 256 (`sampler.generate`), and one
    learner step's time (prepare + PI step + base step, one program) with its FLOPs
    counted from the compiled HLO with loop trip counts (`hlo_cost`), MFU against the
    device's dense bf16 peak and the roofline bound (FLOPs / peak vs bytes / bandwidth);
(d) **a sweep's group**: one RL iteration of the main job's program (`configs/grpo.py:tiny`
    with PIPO, the built-in task, float32, random weights) for a group of 24 stacked members as a
    sweep runs it (`experiments/vmapped.py`), batched (`--members=vmap`) and one after another
    (`map`), against one member: what the RL part of a 24-point sweep costs on this device
    relative to one run's (docs/configs.md, "Against separate runs");
(e) a JSON in `experiments/results/` (device, versions, commit, every check and figure)
    and a table on stdout. The exit status is 0 when every check passed.

With no accelerator (or `--cpu_smoke`) it runs a reduced form: the tiny task model, a
small rollout, a group of 2 micro-preset members, the Pallas kernels in interpret mode (the
Triton kernel's code) and cuDNN's padded call run by XLA's attention (`attention.cudnn(..., implementation="xla")`);
`tests/benchmarks/test_device_check.py` runs that form. Sized for under 8 minutes on one
H100 / H200.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import grpo
from experiments import provenance, vmapped
from experiments.benchmarks import hlo_cost
from pipo_jax import platforms
from pipo_jax.kernels import logprobs as lp
from pipo_jax.models import attention, qwen3
from pipo_jax.rl import learn as learn_lib
from pipo_jax.rl import loop
from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import spec_from_config
from pipo_jax.rl.state import init_train_state
from pipo_jax.run.setup import train_spec
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams

RESULTS = os.path.join(os.path.dirname(__file__), "..", "results")
# Dense bf16 peak FLOP/s and HBM bytes/s per device (data sheets), matched against the
# device kind in this order (H200 before H20: the name contains it).
PEAKS = (("H200", 989e12, 4.8e12), ("H100", 989e12, 3.35e12), ("H20", 148e12, 4.0e12), ("A100", 312e12, 2.0e12),
         ("TPU v5p", 459e12, 2.76e12), ("TPU v5 lite", 197e12, 0.82e12), ("TPU v6", 918e12, 1.64e12))
# bf16 inputs, fp32 accumulation on both sides: max |fast - reference| / max |reference| of
# each output and gradient (bf16 rounds at 2^-8 = 0.4%; sums over thousands of terms differ
# in order).
BF16_REL_TOL = 2e-2
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings")


@dataclasses.dataclass(frozen=True)
class Sizes:
    model: str  # a qwen3 preset whose shapes replace the task model's, or "task_tiny"
    logprobs: tuple[int, int, int]  # tokens, hidden, vocab
    attention: tuple[int, int, int, int, int]  # batch, T (odd: cuDNN pads it), q heads, kv heads, head_dim
    prompts: int  # rollout prompts per iteration (x group_size rows)
    group: int
    iterations: int
    decode_batches: tuple[int, ...]
    decode_prompt: int
    decode_new: int
    sweep_preset: str  # (d): the grpo preset whose program a sweep's group runs
    sweep_group: int  # (d): members stacked in the group


FULL = Sizes(model="qwen3_0.6b", logprobs=(4096, 1024, 151_936), attention=(4, 1023, 16, 8, 128), prompts=32,
             group=8, iterations=4, decode_batches=(1, 32, 256), decode_prompt=128, decode_new=128,
             sweep_preset="tiny", sweep_group=24)
SMOKE = Sizes(model="task_tiny", logprobs=(64, 64, 1000), attention=(3, 23, 4, 2, 16), prompts=4, group=4,
              iterations=3, decode_batches=(1, 8), decode_prompt=8, decode_new=8, sweep_preset="micro", sweep_group=2)


def device_info() -> dict:
    d = jax.devices()[0]
    platform = platforms.of_devices([d])
    kind = d.device_kind
    peak = next(((name, f, b) for name, f, b in PEAKS if name.lower() in kind.lower()), None)
    return {"platform": platform, "kind": kind, "count": jax.device_count(),
            "peak_name": peak[0] if peak else None, "peak_flops": peak[1] if peak else None,
            "hbm_bytes_per_s": peak[2] if peak else None}


def versions() -> dict:
    out = provenance.versions()
    for name in ("jax-cuda12-plugin", "jax-cuda12-pjrt", "libtpu", "nvidia-cudnn-cu12"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def _check(name: str, errors: dict[str, float], tol: float, **detail) -> dict:
    finite = all(np.isfinite(v) for v in errors.values())
    return {"name": name, "passed": bool(finite and max(errors.values()) <= tol), "max_rel_err": max(errors.values()),
            "tolerance": tol, "errors": errors, **detail}


# ----------------------------------------------------------------------------- (a) kernels


def value_and_vjp(fn, cotangent):
    """One jitted program: `fn`'s output and its VJP at `cotangent` (the gradient of
    sum(cotangent * fn), in float32 for a bf16 output)."""

    def both(*args):
        out, vjp = jax.vjp(lambda *a: fn(*a).astype(jnp.float32), *args)
        return (out, *vjp(cotangent))

    return jax.jit(both)


def check_logprobs(sizes: Sizes, platform: str) -> dict:
    """The Pallas fused log-prob kernel (and its custom VJP) against the plain reference."""
    n, d, v = sizes.logprobs
    kh, kw, kt, kg = jax.random.split(jax.random.PRNGKey(0), 4)
    h = jax.random.normal(kh, (n, d), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (d, v), jnp.float32) * d**-0.5).astype(jnp.bfloat16)
    t = jax.random.randint(kt, (n,), 0, v)
    g = jax.random.normal(kg, (n,), jnp.float32)
    # The GPU's kernel (Triton) wherever the target is not a TPU; interpreted on a CPU target.
    variant = "mosaic_tpu" if platform == "tpu" else "triton"
    fast = lp.kernel_config(impl="pallas", pallas_variant=variant, platform=platform)
    ref = lp.kernel_config(impl="reference", platform=platform)

    def value_and_grads(cfg):
        return jax.device_get(value_and_vjp(lambda h, w: lp.token_logprobs(h, w, t, cfg), g)(h, w))

    (lf, dhf, dwf), (lr, dhr, dwr) = value_and_grads(fast), value_and_grads(ref)
    return _check("logprobs pallas vs reference", {"logp": _rel_err(lf, lr), "d_hidden": _rel_err(dhf, dhr),
                                                   "d_weight": _rel_err(dwf, dwr)}, BF16_REL_TOL,
                  kernel=f"pallas/{fast.variant}{' (interpret)' if fast.interpret else ''}", shape=[n, d, v])


def fused_attention(platform: str):
    """The bf16 attention the platform's programs use, and its name."""
    if platform == "cuda":
        return functools.partial(attention.cudnn, implementation="cudnn"), "cudnn"
    if platform == "tpu":
        return functools.partial(attention.splash_attention, interpret=False), "splash"
    # A CPU target: cuDNN's call with its padding, run by XLA's attention.
    return functools.partial(attention.cudnn, implementation="xla"), "cudnn call run by XLA (padding, lengths)"


def check_attention(sizes: Sizes, platform: str) -> dict:
    """The fused attention (cuDNN: padded to its length) against the reference, left / right padded rows."""
    b, t, hq, hk, dh = sizes.attention
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(ks[0], (b, t, hq, dh), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], (b, t, hk, dh), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], (b, t, hk, dh), jnp.float32).astype(jnp.bfloat16)
    valid = np.ones((b, t), bool)
    valid[0, : t // 5] = False  # left padding
    valid[-1, t - t // 3:] = False  # right padding
    valid_j = jnp.asarray(valid)
    g = jax.random.normal(ks[3], (b, t, hq, dh), jnp.float32) * valid[:, :, None, None]
    fused, name = fused_attention(platform)

    def fast(q, k, v):
        return fused(q, k, v, valid_j, jnp.bfloat16)

    def ref(q, k, v):  # fp32 from the same bf16 inputs
        return attention.reference(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                                   attention.causal_padded_mask(valid_j), jnp.float32)

    def outputs(fn):
        return jax.device_get(value_and_vjp(fn, g)(q, k, v))

    (of, dqf, dkf, dvf), (orf, dqr, dkr, dvr) = outputs(fast), outputs(ref)
    errors = {"out": _rel_err(of[valid], orf[valid]), "dq": _rel_err(dqf, dqr), "dk": _rel_err(dkf, dkr),
              "dv": _rel_err(dvf, dvr)}
    return _check(f"attention {name} vs reference", errors, BF16_REL_TOL, shape=[b, t, hq, hk, dh],
                  padded_length=attention.cudnn_length(t) if platform != "tpu" else attention.splash_block(t),
                  padding_rows_zero=bool(np.all(np.asarray(of, np.float32)[~valid] == 0)))


# ----------------------------------------------------------------------------- (b) training


def train_spec_for(sizes: Sizes, platform: str):
    """GRPO + PIPO (the micro preset's settings) in bf16 over float32 masters on the built-in
    task, the model shapes `sizes.model`'s (random weights)."""
    c = grpo.get_config("micro")
    c.model.preset = "task_tiny"  # the micro preset's settings on the two-layer task model (the smoke's model)
    c.pipo.enabled = True
    c.model.dtype, c.model.param_dtype, c.model.platform = "bfloat16", "float32", platform
    c.seed = 1  # graded rewards with variance at the micro scale (tests/rl/test_trainer.py)
    c.rollout.prompts_per_batch, c.rollout.group_size = sizes.prompts, sizes.group
    c.train.mini_batch_prompts = sizes.prompts // 2
    run = RunConfig.from_config(c)
    base = train_spec(run)
    if sizes.model == "task_tiny":
        return c, base
    model = base.model.replace(**{k: getattr(qwen3.preset(sizes.model), k) for k in SHAPE_FIELDS})
    return c, spec_from_config(run, model, base.task)


class TimedProgram:
    """A jitted function compiled ahead of time at its first call (the compiled HLO is kept for
    its FLOP count); each call's wall time, outputs ready, is recorded."""

    def __init__(self, fn):
        self.fn, self.compiled, self.compile_s, self.times = fn, None, None, []

    def __call__(self, *args):
        if self.compiled is None:
            t0 = time.perf_counter()
            self.compiled = self.fn.lower(*args).compile()
            self.compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.compiled(*args))
        self.times.append(time.perf_counter() - t0)
        return out


def check_training(sizes: Sizes, platform: str, device: dict) -> tuple[list[dict], dict, object, object]:
    """A few host-loop iterations; returns (checks, figures, spec, final state)."""
    c, spec = train_spec_for(sizes, platform)
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(c.seed)), c.seed)
    learn = TimedProgram(jax.jit(functools.partial(learn_lib.learn, spec)))
    programs = dataclasses.replace(loop.single_device_programs(spec), learn=learn)

    def reward(rollout):
        return np.asarray(rollout_lib.task_rewards(spec, rollout))

    k = spec.pipo.window
    rows, counts, windows = [], [], []
    t0 = time.perf_counter()
    for _ in range(sizes.iterations):
        state, m = loop.host_iteration(spec, state, loop.RewardFunction(reward), programs)
        rows.append(jax.device_get(m))
        counts.append(int(state.pipo.count))
        windows.append(np.asarray(state.pipo.mu_window_k))
    train_s = time.perf_counter() - t0
    mu = np.array([float(r["mu_t"]) for r in rows])
    losses = {key: [float(r[key]) for r in rows] for key in ("train/loss", "pi/loss") if key in rows[0]}
    finite = all(np.all(np.isfinite(np.asarray(v))) for r in rows for key, v in r.items()
                 if key not in ("mu_his", "sigma_his"))  # the window's moments are NaN until it has entries
    params_finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state.params))
    expected_counts = [min(i + 1, k) for i in range(sizes.iterations)]
    window_ok = all(np.allclose(w[k - n:], mu[i + 1 - n: i + 1], rtol=1e-6)
                    for i, (w, n) in enumerate(zip(windows, counts)))
    dtypes_ok = all(x.dtype == jnp.float32 for x in jax.tree.leaves((state.params, state.opt_state))
                    if jnp.issubdtype(x.dtype, jnp.floating))
    checks = [
        {"name": "training: finite metrics and params", "passed": bool(finite and params_finite), "losses": losses},
        {"name": "training: PIPO count grows to K", "passed": counts == expected_counts, "counts": counts,
         "expected": expected_counts},
        {"name": "training: PIPO window holds the batch means", "passed": bool(window_ok),
         "window": windows[-1].tolist(), "mu_t": mu.tolist()},
        {"name": "training: float32 masters and AdamW state (bf16 compute)", "passed": bool(dtypes_ok)},
    ]
    cost = hlo_cost.program_cost(learn.compiled.as_text())
    step_s = float(np.median(learn.times[1:] if len(learn.times) > 1 else learn.times))
    xla_cost = learn.compiled.cost_analysis() or {}
    if isinstance(xla_cost, list):  # older jax: one dict per device
        xla_cost = xla_cost[0] if xla_cost else {}
    figures = {
        "model": sizes.model, "num_params": spec.model.num_params, "rows": spec.batch,
        "seq_len": spec.prompt_len + spec.rollout.max_new_tokens, "window": k, "iterations": sizes.iterations,
        "train_seconds": train_s, "pi_step_applied": [float(r["pi_step_applied"]) for r in rows],
        "reward_mean": [float(r["reward_mean"]) for r in rows],
        "learner_step": step_figures(step_s, cost.flops, cost.bytes, device) | {
            "compile_s": learn.compile_s, "times_s": learn.times, "unknown_trip_counts": cost.unknown_trip_counts,
            "xla_cost_analysis_flops": float(xla_cost.get("flops", float("nan")))},
    }
    return checks, figures, spec, state


def step_figures(seconds: float, flops: float, nbytes: float, device: dict) -> dict:
    """Step time, counted FLOPs / bytes, achieved FLOP/s, MFU and the roofline bound."""
    out = {"seconds": seconds, "flops": flops, "bytes": nbytes, "flops_per_s": flops / seconds,
           "arithmetic_intensity": flops / nbytes if nbytes else None}
    peak, bw = device["peak_flops"], device["hbm_bytes_per_s"]
    if peak:
        compute_s, memory_s = flops / peak, nbytes / bw
        out.update(mfu=flops / seconds / peak, roofline_s=max(compute_s, memory_s),
                   bound="compute" if compute_s >= memory_s else "memory")
    return out


# ----------------------------------------------------------------------------- (c) decode


def decode_speed(sizes: Sizes, spec, params) -> list[dict]:
    """Greedy decode tokens/s per batch size (the trainer's params and model config)."""
    sampling = SamplingParams(max_new_tokens=sizes.decode_new, temperature=0.0)
    gen = jax.jit(sampler.generate, static_argnums=(0, 5))
    rows = []
    for b in sizes.decode_batches:
        tokens = jax.random.randint(jax.random.PRNGKey(b), (b, sizes.decode_prompt), 3, spec.model.vocab_size)
        mask = jnp.ones((b, sizes.decode_prompt), jnp.int32)
        t0 = time.perf_counter()
        jax.block_until_ready(gen(spec.model, params, tokens, mask, jax.random.PRNGKey(0), sampling))
        compile_s = time.perf_counter() - t0
        best = None
        for rep in range(2):
            t0 = time.perf_counter()
            out = jax.block_until_ready(gen(spec.model, params, tokens, mask, jax.random.PRNGKey(rep), sampling))
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        generated = int(jnp.sum(out.lengths_b))
        rows.append({"batch": b, "prompt": sizes.decode_prompt, "new_tokens": sizes.decode_new,
                     "generated": generated, "seconds": best, "tokens_per_s": generated / best,
                     "first_call_s": compile_s})
    return rows


def sweep_group(sizes: Sizes, platform: str) -> dict:
    """(d) Seconds of one RL iteration (median of 3, after the compile) of `sizes.sweep_preset`'s GRPO + PIPO
    program for one member, and for `sizes.sweep_group` stacked members batched and one after another
    (`vmapped.vmapped_chunk`); `vs_one_member`: each against the one member's."""
    c = grpo.get_config(sizes.sweep_preset)
    c.pipo.enabled, c.model.platform = True, platform
    spec = train_spec(RunConfig.from_config(c))
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(0))
    rows = []
    for members, size in (("vmap", 1), ("vmap", sizes.sweep_group), ("map", sizes.sweep_group)):
        states = vmapped.stack([init_train_state(spec, params, seed) for seed in range(size)])
        t0 = time.perf_counter()
        chunk = vmapped.vmapped_chunk.lower(spec, states, 1, members).compile()
        compile_s, times = time.perf_counter() - t0, []
        for _ in range(3):
            t0 = time.perf_counter()
            states, metrics = chunk(states)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t0)
        rows.append({"members": members, "group": size, "seconds": float(np.median(times)), "compile_s": compile_s})
    for r in rows:
        r["vs_one_member"] = r["seconds"] / rows[0]["seconds"]
    return {"preset": sizes.sweep_preset, "rows": rows}


# ----------------------------------------------------------------------------- report


def table(result: dict) -> str:
    lines = [f"device check: {result['device']['kind']} ({result['device']['platform']}), mode {result['mode']}, "
             f"jax {result['versions'].get('jax')}, commit {result['provenance']['commit'][:12]}", "",
             f"{'check':58} {'result':6} {'max rel err':>11} {'tol':>7}"]
    for c in result["checks"]:
        err = f"{c['max_rel_err']:.2e}" if "max_rel_err" in c else ""
        tol = f"{c['tolerance']:.0e}" if "tolerance" in c else ""
        lines.append(f"{c['name']:58} {'PASS' if c['passed'] else 'FAIL':6} {err:>11} {tol:>7}")
    lines += ["", f"{'decode batch':>12} {'new tokens':>10} {'seconds':>9} {'tokens/s':>10}"]
    for r in result["decode"]:
        lines.append(f"{r['batch']:>12} {r['generated']:>10} {r['seconds']:>9.3f} {r['tokens_per_s']:>10.1f}")
    s = result["train"]["learner_step"]
    mfu = f"MFU {100 * s['mfu']:.1f}% ({s['bound']}-bound, roofline {s['roofline_s'] * 1e3:.1f} ms)" \
        if "mfu" in s else "MFU n/a (no peak known for this device)"
    lines += ["", f"sweep group ({result['sweep']['preset']} preset, one RL iteration): "
              + "; ".join(f"{r['group']} member{'s' * (r['group'] > 1)} {r['members']} {r['seconds'] * 1e3:.1f} ms "
                          f"({r['vs_one_member']:.2f}x one member)" for r in result["sweep"]["rows"])]
    lines += ["", f"learner step ({result['train']['model']}, {result['train']['rows']} rows x "
              f"{result['train']['seq_len']} tokens): {s['seconds'] * 1e3:.1f} ms, {s['flops'] / 1e12:.3f} TFLOP "
              f"counted, {s['flops_per_s'] / 1e12:.2f} TFLOP/s, {mfu}",
              f"all checks passed: {result['all_passed']} ({result['seconds']:.0f} s)"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu_smoke", action="store_true",
                    help="the reduced form (tiny model, small shapes); the default with no accelerator")
    ap.add_argument("--out", default="", help="the JSON (default experiments/results/device_check_<device>.json)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    device = device_info()
    platform = device["platform"]
    smoke = args.cpu_smoke or platform == "cpu"
    sizes = SMOKE if smoke else FULL
    result = {"mode": "cpu_smoke" if smoke else "full", "device": device, "versions": versions(),
              "provenance": provenance.record(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "sizes": dataclasses.asdict(sizes), "checks": []}
    result["checks"].append(check_logprobs(sizes, platform))
    result["checks"].append(check_attention(sizes, platform))
    train_checks, result["train"], spec, state = check_training(sizes, platform, device)
    result["checks"] += train_checks
    result["decode"] = decode_speed(sizes, spec, state.params)
    result["sweep"] = sweep_group(sizes, platform)
    result["all_passed"] = all(c["passed"] for c in result["checks"])
    result["seconds"] = time.perf_counter() - t0
    out = args.out or os.path.join(RESULTS, f"device_check_{'cpu_smoke' if smoke else device['kind'].replace(' ', '_')}"
                                   ".json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=float)
    print(table(result))
    print(f"wrote {out}")
    result["out"] = out
    return result


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:])["all_passed"] else 1)
