"""A slot generation engine: prefill / insert / generate over decode slots, on one device.

Its calls are shaped like the decode half of JetStream's `Engine` (the package is not
used): `load_params`, `prefill(params, tokens, true_length, rng) -> Prefix`,
`insert(prefix, decode_state, slot) -> DecodeState`,
`generate(params, decode_state) -> (DecodeState, ResultTokens)` stepping every slot
once, `init_decode_state()`, `free_resource(slot)`, `max_concurrent_decodes`. It is not
JetStream's Engine API: it has none of its mesh, sharding, tokenizer or prefix-destination
members and runs on one device. The trainer reaches it through the rollout interface
(`sampling/generator.py:SlotEngineSampler`, `rollout.engine=slots`, driven by
`continuous_batching.rollout`); `experiments/serving.py` puts it behind JetStream's own
`engine_api.Engine` to serve a policy through JetStream's server (`experiments/serve.py`).

* Prompts are **right-padded** to a prefill bucket (`prefill_buckets`) and described by
  `true_length`, as in JetStream; the KV of prompt token j sits at cache slot j.
* `DecodeState` is a pytree of device arrays; `insert` and `generate` are jitted with
  the state donated, so the KV cache is updated in place.
* The cache (a `qwen3.KVCache`, layers stacked) is as wide as the attention
  window currently needed, one of the ladder `cache_widths` (up to `max_len`):
  `generate` reads all of it, and the driver `resize`s the state when the longest
  running request crosses a width (or when it finished and the rest are short).
* Sampling is per request: a `Prefix` carries its request key, and the slot draws its
  response token i from `fold_in(key, i)` (see `token_sampling`). A request therefore
  gets the same tokens whatever slot it lands in and whoever shares the batch; with the
  same keys it reproduces `sampler.generate` row by row.
* `free_resource` / `free_slots` are host-side slot bookkeeping for the driver
  (`continuous_batching`); device state never needs clearing: a slot's stale cache
  entries beyond a new prompt are overwritten before any query can read them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.models.qwen3 import KVCache, Params, Qwen3Config
from pipo_jax.sampling import decode
from pipo_jax.sampling.sampler import DEFAULT_ATTN_BLOCK, attention_lengths
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.sampling.token_sampling import is_stop_token, sample_tokens


class Prefix(NamedTuple):
    """A prefilled request, ready to `insert` (scalars are 0-d arrays)."""

    cache: KVCache  # batch 1, width = the prefill bucket
    length: jax.Array  # int32: true prompt length
    logits_v: jax.Array  # float32 [V]: next-token logits after the prompt
    token: jax.Array  # int32: first sampled token (response index 0)
    logprob: jax.Array  # float32: its log-prob (SamplingParams.logprobs)
    key: jax.Array  # typed PRNG key of the request
    budget: jax.Array  # int32: max new tokens of the request
    done: jax.Array  # bool: the first token already ended the request


class DecodeState(NamedTuple):
    """All decode slots (`S = max_concurrent_decodes`); a pytree of device arrays."""

    cache: KVCache  # batch S, width one of Engine.cache_widths
    tokens_s: jax.Array  # int32 [S]: last sampled token, fed at the next step
    positions_s: jax.Array  # int32 [S]: cache slot / position of tokens_s
    keys_s: jax.Array  # typed keys [S]
    generated_s: jax.Array  # int32 [S]: tokens sampled so far (= next response index)
    budget_s: jax.Array  # int32 [S]: max new tokens
    done_s: jax.Array  # bool [S]: finished or empty

    def kv_cache(self) -> KVCache:
        """The cache `[layers, S, kv_heads, width, head_dim]`."""
        return self.cache


class ResultTokens(NamedTuple):
    """What one `generate` step produced, per slot `[S]`."""

    tokens_s: jax.Array  # int32: the new token (pad_id where not valid)
    logprobs_s: jax.Array  # float32: its log-prob (0 where not valid)
    valid_s: jax.Array  # bool: the slot was decoding and produced a token
    done_s: jax.Array  # bool: the slot's request is finished (after this step)
    lengths_s: jax.Array  # int32: tokens generated so far by the slot's request


class EngineParams(NamedTuple):
    """`Engine.load_params` output: the parameters in the compute dtype (`decode.compute_params`)."""

    weights: Params


class Engine:
    """Prefill / insert / generate over `max_concurrent_decodes` slots of `max_len` positions.

    Args:
      config: the Qwen3 model.
      sampling: sampling settings for every request (static; `max_new_tokens` is the
        default per-request budget).
      max_concurrent_decodes: number of decode slots.
      max_len: cache positions per slot; a request needs `prompt + budget - 1 <= max_len`.
      prefill_buckets: padded prompt widths (ascending); default powers of two from 16.
      cache_dtype: KV-cache dtype (default the compute dtype).
      attn_block: granularity of the cache-width ladder (see `attention_lengths`).
      steps_per_call: decode steps `generate_steps` runs in one program (one host round
        trip for several steps, as vLLM's multi-step scheduling; `generate` is one step).
    """

    def __init__(
        self,
        config: Qwen3Config,
        sampling: SamplingParams,
        max_concurrent_decodes: int,
        max_len: int,
        prefill_buckets: tuple[int, ...] | None = None,
        cache_dtype=None,
        attn_block: int = DEFAULT_ATTN_BLOCK,
        steps_per_call: int = 1,
    ):
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call={steps_per_call} must be >= 1")
        if max_concurrent_decodes < 1:
            raise ValueError(f"max_concurrent_decodes={max_concurrent_decodes} must be >= 1")
        if max_len < 2:
            raise ValueError(f"max_len={max_len} must be >= 2")
        sampling.validate_vocab(config.vocab_size)
        if prefill_buckets is None:
            prefill_buckets = tuple(w for w in (16 << i for i in range(20)) if w < max_len) + (max_len,)
        prefill_buckets = tuple(int(w) for w in prefill_buckets)
        if list(prefill_buckets) != sorted(set(prefill_buckets)) or prefill_buckets[0] < 1 or prefill_buckets[-1] > max_len:
            raise ValueError(f"prefill_buckets={prefill_buckets} must be ascending, distinct, in [1, max_len={max_len}]")
        self.config = config
        self.sampling = sampling
        self.max_len = max_len
        self.prefill_buckets = prefill_buckets
        self.cache_dtype = cache_dtype
        self.cache_widths = attention_lengths(1, max_len, attn_block)
        self.steps_per_call = steps_per_call
        self._slots = max_concurrent_decodes
        self._free = set(range(max_concurrent_decodes))
        self._prefill = jax.jit(self._prefill_impl)
        self._resample = jax.jit(self._resample_impl)
        self._insert = jax.jit(self._insert_impl, donate_argnums=(1,))
        self._generate = jax.jit(self._generate_impl, donate_argnums=(1,))
        self._generate_steps = jax.jit(self._generate_steps_impl, donate_argnums=(1,))
        self._resize = jax.jit(self._resize_impl, static_argnums=(1,))  # shapes change: nothing to donate

    # ------------------------------------------------------------------ prefill / insert / generate

    @property
    def max_concurrent_decodes(self) -> int:
        return self._slots

    @property
    def max_prefill_length(self) -> int:
        return self.prefill_buckets[-1]

    def load_params(self, params: Params) -> EngineParams:
        """`params` for the engine (`decode.compute_params` for its slot count): as stored, cast to
        the compute dtype if stored in another."""
        lay_out = jax.jit(decode.compute_params, static_argnums=(0, 2))
        return EngineParams(lay_out(self.config, params, self._slots))

    def init_decode_state(self, width: int | None = None) -> DecodeState:
        """All slots empty (done); a zero cache `width` wide (default the smallest width)."""
        s = self._slots
        width = self.cache_widths[0] if width is None else self._check_width(width)
        return DecodeState(
            cache=decode.init_cache(self.config, s, width, self.cache_dtype),
            tokens_s=jnp.zeros((s,), jnp.int32),
            positions_s=jnp.zeros((s,), jnp.int32),
            keys_s=jax.vmap(jax.random.key)(jnp.zeros((s,), jnp.uint32)),
            generated_s=jnp.zeros((s,), jnp.int32),
            budget_s=jnp.zeros((s,), jnp.int32),
            done_s=jnp.ones((s,), bool),
        )

    def prefill(self, params: EngineParams, tokens, true_length: int, rng: jax.Array,
                max_new_tokens: int | None = None) -> Prefix:
        """Prefills one right-padded prompt and samples its first token with key `rng`.

        Args:
          tokens: int `[bucket]`, a prompt right-padded to one of `prefill_buckets`
            (`pad_to_bucket` does that).
          true_length: number of real tokens (>= 1).
          rng: the request's typed key (or raw uint32 `[2]` key).
          max_new_tokens: this request's budget (default `sampling.max_new_tokens`).
        """
        _check_params(params)
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 1 or tokens.shape[0] not in self.prefill_buckets:
            raise ValueError(f"prefill tokens have shape {tokens.shape}; expected [bucket] with bucket in "
                             f"{self.prefill_buckets} (use Engine.pad_to_bucket)")
        budget = self.sampling.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        self._check_request(int(true_length), budget, tokens.shape[0])
        return self._prefill(params.weights, tokens, jnp.int32(true_length), _typed_key(rng), jnp.int32(budget))

    def resample_prefix(self, prefix: Prefix, rng: jax.Array, max_new_tokens: int | None = None) -> Prefix:
        """The same prompt as another request: first token redrawn with key `rng` (no prefill)."""
        budget = self.sampling.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        length = int(prefix.length)
        self._check_request(length, budget, length)
        return self._resample(prefix, _typed_key(rng), jnp.int32(budget))

    def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
        """Puts a prefilled request into `slot` (donates `decode_state`).

        The state's cache must be at least as wide as the prefix bucket (`resize` first).
        """
        if not 0 <= slot < self._slots:
            raise ValueError(f"slot={slot} is outside [0, {self._slots})")
        if prefix.cache.max_len > decode_state.cache.max_len:
            raise ValueError(f"prefix bucket {prefix.cache.max_len} is wider than the decode cache "
                             f"({decode_state.cache.max_len}); resize the state to width_for({prefix.cache.max_len - 1})")
        self._free.discard(slot)
        return self._insert(prefix, decode_state, jnp.int32(slot))

    def generate(self, params: EngineParams, decode_state: DecodeState) -> tuple[DecodeState, ResultTokens]:
        """One decode step of every slot (donates `decode_state`).

        Every decoding slot's position must be below the cache width (`width_for` and
        `resize` keep it so); idle slots write nothing.
        """
        _check_params(params)
        return self._generate(params.weights, decode_state)

    def generate_steps(self, params: EngineParams, decode_state: DecodeState) -> tuple[DecodeState, ResultTokens]:
        """`steps_per_call` decode steps of every slot in one program (donates `decode_state`):
        each field of the result is `[steps_per_call, S]`, row j being what `generate` would
        return at the j-th step. A slot whose request ends at a step idles for the rest.

        Every position a slot reaches in the call must be below the cache width.
        """
        _check_params(params)
        return self._generate_steps(params.weights, decode_state)

    def resize(self, decode_state: DecodeState, width: int) -> DecodeState:
        """The state with a cache `width` wide (a `cache_widths` entry; donates the state).

        Shrinking drops slots `>= width`: only do it when every decoding slot's position
        is below `width`.
        """
        width = self._check_width(width)
        if width == decode_state.cache.max_len:
            return decode_state
        return self._resize(decode_state, width)

    def free_resource(self, slot: int) -> None:
        """Returns `slot` to the free pool (host-side bookkeeping)."""
        if not 0 <= slot < self._slots:
            raise ValueError(f"slot={slot} is outside [0, {self._slots})")
        self._free.add(slot)

    # ------------------------------------------------------------------ helpers

    def free_slots(self) -> list[int]:
        """Slots not holding a request, ascending."""
        return sorted(self._free)

    def bucket_for(self, length: int) -> int:
        """Smallest prefill bucket that holds `length` tokens."""
        for w in self.prefill_buckets:
            if w >= length:
                return w
        raise ValueError(f"prompt of {length} tokens exceeds the largest prefill bucket {self.prefill_buckets[-1]}")

    def pad_to_bucket(self, prompt) -> tuple[np.ndarray, int]:
        """`(tokens [bucket] right-padded with pad_id, true_length)` of a prompt (int sequence)."""
        prompt = np.asarray(prompt, np.int32).reshape(-1)
        if prompt.size == 0:
            raise ValueError("empty prompt: a request needs at least one token")
        out = np.full((self.bucket_for(prompt.size),), self.sampling.pad_id, np.int32)
        out[: prompt.size] = prompt
        return out, int(prompt.size)

    def width_for(self, max_position: int) -> int:
        """Smallest cache width of the ladder that holds positions `0..max_position`."""
        for w in self.cache_widths:
            if w > max_position:
                return w
        raise ValueError(f"position {max_position} is outside the cache (max_len={self.max_len})")

    def _check_width(self, width: int) -> int:
        if int(width) not in self.cache_widths:
            raise ValueError(f"cache width {width} is not one of Engine.cache_widths={self.cache_widths}")
        return int(width)

    def _check_request(self, length: int, budget: int, bucket: int) -> None:
        if not 1 <= length <= bucket:
            raise ValueError(f"true_length={length} must be in [1, {bucket}] (the padded prompt width)")
        if budget < 1:
            raise ValueError(f"max_new_tokens={budget} must be >= 1")
        if length + budget - 1 > self.max_len:
            raise ValueError(f"prompt of {length} tokens + {budget} new tokens needs {length + budget - 1} cache "
                             f"positions; the engine has max_len={self.max_len}")

    # ------------------------------------------------------------------ jitted bodies

    def _first_token(self, logits_v, key, budget):
        tok, lp = sample_tokens(logits_v[None], key[None], jnp.zeros((1,), jnp.int32), self.sampling)
        done = is_stop_token(tok, self.sampling.stop_token_ids)[0] | (budget <= 1)
        return tok[0], lp[0], done

    def _prefill_impl(self, weights, tokens_p, length, key, budget) -> Prefix:
        mask_1p = (jnp.arange(tokens_p.shape[0]) < length)[None].astype(jnp.int32)
        logits_1v, _, cache = decode.prefill(self.config, weights, tokens_p[None], mask_1p, tokens_p.shape[0],
                                             self.cache_dtype)
        tok, lp, done = self._first_token(logits_1v[0], key, budget)
        return Prefix(cache, length, logits_1v[0], tok, lp, key, budget, done)

    def _resample_impl(self, prefix: Prefix, key, budget) -> Prefix:
        tok, lp, done = self._first_token(prefix.logits_v, key, budget)
        return prefix._replace(token=tok, logprob=lp, key=key, budget=budget, done=done)

    def _insert_impl(self, prefix: Prefix, state: DecodeState, slot) -> DecodeState:
        start = (0, slot, 0, 0, 0)
        put = lambda big, small: jax.lax.dynamic_update_slice(big, small.astype(big.dtype), start)  # noqa: E731
        cache = decode.constrain_cache(KVCache(put(state.cache.k, prefix.cache.k), put(state.cache.v, prefix.cache.v)))
        return DecodeState(
            cache=cache,
            tokens_s=state.tokens_s.at[slot].set(prefix.token),
            positions_s=state.positions_s.at[slot].set(prefix.length),
            keys_s=state.keys_s.at[slot].set(prefix.key),
            generated_s=state.generated_s.at[slot].set(1),
            budget_s=state.budget_s.at[slot].set(prefix.budget),
            done_s=state.done_s.at[slot].set(prefix.done),
        )

    def _resize_impl(self, state: DecodeState, width: int) -> DecodeState:
        return state._replace(cache=decode.resize_cache(state.cache, width))

    def _generate_steps_impl(self, weights, state: DecodeState) -> tuple[DecodeState, ResultTokens]:
        if self.steps_per_call == 1:  # the one-step program, its results given the steps axis in it
            state, result = self._generate_impl(weights, state)
            return state, jax.tree.map(lambda x: x[None], result)
        return jax.lax.scan(lambda st, _: self._generate_impl(weights, st), state, None, length=self.steps_per_call)

    def _generate_impl(self, weights, state: DecodeState) -> tuple[DecodeState, ResultTokens]:
        sp = self.sampling
        active = ~state.done_s
        pos = jnp.where(active, state.positions_s, state.cache.max_len)  # idle slots write nothing
        logits, cache = decode.decode_step(self.config, weights, state.cache, state.tokens_s, pos)
        tok, lp = sample_tokens(logits, state.keys_s, state.generated_s, sp)
        tok = jnp.where(active, tok, sp.pad_id)
        lp = jnp.where(active, lp, 0.0)
        generated = state.generated_s + active.astype(jnp.int32)
        done = state.done_s | (active & (is_stop_token(tok, sp.stop_token_ids) | (generated >= state.budget_s)))
        new_state = DecodeState(
            cache=cache,
            tokens_s=jnp.where(active, tok, state.tokens_s),
            positions_s=state.positions_s + active.astype(jnp.int32),
            keys_s=state.keys_s,
            generated_s=generated,
            budget_s=state.budget_s,
            done_s=done,
        )
        return new_state, ResultTokens(tok, lp, active, done, generated)


def _check_params(params) -> None:
    if not isinstance(params, EngineParams):
        raise TypeError(f"engine params must come from Engine.load_params(params); got {type(params).__name__}")


def _typed_key(rng) -> jax.Array:
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if rng.shape != ():
            raise ValueError(f"expected one PRNG key; got key shape {rng.shape}")
        return rng
    if rng.dtype != jnp.uint32 or rng.shape != (2,):
        raise ValueError(f"rng must be one PRNG key (typed, or raw uint32 [2]); got {rng.dtype}{rng.shape}")
    return jax.random.wrap_key_data(rng)
