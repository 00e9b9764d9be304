"""The rollout interface: what the trainer calls to generate, and its two implementations.

A `Generator` maps policy params and left-padded prompts `[B, P]` (rows of a group of G
samples adjacent and equal) to the responses: right-padded tokens, mask and behaviour
log-probs `[B, R]` and lengths `[B]` (`Generation`). Row b samples with key
`fold_in(rng, b)`, so both implementations give the same tokens for the same key:

- `OneJitSampler` (`rollout.engine=sampler`, the default): `sampler.generate`, prefill and a
  `lax.while_loop` of decode steps in one jit. Traceable (`in_program`), so it runs inside the
  trainer's jitted iteration and `lax.scan`, sharded on a mesh.
- `SlotEngineSampler` (`rollout.engine=slots`): the slot `Engine` driven by
  `continuous_batching.rollout` on the host, each prompt prefilled once for its G samples and a
  slot refilled as soon as its request ends. Host-driven (not `in_program`): the trainer's host
  loop on one device. Each instance owns its engines (`EnginePool`, one per setting), so the
  caller that keeps the instance (`loop.single_device_programs`) compiles them once.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import jax
import numpy as np

from pipo_jax.config.registry import register_names
from pipo_jax.models.qwen3 import Params, Qwen3Config
from pipo_jax.sampling import continuous_batching, sampler
from pipo_jax.sampling.engine import Engine
from pipo_jax.sampling.sampling_params import SamplingParams

ENGINES = ("sampler", "slots")
register_names("engine", *ENGINES)  # `config/registry.py`: the schema's choices


class Generation(NamedTuple):
    """Responses `[B, R]` (R = `SamplingParams.max_new_tokens`), right-padded with pad_id."""

    tokens_br: jax.Array  # int32
    mask_br: jax.Array  # int32: 1 up to and including the stop token
    logprobs_br: jax.Array  # float32 behaviour log-probs (SamplingParams.logprobs), 0 where masked
    lengths_b: jax.Array  # int32: tokens generated


class Generator(Protocol):
    """`generator(params, prompt_tokens_bp, prompt_mask_bp, rng) -> Generation`."""

    in_program: bool  # traceable: callable inside a jitted program

    def __call__(self, params: Params, prompt_tokens_bp, prompt_mask_bp, rng: jax.Array) -> Generation: ...


@dataclasses.dataclass(frozen=True)
class OneJitSampler:
    """`sampler.generate` as a `Generator` (hashable: part of a jit-static spec)."""

    model: Qwen3Config
    sampling: SamplingParams
    in_program = True

    def __call__(self, params: Params, prompt_tokens_bp, prompt_mask_bp, rng: jax.Array) -> Generation:
        out = sampler.generate(self.model, params, prompt_tokens_bp, prompt_mask_bp, rng, self.sampling)
        return Generation(out.tokens_br, out.mask_br, out.logprobs_br, out.lengths_b)


class EnginePool:
    """Slot engines by setting (model, sampling, slots, cache length, steps per call): one setting's jitted
    programs compile once for as long as the pool's owner keeps it."""

    def __init__(self):
        self._engines: dict[tuple, Engine] = {}

    def get(self, model: Qwen3Config, sampling: SamplingParams, slots: int, max_len: int,
            steps_per_call: int = 1) -> Engine:
        key = (model, sampling, slots, max_len, steps_per_call)
        if key not in self._engines:
            self._engines[key] = Engine(model, sampling, max_concurrent_decodes=slots, max_len=max_len,
                                        steps_per_call=steps_per_call)
        return self._engines[key]

    def __len__(self) -> int:
        return len(self._engines)


@dataclasses.dataclass(frozen=True)
class SlotEngineSampler:
    """The slot `Engine` with continuous batching as a `Generator` (host-driven).

    `group_size`: rows come in groups of G equal prompts (the trainer's layout); each group's
    prompt is prefilled once. `slots`: concurrent decode slots (0: one per row). `steps_per_call`:
    decode steps per device call (`Engine.steps_per_call`). `engines`: this instance's engines
    (not part of its identity: equal samplers compare equal).
    """

    model: Qwen3Config
    sampling: SamplingParams
    group_size: int = 1
    slots: int = 0
    steps_per_call: int = 1
    engines: EnginePool = dataclasses.field(default_factory=EnginePool, compare=False, repr=False)
    in_program = False

    def engine(self, rows: int, prompt_width: int) -> Engine:
        """The engine for `rows` prompts rows `prompt_width` wide (made once per setting)."""
        return self.engines.get(self.model, self.sampling, self.slots or rows,
                                prompt_width + self.sampling.max_new_tokens, self.steps_per_call)

    def __call__(self, params: Params, prompt_tokens_bp, prompt_mask_bp, rng: jax.Array) -> Generation:
        tokens_bp, mask_bp = np.asarray(prompt_tokens_bp), np.asarray(prompt_mask_bp)
        b, g = tokens_bp.shape[0], self.group_size
        if b % g:
            raise ValueError(f"{b} rows are not whole groups of {g}")
        groups = tokens_bp.reshape(b // g, g, -1)
        if not (groups == groups[:, :1]).all():
            raise ValueError(f"the rows of a group of {g} must hold the same prompt")
        prompts = [row[m == 1] for row, m in zip(tokens_bp[::g], mask_bp[::g])]
        engine = self.engine(b, tokens_bp.shape[1])
        result = continuous_batching.rollout(engine, engine.load_params(params), prompts, g, rng)
        tokens, logprobs, mask = result.padded(self.sampling.max_new_tokens, self.sampling.pad_id)
        return Generation(tokens, mask, logprobs, result.lengths)

