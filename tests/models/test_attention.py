"""Fused attention (cuDNN call, Pallas splash) equals the plain reference; accelerator
programs lower to the fused kernels with no `[T, T]` tensor."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax._src.cudnn import fused_attention_stablehlo

from pipo_jax.models import attention, qwen3
from tests import jitted

B, T, H, K, DH = 3, 20, 4, 2, 16  # GQA: 2 query heads per kv head
# Left padding, none, right padding, as the trainer's rows and the engine's prompts have.
VALID = np.array([[0] * 5 + [1] * 15, [1] * 20, [1] * 12 + [0] * 8], bool)


@pytest.fixture(scope="module")
def qkv():
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    return (jax.random.normal(ks[0], (B, T, H, DH)), jax.random.normal(ks[1], (B, T, K, DH)),
            jax.random.normal(ks[2], (B, T, K, DH)))


def _reference(q, k, v):
    return attention.reference(q, k, v, attention.causal_padded_mask(jnp.asarray(VALID)), jnp.float32)


FUSED = {
    # What the cuDNN path computes, run by XLA's own attention (no GPU here): the gather of
    # valid tokens to the front, the row lengths and is_causal against the reference mask.
    "cudnn_call_with_xla": lambda q, k, v: attention.cudnn(q, k, v, jnp.asarray(VALID), jnp.float32,
                                                           implementation="xla"),
    "splash_interpret": lambda q, k, v: attention.splash_attention(q, k, v, jnp.asarray(VALID), jnp.float32,
                                                                   interpret=True),
}


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_attention_equals_reference_on_valid_rows(qkv, name):
    got = np.asarray(jax.jit(FUSED[name])(*qkv))
    want = np.asarray(jax.jit(_reference)(*qkv))
    # fp32 softmax-weighted sums of O(1) values: only summation order differs (~1e-7).
    np.testing.assert_allclose(got[VALID], want[VALID], atol=2e-6, rtol=1e-5)
    assert np.all(got[~VALID] == 0)  # padding queries: zeros, never NaN


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_attention_gradients_equal_reference(qkv, name):
    g = jax.random.normal(jax.random.PRNGKey(5), (B, T, H, DH)) * VALID[:, :, None, None]

    def loss(fn):
        return lambda q, k, v: jnp.sum(g * fn(q, k, v))

    got = jax.jit(jax.grad(loss(FUSED[name]), (0, 1, 2)))(*qkv)
    want = jax.jit(jax.grad(loss(_reference), (0, 1, 2)))(*qkv)
    for a, b in zip(got, want):
        # Backward through the softmax: sums over 20 keys x 2 heads, fp32 (~1e-6 relative).
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_resolve_impl_by_target_platform():
    assert attention.resolve_impl("auto", "tpu", jnp.float32) == "splash"
    assert attention.resolve_impl("auto", "cuda", jnp.bfloat16) == "cudnn"
    assert attention.resolve_impl("auto", "cuda", jnp.float32) == "xla"  # cuDNN flash takes 16-bit inputs
    assert attention.resolve_impl("auto", "cpu", jnp.bfloat16) == "xla"
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        attention.resolve_impl("flash", "tpu", jnp.float32)
    with pytest.raises(ValueError, match="Qwen3Config.platform='gpu'"):
        qwen3.preset("tiny", platform="gpu")


def test_forward_with_splash_equals_xla_forward():
    """The whole model with the splash kernel (interpreted) on left / right padded rows and
    explicit positions gives the XLA forward's logits on every valid token."""
    config = qwen3.preset("tiny")
    params = qwen3.init_params(config, jax.random.PRNGKey(0), std=0.1)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, config.vocab_size)
    mask = jnp.asarray(VALID, jnp.int32)
    positions = qwen3.default_positions(mask) + jnp.array([[0], [3], [7]])  # rows start at other offsets
    want = jitted.forward(config, params, tokens, mask, positions)[0]
    got = jitted.forward(config.replace(attention_impl="splash"), params, tokens, mask, positions)[0]
    # Logits of a 2-layer model, fp32: attention differences of ~1e-7 grow by the head (~1e-5).
    np.testing.assert_allclose(np.asarray(got)[VALID], np.asarray(want)[VALID], atol=5e-5)


def _square_tensors(text: str, t: int) -> list[str]:
    """Tensor types in StableHLO text with two dims of size `t` (a `[T, T]` score tensor)."""
    return [m for m in re.findall(r"tensor<([0-9x]+)x[a-z0-9]+>", text) if m.split("x").count(str(t)) >= 2]


def _model_grad_text(config, platform, t=256):
    params = jax.eval_shape(lambda: qwen3.init_params(config, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((2, t), jnp.int32)

    def loss(params, tokens):
        mask = (tokens > 0).astype(jnp.int32)
        return jnp.sum(qwen3.hidden_states(config, params, tokens, mask).astype(jnp.float32))

    fn = jax.jit(jax.grad(loss))
    disabled = [export.DisabledSafetyCheck.custom_call(n) for n in ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")]
    return export.export(fn, platforms=(platform,), disabled_checks=disabled)(params, tokens).mlir_module()


def test_tpu_program_uses_mosaic_splash_and_no_square_scores():
    config = qwen3.preset("tiny", dtype="bfloat16", platform="tpu")
    text = _model_grad_text(config, "tpu")
    # Per layer: forward, dq and dkv splash kernels (the layers are one scan: one copy each).
    assert text.count("tpu_custom_call") == 3
    assert "interpret" not in text.lower() and not _square_tensors(text, 256)


def test_cuda_program_uses_cudnn_flash_and_no_square_scores(monkeypatch):
    # jax checks for an installed cuDNN library before lowering; none is on this host, and the
    # exported program does not depend on the host's library version.
    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90800)
    config = qwen3.preset("tiny", dtype="bfloat16", platform="cuda")
    text = _model_grad_text(config, "cuda")
    assert "@__cudnn$fmhaSoftmax(" in text and "@__cudnn$fmhaSoftmaxBackward(" in text
    assert not _square_tensors(text, 256)


def test_cpu_program_keeps_the_reference():
    text = _model_grad_text(qwen3.preset("tiny"), "cpu")
    assert _square_tensors(text, 256)  # the XLA reference: [B, K, G, T, T] scores


# Every length the trainer produces: odd (the micro preset's T = 11, VPD's teacher context
# T = 23) and a multiple of the cuDNN padding.
LENGTHS = (11, 23, 64)


def _odd_case(t):
    ks = jax.random.split(jax.random.PRNGKey(t), 4)
    q, k, v = (jax.random.normal(ks[0], (B, t, H, DH)), jax.random.normal(ks[1], (B, t, K, DH)),
               jax.random.normal(ks[2], (B, t, K, DH)))
    # Left padding, none, right padding, as in VALID.
    valid = np.array([[0] * 3 + [1] * (t - 3), [1] * t, [1] * (t - 4) + [0] * 4], bool)
    g = jax.random.normal(ks[3], (B, t, H, DH)) * valid[:, :, None, None]
    return (q, k, v), valid, g


@pytest.mark.parametrize("t", LENGTHS)
def test_cudnn_padding_to_its_length_equals_the_unpadded_reference(t):
    """The cuDNN path pads rows to `cudnn_length(t)` and slices back; run by XLA's attention
    (the same call, padding and lengths), it equals the reference on the unpadded rows:
    values and gradients, so the padded keys are masked out and get no gradient."""
    assert attention.cudnn_length(t) == 64
    (q, k, v), valid, g = _odd_case(t)
    fused = lambda q, k, v: attention.cudnn(q, k, v, jnp.asarray(valid), jnp.float32,  # noqa: E731
                                            implementation="xla")
    ref = lambda q, k, v: attention.reference(q, k, v, attention.causal_padded_mask(jnp.asarray(valid)),  # noqa: E731
                                              jnp.float32)
    got, want = np.asarray(jax.jit(fused)(q, k, v)), np.asarray(jax.jit(ref)(q, k, v))
    np.testing.assert_allclose(got[valid], want[valid], atol=2e-6, rtol=1e-5)
    assert np.all(got[~valid] == 0)
    grads = [jax.jit(jax.grad(lambda q, k, v, fn=fn: jnp.sum(g * fn(q, k, v)), (0, 1, 2)))(q, k, v) for fn in (fused, ref)]
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("t", LENGTHS)
def test_cudnn_forward_and_backward_export_for_cuda_at_any_length(monkeypatch, t):
    """jax's cuDNN training path refuses odd lengths ("Unsupported sequence length Q 11, KV 11"):
    the padded call exports for `cuda` in bf16, forward and backward, with the kernel at the
    padded length (`[B, 64, H, Dh]` operands)."""
    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90800)
    q = jax.ShapeDtypeStruct((2, t, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, t, 2, 128), jnp.bfloat16)
    valid = jax.ShapeDtypeStruct((2, t), jnp.bool_)
    fwd = lambda q, k, v, m: attention.cudnn(q, k, v, m, jnp.bfloat16)  # noqa: E731
    bwd = jax.grad(lambda q, k, v, m: jnp.sum(fwd(q, k, v, m).astype(jnp.float32)), (0, 1, 2))
    disabled = [export.DisabledSafetyCheck.custom_call(n) for n in ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")]
    for fn, calls in ((fwd, ("@__cudnn$fmhaSoftmax(",)),
                      (bwd, ("@__cudnn$fmhaSoftmax(", "@__cudnn$fmhaSoftmaxBackward("))):
        text = export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=disabled)(q, kv, kv, valid).mlir_module()
        for call in calls:
            assert call in text
        assert "tensor<2x64x4x128xbf16>" in text


def test_splash_on_a_gpu_target_runs_interpreted_without_square_scores():
    """The readiness report's GPU target (splash in place of cuDNN flash): the cuda program with the
    splash kernel lowers through the Pallas interpreter (Mosaic is TPU-only), so XLA:CPU compiles
    it, block-wise (`SPLASH_BLOCK` tiles): no `[T, T]` scores and no Mosaic call."""
    config = qwen3.preset("tiny", dtype="bfloat16", platform="cuda").replace(attention_impl="splash")
    t = 2 * attention.SPLASH_BLOCK
    text = _model_grad_text(config, "cpu", t)
    assert "tpu_custom_call" not in text and "cudnn" not in text
    assert not _square_tensors(text, t) and _square_tensors(text, attention.SPLASH_BLOCK)
