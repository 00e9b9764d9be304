"""Run as a script with XLA_FLAGS=--xla_force_host_platform_device_count=4 (see
test_logprobs_vocab_parallel.py): checks `token_logprobs_vocab_parallel` under shard_map
against the single-device reference, values and gradients. Exits non-zero on mismatch."""
from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from pipo_jax.kernels import logprobs as lp

N, D, V = 24, 16, 4 * 97  # 97 columns per shard: not a multiple of any block size
TEMPERATURE = 0.8


def _inputs():
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    h = jax.random.normal(k[0], (N, D))
    w = jax.random.normal(k[1], (D, V)) * 0.5
    t = jax.random.randint(k[2], (N,), 0, V)
    valid = jnp.arange(N) % 7 != 3
    t = jnp.where(valid, t, -1)  # masked rows carry an ignore-index target
    return h, w, t, valid, jax.random.normal(k[3], (N,)), jax.random.normal(k[4], (N,))


def _loss(fn, h, w, t, valid, g_lp, g_ent):
    logp, ent = fn(h, w, t, valid)
    return jnp.sum(g_lp * logp) + jnp.sum(g_ent * ent), (logp, ent)


def _run(fn, h, w, t, valid, g_lp, g_ent):
    grad = jax.jit(jax.value_and_grad(functools.partial(_loss, fn), (0, 1), has_aux=True))
    (_, (logp, ent)), (dh, dw) = grad(h, w, t, valid, g_lp, g_ent)
    return [np.asarray(x) for x in (logp, ent, dh, dw)]


def _sharded(mesh, rows, impl, check_vma=True, **kw):
    per_shard = functools.partial(lp.token_logprobs_vocab_parallel, axis_name="tensor",
                                  cfg=lp.kernel_config(temperature=TEMPERATURE, with_entropy=True, impl=impl, **kw))
    return jax.shard_map(
        lambda h, w, t, ok: per_shard(h, w, t, valid_n=ok),
        mesh=mesh,
        in_specs=(P(rows, None), P(None, "tensor"), P(rows), P(rows)),
        out_specs=(P(rows), P(rows)),
        check_vma=check_vma,
    )


def main() -> int:
    assert len(jax.devices()) == 4, jax.devices()
    h, w, t, valid, g_lp, g_ent = _inputs()

    def plain(h, w, t, valid):
        return lp.token_logprobs(h, w, t,
                                 lp.kernel_config(temperature=TEMPERATURE, with_entropy=True, impl="reference"),
                                 valid_n=valid)

    want = _run(plain, h, w, t, valid, g_lp, g_ent)
    failures = []
    meshes = {
        "tensor4": (Mesh(np.array(jax.devices()), ("tensor",)), None),
        "data2xtensor2": (Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "tensor")), "data"),
    }
    # JAX's Pallas interpreter cannot evaluate a kernel on vma-typed (check_vma=True)
    # values, so the interpreted kernels run with check_vma=False; the compiled kernels
    # are lowered below with check_vma=True.
    impls = {
        "reference": {},
        "chunked": {"block_n": 8, "block_v": 32},
        "pallas_tpu": {"impl": "pallas", "check_vma": False, "block_n": 8, "block_v": 128, "pallas_variant": "mosaic_tpu"},
        "pallas_triton": {"impl": "pallas", "check_vma": False, "block_n": 16, "block_v": 128, "block_d": 16,
                              "pallas_variant": "triton"},
    }
    for mesh_name, (mesh, rows) in meshes.items():
        for name, kw in impls.items():
            kw = dict(kw)
            got = _run(_sharded(mesh, rows, kw.pop("impl", name), **kw), h, w, t, valid, g_lp, g_ent)
            for what, a, b in zip(("logp", "entropy", "dh", "dw"), got, want):
                err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)
                ok = np.all(np.isfinite(a)) and err <= 1e-5
                print(f"{mesh_name:14s} {name:13s} {what:8s} rel err {err:.2e} {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append((mesh_name, name, what))
        for variant, platform, marker in (("mosaic_tpu", "tpu", "tpu_custom_call"),
                                          ("triton", "cuda", "__gpu$xla.gpu.triton")):
            sharded = _sharded(mesh, rows, "pallas", interpret=False, pallas_variant=variant)
            loss = functools.partial(_loss, sharded, t=t, valid=valid, g_lp=g_lp, g_ent=g_ent)
            grad = jax.jit(jax.grad(lambda h, w, loss=loss: loss(h=h, w=w)[0], (0, 1)))
            text = grad.trace(h, w).lower(lowering_platforms=(platform,)).as_text()
            ok = text.count(marker) == 3
            print(f"{mesh_name:14s} {variant:13s} lowers for {platform} under shard_map {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append((mesh_name, variant, "lowering"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
