"""Continuous-batching rollouts on an `Engine`: P prompts x G samples, slots kept busy.

`rollout` walks the requests in order (request `r` = sample `r % G` of prompt
`r // G`), fills every free slot with the next request, steps all slots once, reads the
new tokens back, and refills a slot as soon as its request finishes. Each step is
dispatched before the previous one is read (as JetStream's orchestrator does), so the
host's reading and bookkeeping overlap the device's work: a request that stops on a stop
token idles its slot one step before the host refills it, and a request that ends by its
budget is never stepped past it. An engine with `steps_per_call > 1` runs that many steps
per call (`Engine.generate_steps`): fewer host round trips, and a slot whose request ends
inside a call idles for the rest of it. Each prompt is
prefilled once (right-padded to the engine's prefill bucket, so compiles stay bounded)
and its G samples reuse that KV, each redrawing its first token with its own key.

Request `r` uses key `fold_in(rng, r)` (or `rng[r]`), the same keys `sampler.generate`
gives the rows of the `[P*G]` batch `repeat(prompts, G)`; since a request's tokens
depend only on its key, the result reproduces the one-jit sampler request by request.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax
import numpy as np

from pipo_jax.sampling.engine import Engine, EngineParams
from pipo_jax.sampling.sampler import row_keys


@dataclasses.dataclass
class RolloutResult:
    """Per-request outputs, in request order (`R = P * G`)."""

    tokens: list[np.ndarray]  # R arrays int32 [len_r] (stop token included)
    logprobs: list[np.ndarray]  # R arrays float32 [len_r]: behaviour log-probs
    lengths: np.ndarray  # int32 [R]
    stopped: np.ndarray  # bool [R]: ended by a stop token (else by its budget)
    prompt_index: np.ndarray  # int32 [R]: r // G
    stats: dict  # decode_steps, prefills, slot_steps_used, slot_steps_total, resizes

    def padded(self, width: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(tokens_rn, logprobs_rn, mask_rn)` right-padded to `width` (>= every length)."""
        if len(self.lengths) and width < int(self.lengths.max()):
            raise ValueError(f"width={width} is shorter than the longest response ({int(self.lengths.max())})")
        n = len(self.tokens)
        tokens = np.full((n, width), pad_id, np.int32)
        logprobs = np.zeros((n, width), np.float32)
        mask = np.zeros((n, width), np.int32)
        for i, (t, lp) in enumerate(zip(self.tokens, self.logprobs)):
            tokens[i, : len(t)] = t
            logprobs[i, : len(t)] = lp
            mask[i, : len(t)] = 1
        return tokens, logprobs, mask


def rollout(
    engine: Engine,
    params: EngineParams,
    prompts: Sequence[Sequence[int]],
    num_samples: int,
    rng: jax.Array,
    max_new_tokens: Sequence[int] | None = None,
) -> RolloutResult:
    """Generates `num_samples` responses for each prompt with continuous batching.

    Args:
      engine, params: the engine and `engine.load_params(...)`.
      prompts: P token-id sequences (unpadded, each non-empty).
      num_samples: G samples per prompt.
      rng: one PRNG key (request r uses `fold_in(rng, r)`) or `[P*G]` per-request keys.
      max_new_tokens: optional per-request budgets `[P*G]` (default the engine's).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    n_req = len(prompts) * num_samples
    keys = row_keys(rng, n_req)
    budgets = np.full((n_req,), engine.sampling.max_new_tokens, np.int64)
    if max_new_tokens is not None:
        budgets = np.asarray(max_new_tokens, np.int64).reshape(-1)
        if budgets.shape != (n_req,):
            raise ValueError(f"max_new_tokens has {budgets.size} entries; expected one per request ({n_req})")
    padded = []
    for i, p in enumerate(prompts):
        try:
            padded.append(engine.pad_to_bucket(p))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    for r in range(n_req):  # fail before generating anything
        length = padded[r // num_samples][1]
        if budgets[r] < 1 or length + budgets[r] - 1 > engine.max_len:
            raise ValueError(f"request {r} (prompt {r // num_samples}): {length} prompt tokens + {budgets[r]} new "
                             f"tokens do not fit max_len={engine.max_len} (budget must be >= 1)")

    tokens: list[list[int]] = [[] for _ in range(n_req)]
    logprobs: list[list[float]] = [[] for _ in range(n_req)]
    stopped = np.zeros((n_req,), bool)
    finished = np.zeros((n_req,), bool)
    stop_ids = set(engine.sampling.stop_token_ids)
    pending = collections.deque(range(n_req))
    slot_req: dict[int, int] = {}  # the request each slot holds, as far as the host has read
    slot_pos: dict[int, int] = {}  # position of the token each slot feeds next, as far as read
    in_flight: collections.deque = collections.deque()  # (result, {slot: request} at dispatch)
    last_prompt, last_prefix = -1, None
    stats = dict(decode_steps=0, prefills=0, slot_steps_used=0, slot_steps_total=0, resizes=0)
    state = engine.init_decode_state()  # every slot empty
    for slot in range(engine.max_concurrent_decodes):
        engine.free_resource(slot)

    def finish(r: int, tok: int) -> None:
        finished[r] = True
        stopped[r] = tok in stop_ids

    def read(result, requests: dict[int, int]) -> None:
        """The tokens of one call's steps (in order), each given to the request its slot held
        when the call was dispatched."""
        res = jax.device_get(result)
        for j in range(res.tokens_s.shape[0]):
            for slot, r in requests.items():
                if not res.valid_s[j, slot]:
                    if finished[r]:  # ended at an earlier step (or call, read late): its slot idled
                        continue
                    raise RuntimeError(f"slot {slot} (request {r}) produced no token although it was decoding")
                tokens[r].append(int(res.tokens_s[j, slot]))
                logprobs[r].append(float(res.logprobs_s[j, slot]))
                stats["slot_steps_used"] += 1
                slot_pos[slot] += 1
                if res.done_s[j, slot]:
                    finish(r, int(res.tokens_s[j, slot]))
                    del slot_req[slot], slot_pos[slot]
                    engine.free_resource(slot)

    steps = engine.steps_per_call

    def steps_ahead(slot: int) -> int:
        """Dispatched, unread steps that advance `slot`'s request (0 or `steps_per_call`)."""
        return steps * sum(requests.get(slot) == slot_req[slot] for _, requests in in_flight)

    def last_position(slot: int) -> int:
        """The furthest position `slot` feeds in the next call: `steps` on from where the
        dispatched steps leave it, or its request's last (by budget) if that comes first."""
        r = slot_req[slot]
        return min(slot_pos[slot] + steps_ahead(slot) + steps - 1, slot_pos[slot] + budgets[r] - len(tokens[r]) - 1)

    while pending or slot_req or in_flight:
        for slot in engine.free_slots():
            if not pending:
                break
            r = pending.popleft()
            pi = r // num_samples
            if pi != last_prompt:
                toks, length = padded[pi]
                last_prefix = engine.prefill(params, toks, length, keys[r], int(budgets[r]))
                last_prompt = pi
                stats["prefills"] += 1
                prefix = last_prefix
            else:
                prefix = engine.resample_prefix(last_prefix, keys[r], int(budgets[r]))
            tok, lp, done = jax.device_get((prefix.token, prefix.logprob, prefix.done))
            tokens[r].append(int(tok))
            logprobs[r].append(float(lp))
            if done:
                finish(r, int(tok))
                continue
            if prefix.cache.max_len > state.cache.max_len:
                state = engine.resize(state, engine.width_for(prefix.cache.max_len - 1))
                stats["resizes"] += 1
            state = engine.insert(prefix, state, slot)
            slot_req[slot] = r
            slot_pos[slot] = padded[pi][1]
        # Slots whose request is not known to end (by its budget) within the dispatched steps.
        needing = [s for s in slot_req if len(tokens[slot_req[s]]) + steps_ahead(s) < budgets[slot_req[s]]]
        if needing:
            width = engine.width_for(max(last_position(s) for s in needing))
            if width != state.cache.max_len:
                state = engine.resize(state, width)
                stats["resizes"] += 1
            # Dispatched before the previous call is read: the host's reading and bookkeeping
            # overlap the device's steps. A request that stopped in the unread call idles here.
            state, result = engine.generate_steps(params, state)
            in_flight.append((result, dict(slot_req)))
            stats["decode_steps"] += steps
            stats["slot_steps_total"] += steps * engine.max_concurrent_decodes
        elif slot_req and not in_flight:
            raise RuntimeError(f"slots {sorted(slot_req)} hold requests that neither decode nor end")
        if len(in_flight) > 1 or (in_flight and not needing):
            read(*in_flight.popleft())

    return RolloutResult(
        tokens=[np.asarray(t, np.int32) for t in tokens],
        logprobs=[np.asarray(lp, np.float32) for lp in logprobs],
        lengths=np.asarray([len(t) for t in tokens], np.int32),
        stopped=stopped,
        prompt_index=np.arange(n_req, dtype=np.int32) // num_samples,
        stats=stats,
    )
