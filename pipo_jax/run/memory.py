"""A batch too large for the machine, refused at start-up in one line naming the key.

`batch_memory_bytes` is a lower bound of what one iteration's rollout holds at once: the rollout
arrays of the whole batch (token ids, mask, behaviour and reference log-probs: 4 bytes each per
token) and the KV cache of one generation pass (2 x layers x rows x tokens x kv heads x head dim
in the compute dtype). Weights, optimizer state, activations and logits come on top, so a batch
refused here could never run; one accepted may still not fit. `check_batch_memory` compares it
with the memory of the devices (accelerators: their `bytes_limit`; CPU: the host's RAM) before
the run writes anything.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from pipo_jax.config.sections import ConfigError
from pipo_jax.rl.spec import TrainSpec

ROLLOUT_BYTES_PER_TOKEN = 4 * 4  # int32 token id, float32 mask, behaviour and reference log-probs


def _gib(n: float) -> str:
    return f"{n / 2**40:.1f} TiB" if n >= 2**40 else f"{n / 2**30:.1f} GiB"


def generation_rows(spec: TrainSpec) -> int:
    """Sequences one iteration generates (dynamic sampling: one generation batch)."""
    prompts = max(spec.rollout.prompts_per_batch, spec.dapo.gen_prompts_per_batch or 0)
    return prompts * spec.rollout.group_size


def kv_cache_rows(spec: TrainSpec, n_devices: int) -> int:
    """Rows whose KV cache is live at once: one generation pass (or the slots engine's slots)."""
    rows = generation_rows(spec)
    r = spec.rollout
    if r.engine == "slots" and r.engine_slots:
        return min(rows, r.engine_slots)
    if r.generate_rows_per_device:
        return min(rows, r.generate_rows_per_device * n_devices)
    return rows


def batch_memory_bytes(spec: TrainSpec, n_devices: int = 1) -> int:
    """A lower bound of the bytes one iteration's rollout holds (module docstring)."""
    m = spec.model
    tokens = spec.prompt_len + spec.rollout.max_new_tokens
    rollout = generation_rows(spec) * tokens * ROLLOUT_BYTES_PER_TOKEN
    kv = (2 * m.num_hidden_layers * kv_cache_rows(spec, n_devices) * tokens * m.num_key_value_heads * m.head_dim
          * np.dtype(m.dtype).itemsize)
    return int(rollout + kv)


def available_memory() -> tuple[int, str]:
    """(bytes, what): the memory of every device of the job (accelerators), or of the hosts (CPU)."""
    local = jax.local_devices()
    limits = [(d.memory_stats() or {}).get("bytes_limit") if d.platform != "cpu" else None for d in local]
    if limits and all(limits):
        return int(sum(limits)) * jax.process_count(), f"{jax.device_count()} {local[0].platform} device(s)"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(host) * jax.process_count(), f"{jax.process_count()} host(s)' RAM"


def check_batch_memory(spec: TrainSpec, available: tuple[int, str] | None = None) -> None:
    """Raises `ConfigError` naming `rollout.prompts_per_batch` when the batch's lower bound exceeds
    the machine's memory (`available`: default `available_memory()`)."""
    have, what = available or available_memory()
    need = batch_memory_bytes(spec, jax.device_count())
    if need <= have:
        return
    r = spec.rollout
    raise ConfigError(
        f"config.rollout.prompts_per_batch={r.prompts_per_batch}: a batch of {generation_rows(spec)} sequences x "
        f"{spec.prompt_len + r.max_new_tokens} tokens needs at least {_gib(need)} for the rollout arrays and the KV "
        f"cache, more than the {_gib(have)} of {what}; lower rollout.prompts_per_batch (or rollout.group_size, "
        "rollout.max_new_tokens, rollout.generate_rows_per_device)")
