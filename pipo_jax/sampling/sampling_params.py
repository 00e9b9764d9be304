"""`SamplingParams`: how tokens are drawn and which log-probs are reported.

A frozen, hashable dataclass, so it is a static argument of the jitted samplers (one
compile per distinct setting).
"""

from __future__ import annotations

import dataclasses

# Which log-prob of each sampled token is reported (see `SamplingParams.logprobs`).
LOGPROB_MODES = ("sampled", "tempered", "raw")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by every row/request of one generate call.

    Attributes:
      temperature: logits are divided by it; 0 means greedy (argmax).
      top_k: keep the k most likely tokens (0 = off). Ties at the k-th value are broken
        by token id (lowest kept), as `lax.top_k` does.
      top_p: nucleus; keep the smallest most-likely-first prefix whose probability
        (after temperature and top-k) reaches `top_p` (1.0 = off).
      max_new_tokens: response budget per row; also the width of the one-jit output.
      stop_token_ids: sampling a stop token ends the row; the stop token itself is part
        of the response (mask 1, counted in its length).
      logprobs: which log-prob of each sampled token is returned:
        'sampled'  -- log-prob under the distribution the token was actually drawn from:
                      softmax(logits / T) restricted to the top-k / top-p set and
                      renormalised (equals 'tempered' when top_k=0 and top_p=1);
        'tempered' -- log_softmax(logits / T) over the full vocabulary, no truncation:
                      what a trainer recomputing log-probs at temperature T gets, so
                      the right behaviour log-prob for PPO ratios;
        'raw'      -- log_softmax(logits), temperature 1, no truncation.
        With greedy decoding (temperature 0) every mode returns the 'raw' value (the
        sampled distribution is a point mass, whose log-prob would always be 0).
      pad_id: written after a row ends (those positions have mask 0).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    logprobs: str = "sampled"
    pad_id: int = 0

    def __post_init__(self):
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1] (1 = off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.logprobs not in LOGPROB_MODES:
            raise ValueError(f"SamplingParams.logprobs={self.logprobs!r}; expected one of {LOGPROB_MODES}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids={self.stop_token_ids} must be non-negative ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate_vocab(self, vocab_size: int) -> None:
        """Raises if a token id or top_k does not fit a vocabulary of `vocab_size`."""
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"SamplingParams.stop_token_ids {bad} are >= vocab_size={vocab_size}")
        if self.top_k > vocab_size:
            raise ValueError(f"SamplingParams.top_k={self.top_k} exceeds vocab_size={vocab_size}")
        if not 0 <= self.pad_id < vocab_size:
            raise ValueError(f"SamplingParams.pad_id={self.pad_id} is outside [0, {vocab_size})")

    def replace(self, **kw) -> "SamplingParams":
        return dataclasses.replace(self, **kw)
