"""The layer-loop forms and the PIPO learner on the same CPU work as Tunix.

One process, one ~40M Qwen3 (fp32, random weights saved once with `hf.save` and loaded by
both this project and Tunix's `create_model_from_safe_tensors`), interleaved rounds (each
round times every system once, one after the other; the tables give medians of each
system's figure and of the per-round ratios, as the machine's bandwidth drifts):

1. greedy decode tokens/s at batch 1 and 32 (prefill excluded: `B * (N - 1) / (t(N) -
   t(1))`): the one-jit `sampler.generate` and the slot engine, each with the layer loop
   as one `lax.scan` (what TPU / GPU programs use) and unrolled (what `layer_loop="auto"`
   picks on CPU; at batch 1 it also takes the small attention projections as column stacks,
   one batched product each, `decode.one_row_layer`; the unrolled engine also with several
   decode steps per call, `--engine-steps`), against Tunix's `Sampler` (no stop token; the
   greedy tokens are compared);
2. the learner on one GRPO mini-batch of 32 sequences x 80 tokens (32 prompt + 48
   response) at micro-batch 8 and 32: this project's base step (`steps.minibatch_updates`
   with the GRPO loss and the trainer's optimizer) in both loop forms, the PIPO learner
   (`learn.pi_step` applying on the stored batch, then the base step) as a ratio to the
   base step, and Tunix's model under the same loss (`losses.policy.token_clip_loss`),
   micro-batch accumulation and optimizer (global-norm clip + AdamW).

Tunix runs where `tunix` imports (it pins other transformers / tokenizers versions than
this project: install it in its own environment, e.g. `python -m venv ../venv_tunix &&
../venv_tunix/bin/pip install google-tunix jax==<this jax>` and run this script with that
interpreter and `PYTHONPATH=.`); elsewhere its columns are left out with a note.

Prints tables; `--out FILE.json` writes every number with commit, versions, machine, load
average and seeds. Timings are never asserted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from configs import grpo
from experiments.benchmarks.sampler import (bench_config, engine_fn, interleaved_decode_rates, jax_generate_fn, log,
                                            median_ratio)
from pipo_jax import provenance
from pipo_jax.losses import policy
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.models import hf, qwen3
from pipo_jax.rl import controller, learn, steps
from pipo_jax.rl.batch import TrainBatch, stored
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import spec_from_config
from pipo_jax.rl.state import init_train_state, make_optimizer
from pipo_jax.sampling.engine import Engine
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks.dataset import DatasetTask

LOOPS = ("scan", "unroll")


def timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- Tunix


def tunix_available() -> bool:
    try:
        import tunix.generate.sampler  # noqa: F401
        import tunix.models.qwen3.params  # noqa: F401
    except ImportError:
        return False
    return True


class IdTokenizer:
    """Token ids written as space-separated integers: Tunix's sampler takes strings."""

    def __init__(self, pad_id: int, eos_id: int):
        self._pad, self._eos = pad_id, eos_id

    def encode(self, text: str, **_) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, **_) -> str:
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self) -> int:
        return 0

    def eos_id(self) -> int:
        return self._eos

    def pad_id(self) -> int:
        return self._pad


def tunix_model(path: str, config: qwen3.Qwen3Config):
    from tunix.models.qwen3 import model as tunix_model_lib
    from tunix.models.qwen3 import params as tunix_params

    tc = tunix_model_lib.ModelConfig(
        num_layers=config.num_hidden_layers, vocab_size=config.vocab_size, embed_dim=config.hidden_size,
        hidden_dim=config.intermediate_size, num_heads=config.num_attention_heads, head_dim=config.head_dim,
        num_kv_heads=config.num_key_value_heads, rope_theta=int(config.rope_theta), norm_eps=config.rms_norm_eps,
        use_tied_embedding=config.tie_word_embeddings)
    return tunix_params.create_model_from_safe_tensors(path, tc, dtype=jnp.float32)


def tunix_generate_fn(tsampler, prompts_bp, new_tokens: int, eos_id: int):
    strings = [" ".join(str(int(t)) for t in row) for row in prompts_bp]

    def run():
        out = tsampler(strings, max_generation_steps=new_tokens, temperature=0.0, eos_tokens=[eos_id],
                       max_prompt_length=prompts_bp.shape[1], echo=False, pad_output=True)
        return np.stack([np.asarray(t)[:new_tokens] for t in out.tokens])

    return run


def tunix_learner_fn(model, batch: TrainBatch, micro: int, spec):
    """Tunix's Qwen3 under the base step's GRPO loss, accumulation and optimizer (no NaN guard)."""
    graphdef, state = nnx.split(model)
    optimizer = optax.chain(optax.clip_by_global_norm(spec.train.grad_clip),
                            optax.adamw(spec.train.lr, b1=spec.train.adam_b1, b2=spec.train.adam_b2,
                                        weight_decay=spec.train.weight_decay))
    opt_state = optimizer.init(state)
    r = batch.mask_br.shape[1]
    counts = steps.response_counts(batch)

    def loss(st, mb):
        m = nnx.merge(graphdef, st)
        l = mb.tokens_bl.shape[1]
        positions = jnp.maximum(jnp.cumsum(mb.mask_bl, axis=1) - 1, 0)
        causal = jnp.tril(jnp.ones((l, l), bool))[None] & mb.mask_bl[:, None, :].astype(bool)
        logits, _ = m(mb.tokens_bl, positions, None, causal)
        logp = jax.nn.log_softmax(logits[:, -r - 1:-1].astype(jnp.float32))
        logp_br = jnp.take_along_axis(logp, mb.tokens_bl[:, -r:, None], -1)[..., 0]
        return policy.token_clip_loss(logp_br, mb.logp_old_br, mb.adv_br, mb.mask_br,
                                      agg=Aggregation.of(spec.loss.agg_mode, counts))[0]

    grad = jax.grad(loss)

    @jax.jit
    def step(st, s, b):
        micro_b = jax.tree.map(lambda x: x.reshape(-1, micro, *x.shape[1:]), b)
        g, _ = jax.lax.scan(lambda acc, mb: (jax.tree.map(jnp.add, acc, grad(st, mb)), None),
                            jax.tree.map(jnp.zeros_like, st), micro_b)
        updates, s = optimizer.update(g, s, st)
        return optax.apply_updates(st, updates), s

    return lambda: step(state, opt_state, batch)


# ----------------------------------------------------------------------------- this project's learner


def learner_spec(config: qwen3.Qwen3Config, rows: int, prompt_len: int, response_len: int, micro: int):
    """GRPO (G = 8) with PIPO on: one optimizer step on `rows` sequences in micro-batches of `micro`."""
    c = grpo.get_config("micro")
    c.rollout.group_size, c.rollout.prompts_per_batch, c.rollout.max_new_tokens = 8, rows // 8, response_len
    c.train.mini_batch_prompts, c.train.micro_batch_size_per_device = rows // 8, micro
    c.pipo.enabled = True
    n = 64
    task = DatasetTask(kind="math", prompt_tokens_np=np.zeros((n, prompt_len), np.int32),
                       prompt_lengths_np=np.full((n,), prompt_len, np.int32), references=("0",) * n,
                       train_rows_np=np.arange(n, dtype=np.int32), heldout_rows_np=np.zeros((0,), np.int32),
                       stop_token_ids=(2,), pad_id=0)
    return spec_from_config(RunConfig.from_config(c), config, task)


def learner_batch(config: qwen3.Qwen3Config, rows: int, prompt_len: int, response_len: int, seed: int) -> TrainBatch:
    rng = np.random.RandomState(seed)
    length = prompt_len + response_len
    lengths = rng.randint(response_len // 2, response_len + 1, rows)
    mask_br = (np.arange(response_len)[None] < lengths[:, None]).astype(np.float32)
    mask_bl = np.concatenate([np.ones((rows, prompt_len)), mask_br], 1).astype(np.int32)
    adv = np.repeat(rng.randn(rows, 1), response_len, 1).astype(np.float32) * mask_br
    return TrainBatch(
        tokens_bl=jnp.asarray(rng.randint(1, config.vocab_size, (rows, length)), jnp.int32),
        mask_bl=jnp.asarray(mask_bl), mask_br=jnp.asarray(mask_br),
        logp_old_br=jnp.asarray(-rng.uniform(0, 9, (rows, response_len)) * mask_br, jnp.float32),
        logp_ref_br=jnp.asarray(-rng.uniform(0, 9, (rows, response_len)) * mask_br, jnp.float32),
        adv_br=jnp.asarray(adv), attr_br=jnp.asarray(adv))


def learner_fns(spec, params, batch: TrainBatch, seed: int):
    """(base step, PIPO learner) calls on `batch`; the PI step applies (a window below mu_t)."""
    state = init_train_state(spec, params, seed)
    kept = stored(batch)
    pipo_state = state.pipo
    for k in range(spec.pipo.window + 1):
        pipo_state = controller.push(pipo_state, jnp.float32(0.3 + 0.05 * (k % 3)), kept)
    rng = jax.random.key(seed)
    optimizer = make_optimizer(spec.train.lr, spec)

    def base(p, s, b, key):
        return steps.minibatch_updates(spec, steps.base_loss_fn(spec, hyper=state.hyper), optimizer, p, s, b, key)

    @jax.jit
    def base_step(p, s, b, key):
        return base(p, s, b, key)[:2]

    @jax.jit
    def pipo_learner(p, s, ps, b, key):
        p, s, m = learn.pi_step(spec, p, s, ps, jnp.float32(0.9), key, hyper=state.hyper)
        return base(p, s, b, key)[:2], m["pi_step_applied"]

    _, applied = pipo_learner(state.params, state.opt_state, pipo_state, batch, rng)
    assert float(applied) == 1.0, "the PI step must apply in this benchmark"
    return (lambda: base_step(state.params, state.opt_state, batch, rng),
            lambda: pipo_learner(state.params, state.opt_state, pipo_state, batch, rng))


def interleaved_times(fns: dict, repeats: int) -> dict:
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile
    out: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name].append(timed(fn))
    return out


# ----------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    ap.add_argument("--out", help="write all numbers to this JSON file")
    ap.add_argument("--batches", default="1,32", help="decode batch sizes ('' = no decode rows)")
    ap.add_argument("--micro", default="8,32", help="learner micro-batch sizes ('' = no learner rows)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--intermediate", type=int, default=2048, help="MLP width (2048: 39.9M parameters)")
    ap.add_argument("--engine-steps", default="1,8",
                    help="decode steps per call of the unrolled slot engine's rows (Engine.steps_per_call)")
    ap.add_argument("--skip-tunix", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.new_tokens, args.repeats = min(args.new_tokens, 24), min(args.repeats, 2)
    use_tunix = tunix_available() and not args.skip_tunix
    base_config = bench_config(args.intermediate)
    tmp = tempfile.mkdtemp(prefix="pipo_vs_tunix_")
    hf.save(tmp, base_config, qwen3.init_params(base_config, jax.random.key(0)))
    base_config, params = hf.load(tmp)
    configs = {loop: base_config.replace(layer_loop=loop) for loop in LOOPS}
    eos = base_config.vocab_size  # an id no logit can pick: every response runs its full length
    tmodel = tunix_model(tmp, base_config) if use_tunix else None
    results: dict = dict(
        provenance=provenance.record(),
        loadavg_start=os.getloadavg(), seeds=dict(params=0, prompts=0, batch=0),
        model=dict(params=base_config.num_params, dtype="float32"), args=vars(args),
        tunix=("google-tunix " + _version("google-tunix")) if use_tunix else "not installed: Tunix columns left out",
        decode={}, learner={})
    prompts = np.random.RandomState(0).randint(1, base_config.vocab_size - 1,
                                               (max([int(b) for b in args.batches.split(",") if b] or [1]), args.prompt_len))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    engine_steps = [int(k) for k in args.engine_steps.split(",")]
    for b in (int(x) for x in args.batches.split(",") if x):
        log(f"decode, batch {b}")
        pb = prompts[:b].astype(np.int32)
        makers = {}
        for loop, config in configs.items():
            makers[f"generate_{loop}"] = lambda n, config=config: jax_generate_fn(config, params, pb, n)
            for steps in ([1] if loop == "scan" else engine_steps):
                engine = Engine(config, greedy, max_concurrent_decodes=b, max_len=args.prompt_len + args.new_tokens,
                                steps_per_call=steps)
                eparams = engine.load_params(params)
                name = f"engine_{loop}" + (f"_{steps}steps" if steps > 1 else "")
                makers[name] = lambda n, c=config, e=engine, ep=eparams: engine_fn(c, ep, e, pb, n)
        if tmodel is not None:
            from tunix.generate import sampler as tunix_sampler

            cache = tunix_sampler.CacheConfig(cache_size=args.prompt_len + args.new_tokens + 8,
                                              num_layers=base_config.num_hidden_layers,
                                              num_kv_heads=base_config.num_key_value_heads,
                                              head_dim=base_config.head_dim)
            ts = tunix_sampler.Sampler(tmodel, IdTokenizer(pad_id=0, eos_id=eos), cache)
            makers["tunix"] = lambda n, ts=ts: tunix_generate_fn(ts, pb, n, eos)
        rates, toks = interleaved_decode_rates(makers, b, args.new_tokens, args.repeats)
        row: dict = {f"{k}_tok_s": float(np.median(v)) for k, v in rates.items()}
        row["rates_per_repeat"] = rates
        row["tokens_equal"] = {k: float(np.mean(v == toks["generate_scan"])) for k, v in toks.items()}
        for k in rates:
            if k != "generate_scan":
                row[f"{k}_vs_generate_scan"] = median_ratio(rates[k], rates["generate_scan"])
            if "tunix" in rates and k != "tunix":
                row[f"{k}_vs_tunix"] = median_ratio(rates[k], rates["tunix"])
        results["decode"][b] = row
    rows, resp = 32, 80 - args.prompt_len
    batch = learner_batch(base_config, rows, args.prompt_len, resp, seed=0)
    for micro in (int(x) for x in args.micro.split(",") if x):
        log(f"learner, micro-batch {micro}")
        fns = {}
        for loop, config in configs.items():
            spec = learner_spec(config, rows, args.prompt_len, resp, micro)
            fns[f"base_{loop}"], fns[f"pipo_{loop}"] = learner_fns(spec, params, batch, seed=0)
        if tmodel is not None:
            fns["tunix"] = tunix_learner_fn(tmodel, batch, micro, spec)
        times = interleaved_times(fns, args.repeats)
        row = {f"{k}_s": float(np.median(v)) for k, v in times.items()}
        row["times_per_repeat"] = times
        for loop in LOOPS:
            row[f"pipo_over_base_{loop}"] = median_ratio(times[f"pipo_{loop}"], times[f"base_{loop}"])
            if "tunix" in times:
                row[f"base_{loop}_speed_vs_tunix"] = median_ratio(times["tunix"], times[f"base_{loop}"])
        results["learner"][micro] = row
    results["loadavg_end"] = os.getloadavg()
    print_tables(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return results


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def print_tables(r: dict) -> None:
    nan = float("nan")
    print(f"model {r['model']['params'] / 1e6:.1f}M fp32 | Tunix: {r['tunix']} | load {r['loadavg_start'][0]:.1f}")
    print(f"{'batch':>5} | {'system':>20} | {'tok/s':>8} | {'vs scan':>7} | {'vs Tunix':>8} | {'eq scan':>7}")
    for b, row in r["decode"].items():
        for name in [k[:-6] for k in row if k.endswith("_tok_s")]:
            print(f"{b:>5} | {name:>20} | {row[name + '_tok_s']:>8.1f} | "
                  f"{row.get(name + '_vs_generate_scan', 1.0 if name == 'generate_scan' else nan):>7.2f} | "
                  f"{row.get(name + '_vs_tunix', nan):>8.2f} | {row['tokens_equal'][name]:>7.2f}")
    print(f"{'micro':>5} | {'system':>20} | {'s/step':>8} | {'speed vs Tunix':>14} | {'PIPO / base':>11}")
    for micro, row in r["learner"].items():
        for name in [k[:-2] for k in row if k.endswith("_s") and not k.startswith("times")]:
            loop = name.split("_")[-1]
            print(f"{micro:>5} | {name:>20} | {row[name + '_s']:>8.3f} | "
                  f"{row.get(name + '_speed_vs_tunix', nan):>14.2f} | "
                  f"{row.get('pipo_over_base_' + loop, nan) if name.startswith('pipo') else nan:>11.2f}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
