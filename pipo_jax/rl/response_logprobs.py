"""Per-token log-probs of response tokens: the one place the trainer turns params into log p(y_t).

A row of the batch is `prompt (left-padded, width P) ++ response (right-padded, width R)`;
the hidden state at position `P - 1 + t` predicts response token `t`. The LM head goes
through the fused kernel (`pipo_jax.kernels.logprobs.token_logprobs`), so no `[B, R, V]`
logits are materialised unless a caller asks for the full distribution (SDPO's JSD).
Traced inside a tensor-parallel `sharding_context` (the trainer on a mesh), the kernel
runs vocab-parallel under `shard_map` (`pipo_jax.kernels.logprobs_sharded`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pipo_jax.kernels.logprobs import kernel_config
from pipo_jax.kernels.logprobs_sharded import token_logprobs
from pipo_jax.models import qwen3


def response_hidden(model: qwen3.Qwen3Config, params, tokens_bl, mask_bl, prompt_len: int):
    """Final hidden states that predict the response tokens, `[B, R, D]`."""
    hidden_bld, _ = qwen3.forward(model, params, tokens_bl, mask_bl, return_hidden=True)
    return hidden_bld[:, prompt_len - 1 : -1]


def response_logprobs(model: qwen3.Qwen3Config, params, tokens_bl, mask_bl, prompt_len: int, *,
                      temperature: float = 1.0, impl: str = "auto", with_entropy: bool = False):
    """log p(y_t) `[B, R]` float32 of the response tokens at `temperature` (and entropy `[B, R]`).

    Padding positions (mask 0) return 0 and carry no gradient.
    """
    hidden_brd = response_hidden(model, params, tokens_bl, mask_bl, prompt_len)
    b, r, d = hidden_brd.shape
    targets_n = tokens_bl[:, prompt_len:].reshape(-1)
    valid_n = mask_bl[:, prompt_len:].reshape(-1).astype(bool)
    cfg = kernel_config(impl=impl, temperature=temperature, with_entropy=with_entropy, platform=model.platform)
    out = token_logprobs(hidden_brd.reshape(b * r, d), qwen3.lm_head_weight(model, params).astype(hidden_brd.dtype),
                         targets_n, cfg, valid_n=valid_n)
    if with_entropy:
        return out[0].reshape(b, r), out[1].reshape(b, r)
    return out.reshape(b, r), None


def response_log_softmax(model: qwen3.Qwen3Config, params, tokens_bl, mask_bl, prompt_len: int, *,
                         temperature: float = 1.0):
    """Full log-distributions `[B, R, V]` float32 over the vocabulary (SDPO's top-k JSD needs them)."""
    hidden_brd = response_hidden(model, params, tokens_bl, mask_bl, prompt_len)
    w = qwen3.lm_head_weight(model, params).astype(hidden_brd.dtype)
    logits = jnp.einsum("brd,dv->brv", hidden_brd, w, preferred_element_type=jnp.float32) / temperature
    return jax.nn.log_softmax(logits, axis=-1)
