"""Digit sum: "what is the sum of the digits of N?" (docs/extending.md "Add a task" builds it).

Every N with `min_digits`..`max_digits` decimal digits (1 digit: 0..9) is a problem once; a fixed
permutation (`split_seed`) holds out `heldout_fraction` of them (at least one, never all), so no
number is in both splits (`split_numbers`). The two splits' numbers are the task's prompt table
(int32 `[N_train]`, `[N_heldout]`, placed on device once); prompts and answers are computed from N
in JAX. Shown in the built-in character vocabulary `data/char_vocab.py`: the prompt is
`<bos>4729=` (N's digits, most significant first) and the one correct response is the sum in
decimal, `22<eos>`. The reward is 1.0 for exactly that response (the answer and `<eos>`), else
0.0, in JAX: the whole iteration stays one jit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.sections import RunConfig
from pipo_jax.data import char_vocab
from pipo_jax.tasks.digit_sum_settings import DigitSumSettings
from pipo_jax.tasks.protocol import Scored, Task, TaskCapabilities


class Split(NamedTuple):
    """The prompt table: the numbers of the train split `[N_train]` and of the held-out split
    `[N_heldout]` (int32, ascending)."""

    train_n: np.ndarray
    heldout_n: np.ndarray


@functools.lru_cache(maxsize=8)
def split_numbers(min_digits: int, max_digits: int, heldout_fraction: float, split_seed: int) -> Split:
    """Every N with min..max digits, split by a fixed permutation: the last
    min(max(round(N * fraction), 1), N - 1) of it held out."""
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    n = 10 ** max_digits - low
    perm = (low + np.random.default_rng(split_seed).permutation(n)).astype(np.int32)
    n_held = min(max(int(round(n * heldout_fraction)), 1), n - 1)
    out = Split(train_n=np.sort(perm[: n - n_held]), heldout_n=np.sort(perm[n - n_held:]))
    for a in out:
        a.setflags(write=False)  # cached: shared by every caller
    return out


class Problems(NamedTuple):
    """A batch of problems (a pytree): left-padded prompts `[b, P]`, the numbers `[b]`, and the
    answers (the sum's digits then `<eos>`) right-padded `[b, A]`."""

    prompt_tokens_bp: jax.Array
    prompt_mask_bp: jax.Array
    number_b: jax.Array
    target_tokens_ba: jax.Array
    target_mask_ba: jax.Array


def _digits(x_b: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """int32 `[b, width]`: the decimal digits of `x_b` (>= 0) most significant first, right-aligned
    (leading places 0), and int32 `[b]` their count (1 for 0)."""
    powers = 10 ** jnp.arange(width - 1, -1, -1, dtype=jnp.int32)
    count = 1 + jnp.sum(x_b[:, None] >= powers[None, :-1], axis=1).astype(jnp.int32)
    return (x_b[:, None] // powers[None, :]) % 10, count


@dataclasses.dataclass(frozen=True)
class DigitSumTask(Task):
    """The digit-sum task (hashable by its settings: jit-static).

    min_digits, max_digits: the numbers' digit counts, 1 <= min <= max <= 5; heldout_fraction in
    [0, 1) and split_seed: the held-out split (`split_numbers`).
    """

    min_digits: int = 1
    max_digits: int = 3
    heldout_fraction: float = 0.1
    split_seed: int = 0

    name: ClassVar[str] = "digit_sum"
    # A JAX reward; one correct response per problem (greedy accuracy by teacher forcing), which the
    # warm-up learns; no SDPO / VPD teacher contexts.
    capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(device_reward=True, exact_answers=True, warmup=True)
    stop_token_ids: ClassVar[tuple[int, ...]] = (char_vocab.EOS_ID,)
    pad_id: ClassVar[int] = char_vocab.PAD_ID
    token_id_bound: ClassVar[int] = char_vocab.VOCAB_SIZE

    def __post_init__(self):
        # `DigitSumSettings` checks the keys (errors naming them); this checks a task built directly.
        DigitSumSettings(min_digits=self.min_digits, max_digits=self.max_digits)
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"DigitSumTask.heldout_fraction={self.heldout_fraction} must be in [0, 1)")

    @property
    def prompt_len(self) -> int:
        """P = `<bos>`, max_digits digits, '='."""
        return self.max_digits + 2

    @property
    def answer_len(self) -> int:
        """A = the digits of the largest sum (9 * max_digits), then `<eos>`."""
        return len(str(9 * self.max_digits)) + 1

    @property
    def train_size(self) -> int:
        return len(self.prompt_table().train_n)

    def prompt_table(self) -> Split:
        return split_numbers(self.min_digits, self.max_digits, self.heldout_fraction, self.split_seed)

    def problems_of(self, number_b) -> Problems:
        """The problems of the numbers `number_b` int32 `[b]` (jit-able)."""
        return _problems_of(self, jnp.asarray(number_b, jnp.int32))

    def _table(self, table: Split | None) -> Split:
        """`table` (the placed prompt table), or the host one where the caller passes None (the
        warm-up's evaluation, `run/warmup.py`: then its numbers are constants of the program)."""
        return self.prompt_table() if table is None else table

    def sample_problems(self, table: Split | None, rng: jax.Array, n: int, split: str = "train") -> Problems:
        """`n` numbers of `split` drawn uniformly with replacement (pure, jit-able)."""
        table = self._table(table)
        numbers = {"train": table.train_n, "heldout": table.heldout_n}.get(split)
        if numbers is None:
            raise ValueError(f"split {split!r} is not 'train' or 'heldout'")
        return self.problems_of(jnp.asarray(numbers)[jax.random.randint(rng, (n,), 0, len(numbers))])

    def heldout_problems(self, table: Split | None, n: int, rng: jax.Array) -> Problems:
        """The first `n` held-out numbers (fewer if the split is smaller; the same every time)."""
        del rng
        return self.problems_of(self._table(table).heldout_n[:n])

    def reference_responses(self, problems: Problems) -> tuple[jax.Array, jax.Array]:
        """The sum and `<eos>` `[b, A]`: the only correct response."""
        return problems.target_tokens_ba, problems.target_mask_ba

    def reward(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        """float32 `[b]`: 1.0 where the response's first A tokens are the answer and `<eos>` (all
        valid), else 0.0 (a response narrower than A is padded, so it scores 0)."""
        a, r = self.answer_len, tokens_br.shape[-1]
        if r < a:
            tokens_br = jnp.pad(tokens_br, ((0, 0), (0, a - r)), constant_values=char_vocab.PAD_ID)
            mask_br = jnp.pad(mask_br, ((0, 0), (0, a - r)))
        ok = ((tokens_br[:, :a] == problems.target_tokens_ba) & (mask_br[:, :a] == 1)) | (problems.target_mask_ba == 0)
        return jnp.all(ok, axis=1).astype(jnp.float32)

    def scorer(self) -> DigitSumScorer:
        return DigitSumScorer(self)

    def prompt_note(self) -> str:
        return ("A prompt is `<bos>` then N's digits then '=' (e.g. `<bos>4729=`); the answer is the sum of "
                "N's digits in decimal, then `<eos>` (`22<eos>`).")


class DigitSumScorer:
    """The JAX reward as a `HostScorer` (the host loop, `log.jit_loop=false`)."""

    def __init__(self, task: DigitSumTask):
        self.task = task

    def score(self, problems: Problems, tokens_br, mask_br) -> Scored:
        return Scored(np.asarray(self.task.reward(problems, jnp.asarray(tokens_br), jnp.asarray(mask_br))))

    def take_counts(self) -> dict[str, int]:
        return {}  # it counts nothing

    def close(self) -> None:
        pass


# Integer token arithmetic only, so one program is exact wherever it is called: called eagerly (a test, an
# evaluation outside a jit) it compiles once per task and batch size instead of as a few dozen
# single-operation programs; inside a caller's jit it is inlined.
@functools.partial(jax.jit, static_argnums=0)
def _problems_of(task: DigitSumTask, n_b: jax.Array) -> Problems:
    d, p, a = task.max_digits, task.prompt_len, task.answer_len
    digits_bd, count_b = _digits(n_b, d)
    pos_p = jnp.arange(p)[None, :]
    start_b = (d - count_b)[:, None]  # the `<bos>` position
    body = jnp.concatenate([jnp.full_like(n_b[:, None], char_vocab.PAD_ID), char_vocab.DIGIT0_ID + digits_bd,
                            jnp.full_like(n_b[:, None], char_vocab.EQUALS_ID)], axis=1)
    prompt = jnp.where(pos_p < start_b, char_vocab.PAD_ID, jnp.where(pos_p == start_b, char_vocab.BOS_ID, body))
    sum_digits_bw, sum_count_b = _digits(jnp.sum(digits_bd, axis=1), a - 1)
    # left-align the sum's digits: position j holds place sum_count - 1 - j
    idx_ba = jnp.clip(jnp.arange(a)[None, :] + (a - 1 - sum_count_b)[:, None], 0, a - 2)
    pos_a, n_ans = jnp.arange(a)[None, :], sum_count_b[:, None]
    target = jnp.where(pos_a < n_ans, char_vocab.DIGIT0_ID + jnp.take_along_axis(sum_digits_bw, idx_ba, axis=1),
                       jnp.where(pos_a == n_ans, char_vocab.EOS_ID, char_vocab.PAD_ID))
    return Problems(prompt_tokens_bp=prompt.astype(jnp.int32), prompt_mask_bp=(pos_p >= start_b).astype(jnp.int32),
                    number_b=n_b, target_tokens_ba=target.astype(jnp.int32),
                    target_mask_ba=(pos_a <= n_ans).astype(jnp.int32))


def from_config(run: RunConfig) -> DigitSumTask:
    """The task of the typed run config `run` (`RunConfig`): its own section `task.digit_sum`
    (`DigitSumSettings`) and the shared split keys."""
    s: DigitSumSettings = run.task.digit_sum
    return DigitSumTask(min_digits=s.min_digits, max_digits=s.max_digits, heldout_fraction=run.task.heldout_fraction,
                        split_seed=run.task.split_seed)
