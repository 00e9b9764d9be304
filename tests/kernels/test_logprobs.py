"""Fused log-prob kernels: chunked XLA and Pallas (interpret mode) equal the fp32 reference.

Tolerances. fp32 inputs: values rtol 1e-5, gradients max|diff| <= 1e-5 * max|ref|.
bf16 inputs (fp32 accumulation): values within 1e-5 absolute of the reference on the
same bf16 inputs (only the summation order differs); gradients max|diff| <= 1e-2 *
max|ref| (the Pallas backward feeds the logits cotangent to its matmuls in bf16, and
the gradients themselves are bf16: 2^-8 relative rounding; measured <= 4.1e-3).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import logprobs as lp

# (N, D, V, block_n, block_v): ragged tails on both axes, V = 128 k + odd remainder
# (the structure of Qwen3's 151,936 = 128 x 1187 against blocks that do not divide it).
CHUNKED_SHAPES = [
    (37, 16, 128 * 3 + 5, 8, 128),
    (64, 24, 128 * 7 + 3, 64, 256),
    (5, 8, 77, 16, 128),  # block_n > N and block_v > V
]
# Pallas interpret mode is slow: small shapes. Triton needs power-of-two blocks >= 16.
PALLAS_CASES = [
    ("mosaic_tpu", 21, 32, 128 * 2 + 7, {"block_n": 8, "block_v": 128}),
    ("triton", 21, 32, 128 * 2 + 7, {"block_n": 16, "block_v": 128, "block_d": 16}),
]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))  # one program, not one per draw
def _inputs(n, d, v, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    h = jax.random.normal(k[0], (n, d), jnp.float32).astype(dtype)
    w = (jax.random.normal(k[1], (d, v), jnp.float32) * 0.5).astype(dtype)
    t = jax.random.randint(k[2], (n,), 0, v)
    g_lp = jax.random.normal(k[3], (n,))
    g_ent = jax.random.normal(k[4], (n,))
    return h, w, t, g_lp, g_ent


def _value_and_grads(h, w, t, g_lp, g_ent, *, impl, temperature=1.0, entropy=True, valid=None, **kw):
    """(logp, entropy, dh, dw) for the loss sum(g_lp * logp) + sum(g_ent * entropy)."""

    def loss(h, w):
        out = lp.token_logprobs(h, w, t,
                                lp.kernel_config(temperature=temperature, with_entropy=entropy, impl=impl, **kw),
                                valid_n=valid)
        logp, ent = out if entropy else (out, jnp.zeros_like(out))
        return jnp.sum(g_lp * logp) + jnp.sum(g_ent * ent), (logp, ent)

    (_, (logp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(h, w)
    return logp, ent, dh, dw


def _assert_grad_close(got, want, rel):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.all(np.isfinite(got))
    scale = np.max(np.abs(want))
    assert scale > 0
    err = np.max(np.abs(got - want)) / scale
    assert err <= rel, f"max|diff| / max|ref| = {err:.3g} > {rel}"


def _assert_matches_reference(got, want, *, values_rtol=1e-5, values_atol=1e-6, grad_rel=1e-5):
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=values_rtol, atol=values_atol)
    for a, b in zip(got[2:], want[2:]):
        _assert_grad_close(a, b, grad_rel)


# --- the reference itself against hand-computed numbers --------------------------------


def test_reference_matches_hand_computed_softmax():
    h = jnp.array([[1.0, 0.0], [0.0, 2.0]])
    w = jnp.array([[1.0, 2.0, 3.0], [0.5, 0.0, -0.5]])
    t = jnp.array([2, 0])
    logp, ent = lp.token_logprobs(h, w, t, lp.kernel_config(temperature=2.0, with_entropy=True, impl="reference"))
    z = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, -1.0]]) / 2.0
    log_z = np.log(np.exp(z).sum(1))
    p = np.exp(z - log_z[:, None])
    np.testing.assert_allclose(logp, [z[0, 2] - log_z[0], z[1, 0] - log_z[1]], rtol=1e-6)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(1), rtol=1e-6)
    # d logp_0 / d h_0 = w[:, t] / T - sum_v p_v w[:, v] / T
    dh = jax.grad(lambda h: lp.token_logprobs(h, w, t, lp.kernel_config(temperature=2.0, impl="reference"))[0])(h)
    np.testing.assert_allclose(dh[0], (w[:, 2] - (np.asarray(w) * p[0]).sum(1)) / 2.0, rtol=1e-6)


# --- chunked ------------------------------------------------------------------------------


@pytest.mark.parametrize("n,d,v,block_n,block_v", CHUNKED_SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_reference_fp32(n, d, v, block_n, block_v, temperature):
    args = _inputs(n, d, v)
    want = _value_and_grads(*args, impl="reference", temperature=temperature)
    got = _value_and_grads(*args, impl="chunked", temperature=temperature, block_n=block_n, block_v=block_v)
    _assert_matches_reference(got, want)


def test_chunked_without_entropy_equals_reference():
    args = _inputs(37, 16, 389)
    want = _value_and_grads(*args, impl="reference", entropy=False)
    got = _value_and_grads(*args, impl="chunked", entropy=False, block_n=16, block_v=128)
    _assert_matches_reference(got, want)


def test_chunked_bf16_inputs():
    args = _inputs(40, 32, 389, dtype=jnp.bfloat16, seed=1)
    want = _value_and_grads(*args, impl="reference", temperature=0.9)
    got = _value_and_grads(*args, impl="chunked", temperature=0.9, block_n=16, block_v=128)
    assert got[2].dtype == jnp.bfloat16 and got[3].dtype == jnp.bfloat16
    _assert_matches_reference(got, want, values_rtol=0, values_atol=1e-5, grad_rel=1e-2)


def test_chunked_backend_independent_path_equals_reference():
    """The non-CPU code path (bf16 matmuls, direct slicing) traced and run on CPU."""
    h, w, t, g_lp, g_ent = _inputs(40, 32, 389, dtype=jnp.bfloat16, seed=1)
    cfg = lp.KernelConfig("chunked", 1.0, True, 16, 128, xla_cpu=False)

    def loss(h, w):
        lse, zt, ent = lp._softmax_stats(cfg, h, w, t)
        return jnp.sum(g_lp * (zt - lse)) + jnp.sum(g_ent * ent), (zt - lse, ent)

    (_, (logp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(h, w)
    want = _value_and_grads(h, w, t, g_lp, g_ent, impl="reference")
    _assert_matches_reference((logp, ent, dh, dw), want, values_rtol=0, values_atol=1e-5, grad_rel=1e-2)


# --- Pallas (interpret mode on CPU) -------------------------------------------------------


@pytest.mark.parametrize("variant,n,d,v,blocks", PALLAS_CASES)
def test_pallas_equals_reference_fp32(variant, n, d, v, blocks):
    args = _inputs(n, d, v)
    want = _value_and_grads(*args, impl="reference", temperature=0.8)
    got = _value_and_grads(*args, impl="pallas", temperature=0.8, pallas_variant=variant, **blocks)
    _assert_matches_reference(got, want)


@pytest.mark.parametrize("variant,n,d,v,blocks", PALLAS_CASES)
def test_pallas_bf16_inputs(variant, n, d, v, blocks):
    args = _inputs(n, d, v, dtype=jnp.bfloat16, seed=1)
    want = _value_and_grads(*args, impl="reference")
    got = _value_and_grads(*args, impl="pallas", pallas_variant=variant, **blocks)
    _assert_matches_reference(got, want, values_rtol=0, values_atol=1e-5, grad_rel=1e-2)


def test_pallas_without_entropy_equals_reference():
    args = _inputs(21, 32, 263)
    want = _value_and_grads(*args, impl="reference", entropy=False)
    got = _value_and_grads(*args, impl="pallas", entropy=False, block_n=8, block_v=128)
    _assert_matches_reference(got, want)


@pytest.mark.parametrize("variant,platform", [("mosaic_tpu", "tpu"), ("triton", "cuda")])
def test_pallas_kernels_lower_for_hardware(variant, platform):
    """Forward and backward lower through Mosaic (TPU) / Triton (GPU) from this host.

    This checks the kernels against each backend's lowering rules (block shapes, ops);
    it does not compile or run them on the device.
    """
    n, d, v = 300, 256, 128 * 9 + 5

    def loss(h, w, t, g):
        logp, ent = lp.token_logprobs(h, w, t,
                                      lp.kernel_config(with_entropy=True, impl="pallas", interpret=False,
                                                       pallas_variant=variant, temperature=0.8))
        return jnp.sum(g * logp) + jnp.sum(ent)

    args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, v), jnp.bfloat16),
            jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32))
    text = jax.jit(jax.grad(loss, (0, 1))).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    marker = "tpu_custom_call" if platform == "tpu" else "__gpu$xla.gpu.triton"
    assert text.count(marker) == 3  # forward, dh, dw kernels


@pytest.mark.parametrize("impl,variant", [("chunked", "auto"), ("pallas", "mosaic_tpu"), ("pallas", "triton")])
def test_primitive_gives_zero_target_logit_outside_vocab(impl, variant):
    """Under vocab parallelism a shard's local target may point past its slice, e.g. into
    the padded columns of the kernels' last vocab block (here 200..255): it must not hit."""
    n, d, v = 16, 16, 200
    h, w, _, g_lp, g_ent = _inputs(n, d, v)
    t = jnp.array([205, -3, 200, 255, 0, 199, 256, 50] * 2, jnp.int32)
    cfg = lp.kernel_config(impl=impl, with_entropy=True, block_n=16, block_v=128, pallas_variant=variant)

    def stats_loss(fn):
        def loss(h, w):
            lse, zt, ent = fn(h, w)
            return jnp.sum(g_lp * zt - g_ent * lse) + jnp.sum(ent), (lse, zt, ent)

        return jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(h, w)

    (_, got), got_grads = stats_loss(lambda h, w: lp._softmax_stats(cfg, h, w, t))
    (_, want), want_grads = stats_loss(lambda h, w: lp._reference_stats(h, w, t, 1.0, True))
    assert np.all(np.asarray(want[1])[np.asarray((t < 0) | (t >= v))] == 0)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        _assert_grad_close(a, b, 1e-5)


def test_triton_default_block_d_divides_hidden_size():
    args = _inputs(16, 48, 140)  # D = 48: block_d = 16
    want = _value_and_grads(*args, impl="reference")
    got = _value_and_grads(*args, impl="pallas", pallas_variant="triton", block_n=16, block_v=64)
    _assert_matches_reference(got, want)


def test_triton_rejects_blocks_it_cannot_tile():
    h, w, t, *_ = _inputs(8, 24, 64)
    with pytest.raises(ValueError, match="block_d"):
        lp.token_logprobs(h, w, t,
                          lp.kernel_config(impl="pallas", pallas_variant="triton", block_n=16, block_v=16, block_d=16))
    with pytest.raises(ValueError, match="power of two"):
        lp.token_logprobs(h, w, t,
                          lp.kernel_config(impl="pallas", pallas_variant="triton", block_n=24, block_v=16, block_d=8))
    with pytest.raises(ValueError, match="multiple of 16"):
        lp.token_logprobs(h, w, t, lp.kernel_config(impl="pallas", pallas_variant="triton", block_n=16, block_v=16))


# --- masking, bad targets, transformations -----------------------------------------------

IMPLS = [
    ("reference", {}),
    ("chunked", {"block_n": 8, "block_v": 64}),
    ("pallas", {"block_n": 8, "block_v": 128}),
]


@pytest.mark.parametrize("impl,blocks", IMPLS)
def test_masked_rows_are_zero_without_nan(impl, blocks):
    h, w, t, g_lp, g_ent = _inputs(12, 16, 200)
    valid = jnp.array([True, False] * 6)
    h = h.at[1].set(jnp.nan).at[3].set(jnp.inf)  # garbage in padding rows must not leak
    t = jnp.where(valid, t, -100)  # and neither may an ignore-index target
    logp, ent, dh, dw = _value_and_grads(h, w, t, g_lp, g_ent, impl=impl, valid=valid, temperature=0.9, **blocks)
    for x in (logp, ent, dh, dw):
        assert np.all(np.isfinite(np.asarray(x)))
    np.testing.assert_array_equal(np.asarray(logp)[1::2], 0.0)
    np.testing.assert_array_equal(np.asarray(ent)[1::2], 0.0)
    np.testing.assert_array_equal(np.asarray(dh)[1::2], 0.0)
    # Valid rows equal the reference on the valid rows alone (dw included).
    keep = np.arange(0, 12, 2)
    want = _value_and_grads(h[keep], w, t[keep], g_lp[keep], g_ent[keep], impl="reference", temperature=0.9)
    _assert_matches_reference((logp[keep], ent[keep], dh[keep], dw), want)


@pytest.mark.parametrize("impl,blocks", IMPLS)
def test_fully_masked_batch_gives_zeros(impl, blocks):
    h, w, t, g_lp, g_ent = _inputs(8, 16, 200)
    valid = jnp.zeros((8,), bool)
    logp, ent, dh, dw = _value_and_grads(h, w, t, g_lp, g_ent, impl=impl, valid=valid, **blocks)
    for x in (logp, ent, dh, dw):
        np.testing.assert_array_equal(np.asarray(x), 0.0)


def test_out_of_vocab_target_raises_eagerly_and_is_nan_under_jit():
    h, w, t, *_ = _inputs(6, 8, 50)
    bad = t.at[2].set(50)
    with pytest.raises(ValueError, match=r"targets_n\[2\] = 50"):
        lp.token_logprobs(h, w, bad, lp.kernel_config(impl="chunked"))
    # Masked rows may hold any target.
    lp.token_logprobs(h, w, bad, lp.kernel_config(impl="chunked"), valid_n=jnp.arange(6) != 2)
    for impl in ("reference", "chunked"):
        out = np.asarray(jax.jit(functools.partial(lp.token_logprobs, cfg=lp.kernel_config(impl=impl)))(h, w, bad))
        assert np.isnan(out[2]) and np.all(np.isfinite(np.delete(out, 2)))


@pytest.mark.parametrize("impl,blocks", IMPLS[1:])
def test_jit_and_vmap_match_eager_reference(impl, blocks):
    b, n, d, v = 3, 10, 16, 150
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    h_bnd = jax.random.normal(k[0], (b, n, d))
    w = jax.random.normal(k[1], (d, v)) * 0.5
    t_bn = jax.random.randint(k[2], (b, n), 0, v)
    cfg = lp.kernel_config(temperature=0.8, with_entropy=True, impl=impl, **blocks)
    f = functools.partial(lp.token_logprobs, cfg=cfg)
    logp, ent = jax.jit(jax.vmap(f, in_axes=(0, None, 0)))(h_bnd, w, t_bn)
    for i in range(b):
        want = lp.token_logprobs(h_bnd[i], w, t_bn[i],
                                 lp.kernel_config(temperature=0.8, with_entropy=True, impl="reference"))
        np.testing.assert_allclose(logp[i], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ent[i], want[1], rtol=1e-5, atol=1e-6)


def _ppo_loss(h, w, t, logp_old, adv, valid, impl, **blocks):
    """Clipped PPO surrogate (token-mean) with an entropy bonus, as the trainer builds it."""
    logp, ent = lp.token_logprobs(h, w, t, lp.kernel_config(with_entropy=True, impl=impl, **blocks), valid_n=valid)
    ratio = jnp.exp(logp - logp_old)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.28) * adv)
    per_token = -surrogate - 0.01 * ent
    return jnp.sum(jnp.where(valid, per_token, 0.0)) / jnp.sum(valid)


@pytest.mark.parametrize("impl,blocks", IMPLS[1:])
def test_grad_of_ppo_loss_matches_reference(impl, blocks):
    h, w, t, g_lp, g_ent = _inputs(16, 16, 200, seed=4)
    valid = jnp.arange(16) < 13
    # Old log-probs near the current ones so that some ratios are clipped and some not.
    logp_now = lp.token_logprobs(h, w, t, lp.kernel_config(impl="reference"))
    logp_old = logp_now + 0.3 * g_lp
    adv = g_ent
    grad = jax.jit(jax.grad(_ppo_loss, (0, 1)), static_argnums=(6,), static_argnames=tuple(blocks))
    want = grad(h, w, t, logp_old, adv, valid, "reference")
    got = grad(h, w, t, logp_old, adv, valid, impl, **blocks)
    clipped = np.abs(np.exp(np.asarray(logp_now - logp_old)) - 1.04) > 0.24
    assert 0 < clipped[:13].sum() < 13  # both branches of the clip are exercised
    for a, b in zip(got, want):
        _assert_grad_close(a, b, 1e-5)


def test_chunked_is_deterministic_and_block_size_invariant():
    args = _inputs(37, 16, 389)
    first = _value_and_grads(*args, impl="chunked", block_n=8, block_v=64)
    second = _value_and_grads(*args, impl="chunked", block_n=8, block_v=64)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = _value_and_grads(*args, impl="chunked", block_n=32, block_v=100)
    _assert_matches_reference(other, first)


def test_chunked_compiles_without_full_logits():
    """No [N, V] buffer in the compiled forward+backward, and far less scratch than the reference."""
    n, d, v = 512, 64, 128 * 40 + 7

    def grad_fn(impl):
        def loss(h, w, t):
            logp, ent = lp.token_logprobs(h, w, t,
                                          lp.kernel_config(with_entropy=True, impl=impl, block_n=128, block_v=512))
            return jnp.sum(logp) + jnp.sum(ent)

        args = (jax.ShapeDtypeStruct((n, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
                jax.ShapeDtypeStruct((n,), jnp.int32))
        return jax.jit(jax.grad(loss, (0, 1))).lower(*args).compile()

    chunked, reference = grad_fn("chunked"), grad_fn("reference")
    assert f"f32[{n},{v}]" not in chunked.as_text()
    assert f"f32[{n},{v}]" in reference.as_text()
    ratio = chunked.memory_analysis().temp_size_in_bytes / reference.memory_analysis().temp_size_in_bytes
    assert ratio < 0.25, ratio


# --- argument errors ---------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors():
    h, w, t, *_ = _inputs(4, 8, 20)
    with pytest.raises(ValueError, match="impl"):
        lp.token_logprobs(h, w, t, lp.kernel_config(impl="fast"))
    with pytest.raises(ValueError, match="temperature"):
        lp.token_logprobs(h, w, t, lp.kernel_config(temperature=0.0))
    with pytest.raises(TypeError, match="static Python float"):
        jax.jit(lambda temp: lp.token_logprobs(h, w, t, lp.kernel_config(temperature=temp)))(1.0)
    with pytest.raises(ValueError, match="w_dv"):
        lp.token_logprobs(h, w.T, t)
    with pytest.raises(ValueError, match="targets_n"):
        lp.token_logprobs(h, w, t[:3])
    with pytest.raises(ValueError, match="valid_n"):
        lp.token_logprobs(h, w, t, valid_n=jnp.ones((3,), bool))
    with pytest.raises(ValueError, match="block_v"):
        lp.token_logprobs(h, w, t, lp.kernel_config(impl="chunked", block_v=0))
    with pytest.raises(ValueError, match="pallas_variant"):
        lp.token_logprobs(h, w, t, lp.kernel_config(impl="pallas", pallas_variant="mosaic_gpu"))


def test_auto_selects_chunked():
    assert lp._resolve_impl("auto") == "chunked"
