"""The built-in verifiable task: procedurally generated multi-digit arithmetic, all in JAX.

A problem is `lhs op rhs` with `op` in `task.arithmetic.ops` ('+', '-', '*') and operands of
`min_digits..max_digits` digits (the digit count is drawn uniformly, then the value
uniformly among numbers with that many digits, so short and long problems are equally
common). Everything -- sampling, tokenising, reward, feedback -- is jnp on fixed shapes,
so "sample prompts -> generate -> reward" can be one jitted function inside `lax.scan`.

Token layout (ids from `pipo_jax.data.char_vocab`):
  prompt  `<bos> lhs op rhs =`, left-padded with `<pad>` to `task.prompt_len`
          (`pad_operands=True` writes the operands with leading zeros: `<bos>047+085=`).
  target  the answer then `<eos>`, right-padded to `task.answer_len`, in one of three
          `answer_format`s (answer 132 for 47+85):
            plain     `132<eos>`
            reversed  `231<eos>`        digits least-significant first (sign first)
            worked    `231;132<eos>`    the column digits least-significant first (the
                                        carry-friendly "work"), ';', then the answer
  A negative answer (only with `allow_negative=True` and '-') carries a leading '-'.

Train / held-out split: **hash-based**. Each problem (lhs, op, rhs) is hashed with a
fixed 32-bit mixer (`problem_hash`, seeded by `split_seed`); it is held out iff its hash
is below `heldout_fraction * 2**32`. `sample_problems(..., split=...)` rejection-samples
inside its split, so a train problem can never equal a held-out problem, whatever the
RNG keys of the two streams are.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.sections import RunConfig
from pipo_jax.data import char_vocab as cv
from pipo_jax.tasks.arithmetic_settings import ANSWER_FORMATS, FEEDBACK_STYLES, REWARD_MODES, ArithmeticSettings
from pipo_jax.tasks.protocol import ContextChoice, RewardComponent, Scored, Task, TaskCapabilities

SPLITS = ("train", "heldout")
# Candidates drawn per row and round of the split rejection sampler.
_CANDIDATES_PER_ROUND = 16
# Above this many distinct problems the split is not enumerated at construction.
_MAX_ENUMERATED_PROBLEMS = 4_000_000


@dataclasses.dataclass(frozen=True)
class ArithmeticTask(Task):
    """Config of the arithmetic task (hashable: pass it as a static jit argument).

    The defaults (1-2 digit '+'/'-', reversed answers) are the tiny CPU task: the
    `run.warmup` recipe brings a ~0.3M-parameter Qwen3 to ~30% held-out accuracy in
    ~450 steps, with a steep learning phase ahead for RL.

    Fields:
      min_digits, max_digits: operand digit counts (inclusive), 1 <= min <= max; at most
        8 digits (4 with '*') so every answer fits in int32.
      ops: operators, a tuple (or string, e.g. "+-") drawn from '+', '-', '*'.
      allow_negative: False -> for '-' the larger operand comes first (answers >= 0).
      pad_operands: write operands with leading zeros to exactly max_digits digits
        (`<bos>047+085=`), so place values sit at fixed positions (easier to learn).
      answer_format: 'plain' | 'reversed' | 'worked' (module docstring).
      prompt_len: fixed prompt width; None -> the minimum `2 * max_digits + 3`.
      answer_len: fixed target / response width (answer tokens and EOS); None -> the
        longest possible target.
      heldout_fraction: share of all problems that are held out, in (0, 1).
      split_seed: seeds the split hash (another seed gives another split).
      reward_mode: 'exact' -> 1.0 iff the response is the target followed by EOS, else
        0.0; 'per_token' -> the fraction of target positions (answer tokens and EOS)
        where the response has the target token (1.0 exactly when 'exact' is 1.0).
      feedback_style: 'position' -> `<wrong><at>k` (1-based first wrong target
        position; position target_len is the EOS) or `<correct>`; 'reveal' ->
        `<wrong><answer>ANSWER` or `<correct><answer>ANSWER`.
      warmup_mistake_rate / warmup_context_fraction: the warm-up's demonstrations
        (`warmup_problems`): a share of the carrying / borrowing ones flawed, a share of the
        rows shown with a teacher context.
    """

    min_digits: int = 1
    max_digits: int = 2
    ops: tuple[str, ...] = ("+", "-")
    allow_negative: bool = False
    pad_operands: bool = False
    answer_format: str = "reversed"
    prompt_len: int | None = None
    answer_len: int | None = None
    heldout_fraction: float = 0.1
    split_seed: int = 0
    reward_mode: str = "exact"
    feedback_style: str = "position"
    warmup_mistake_rate: float = 0.0
    warmup_context_fraction: float = 0.0

    def __post_init__(self):
        ops = tuple(self.ops)
        object.__setattr__(self, "ops", ops)
        if not ops or any(op not in cv.OPERATORS for op in ops) or len(set(ops)) != len(ops):
            raise ValueError(f"ArithmeticTask.ops={ops!r}: expected distinct operators from {cv.OPERATORS}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(
                f"ArithmeticTask.min_digits={self.min_digits}, max_digits={self.max_digits}: need 1 <= min <= max"
            )
        limit = 4 if "*" in ops else 8
        if self.max_digits > limit:
            raise ValueError(f"ArithmeticTask.max_digits={self.max_digits} > {limit} overflows int32 with ops={ops}")
        for name, allowed in (("answer_format", ANSWER_FORMATS), ("reward_mode", REWARD_MODES),
                              ("feedback_style", FEEDBACK_STYLES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ArithmeticTask.{name}={getattr(self, name)!r}; expected one of {allowed}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"ArithmeticTask.heldout_fraction={self.heldout_fraction} must be in (0, 1)")
        for name, minimum in (("prompt_len", self.min_prompt_len), ("answer_len", self.min_answer_len)):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, minimum)
            elif value < minimum:
                raise ValueError(f"ArithmeticTask.{name}={value} < {minimum}, the longest {name[:-4]} of this task")
        _check_split_nonempty(self.min_digits, self.max_digits, ops, self.allow_negative,
                              self.heldout_fraction, self.split_seed)

    @property
    def answer_width(self) -> int:
        """Most digits of |answer| over `ops`."""
        widths = {"+": self.max_digits + 1, "-": self.max_digits, "*": 2 * self.max_digits}
        return max(widths[op] for op in self.ops)

    @property
    def can_be_negative(self) -> bool:
        return self.allow_negative and "-" in self.ops

    @property
    def min_prompt_len(self) -> int:
        return 2 * self.max_digits + 3  # <bos> lhs op rhs =

    @property
    def min_answer_len(self) -> int:
        body = 2 * self.answer_width + 1 if self.answer_format == "worked" else self.answer_width
        return body + int(self.can_be_negative) + 1  # + <eos>

    @property
    def feedback_len(self) -> int:
        """Width of `feedback_tokens` output."""
        if self.feedback_style == "position":
            return 2 + len(str(self.answer_len))
        return 2 + self.answer_len - 1

    @property
    def sequence_len(self) -> int:
        """prompt_len + answer_len: the width of a teacher-forced prompt+target row."""
        return self.prompt_len + self.answer_len

    def replace(self, **kw) -> ArithmeticTask:
        return dataclasses.replace(self, **kw)

    # ------------------------------------------------------------- the Task protocol (tasks/protocol.py)

    name: ClassVar[str] = "arithmetic"
    capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(
        device_reward=True, exact_answers=True, teacher_contexts=True, warmup=True, reward_components=True)
    tokenizer: ClassVar[Any] = None
    train_size: ClassVar[int] = 0  # problems are generated: no epochs
    stop_token_ids: ClassVar[tuple[int, ...]] = (cv.EOS_ID,)
    pad_id: ClassVar[int] = cv.PAD_ID
    token_id_bound: ClassVar[int] = cv.VOCAB_SIZE

    def prompt_table(self) -> None:
        """Problems are generated in the program: no table."""
        return None

    def sample_problems(self, table, rng: jax.Array, n: int, split: str = "train") -> Problems:
        del table
        return sample_problems(self, rng, n, split)

    def heldout_problems(self, table, n: int, rng: jax.Array) -> Problems:
        del table
        return sample_problems(self, rng, n, "heldout")

    def reference_responses(self, problems: Problems) -> tuple[jax.Array, jax.Array]:
        return problems.target_tokens_ba, problems.target_mask_ba

    def reward(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        return reward(self, problems, tokens_br, mask_br)

    def reward_weights(self) -> tuple[RewardComponent, ...]:
        """`answer` and `stop`, weight 1 each (`reward_components`)."""
        return REWARD_COMPONENTS

    def reward_components(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        return reward_components(self, problems, tokens_br, mask_br)

    def teacher_prompts(self, problems: Problems, tokens_br, mask_br,
                        choice: ContextChoice) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`<solution>` + the chosen sibling's response, else (`choice.feedback_b`) `<feedback>` +
        `feedback_tokens` on the row's own response; then `<solve>` and the prompt
        (`teacher_prompt`); width 3 + R + feedback_len + prompt_len."""
        has_demo, use_fb = choice.has_demo_b, choice.feedback_b
        tokens, mask = teacher_prompt(
            self, problems, (tokens_br[choice.demo_row_b], mask_br[choice.demo_row_b]), has_demo,
            feedback_tokens(self, problems, tokens_br, mask_br), use_fb, jnp.ones_like(has_demo))
        return tokens, mask, (has_demo | use_fb).astype(jnp.float32)

    def teacher_eval_problems(self, table, n: int, rng: jax.Array) -> dict[str, Problems]:
        """The held-out problems shown a correct sibling's solution, and the feedback on a
        wrong response (`with_contexts`)."""
        problems = self.heldout_problems(table, n, rng)
        return {kind: with_contexts(self, problems, jnp.full((n,), CONTEXT_KINDS.index(kind), jnp.int32),
                                    jnp.zeros((n,), bool)) for kind in CONTEXT_KINDS[1:]}

    def warmup_problems(self, rng: jax.Array, n: int) -> Problems:
        """`warmup_demonstrations`: train problems, a `warmup_context_fraction` share shown with a
        teacher context, a `warmup_mistake_rate` share of the carrying / borrowing ones flawed."""
        return warmup_demonstrations(self, rng, n, self.warmup_context_fraction, self.warmup_mistake_rate)

    def scorer(self) -> ArithmeticScorer:
        return ArithmeticScorer(self)

    def prompt_note(self) -> str:
        d = self.max_digits
        example = f"<bos>{'12'.zfill(d)}+{'34'.zfill(d)}=" if self.pad_operands else "<bos>12+34="
        padded = f" (operands zero-padded to {d} digits)" if self.pad_operands else ""
        return (f"A prompt is `<bos>`, the problem and `=`, e.g. `{example}`{padded}: {self.min_digits}- to "
                f"{d}-digit operands, operators {''.join(self.ops)}; answers are written {self.answer_format}, "
                "then `<eos>`.")


def from_config(run: RunConfig) -> ArithmeticTask:
    """The task of the typed run config `run` (`RunConfig`): its own section `task.arithmetic`
    (`ArithmeticSettings`: digits, ops, answer format, reward, feedback, warm-up demonstrations) and the
    shared split keys."""
    s: ArithmeticSettings = run.task.arithmetic
    return ArithmeticTask(
        min_digits=s.min_digits, max_digits=s.max_digits, ops=tuple(s.ops), answer_format=s.answer_format,
        reward_mode=s.reward_mode, feedback_style=s.feedback_style, heldout_fraction=run.task.heldout_fraction,
        split_seed=run.task.split_seed, warmup_mistake_rate=s.warmup_mistake_rate,
        warmup_context_fraction=s.warmup_context_fraction)


class Problems(NamedTuple):
    """A batch of problems (a pytree). Shapes: b batch, p prompt_len, a answer_len.

    prompt_tokens_bp / prompt_mask_bp: left-padded prompt ids and validity (int32).
    lhs_b, rhs_b: operands; op_b: index into `char_vocab.OPERATORS`; answer_b: the value.
    target_tokens_ba / target_mask_ba: answer tokens then EOS, right-padded, and validity.
    target_len_b: number of target tokens including the EOS.
    """

    prompt_tokens_bp: jax.Array
    prompt_mask_bp: jax.Array
    lhs_b: jax.Array
    op_b: jax.Array
    rhs_b: jax.Array
    answer_b: jax.Array
    target_tokens_ba: jax.Array
    target_mask_ba: jax.Array
    target_len_b: jax.Array


# ----------------------------------------------------------------------------- split hash

_GOLDEN = 0x9E3779B9


def _fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 (jnp or numpy; multiplication wraps)."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _problem_hash(xp, lhs, op, rhs, split_seed: int):
    seed_word = np.uint32((split_seed * _GOLDEN) & 0xFFFFFFFF)
    h = _fmix32(xp.asarray(op).astype(xp.uint32) + seed_word)
    h = _fmix32(h ^ xp.asarray(lhs).astype(xp.uint32))
    return _fmix32((h + np.uint32(_GOLDEN)) ^ xp.asarray(rhs).astype(xp.uint32))


def problem_hash(lhs, op, rhs, split_seed: int) -> jax.Array:
    """uint32 hash of problems (lhs, op index into `char_vocab.OPERATORS`, rhs), any shape."""
    return _problem_hash(jnp, lhs, op, rhs, split_seed)


def _heldout_threshold(fraction: float) -> np.uint32:
    return np.uint32(min(int(fraction * 2**32), 2**32 - 1))


def is_heldout(task: ArithmeticTask, lhs, op, rhs) -> jax.Array:
    """Boolean: does (lhs, op, rhs) belong to the held-out split of `task`?"""
    return problem_hash(lhs, op, rhs, task.split_seed) < _heldout_threshold(task.heldout_fraction)


def _operand_range(min_digits: int, max_digits: int) -> np.ndarray:
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return np.arange(low, 10**max_digits, dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _check_split_nonempty(min_digits, max_digits, ops, allow_negative, fraction, split_seed):
    """Raises if the train or held-out split has no problem (the sampler would never stop)."""
    values = _operand_range(min_digits, max_digits)
    total = len(values) ** 2 * len(ops)
    if total > _MAX_ENUMERATED_PROBLEMS:
        if min(fraction, 1 - fraction) * total < 1000:
            raise ValueError(f"ArithmeticTask.heldout_fraction={fraction} leaves a split with < 1000 of {total} problems")
        return
    lhs, rhs = np.meshgrid(values, values, indexing="ij")
    threshold = _heldout_threshold(fraction)
    n_heldout, n_total = 0, 0
    for op in ops:
        keep = (lhs >= rhs) if (op == "-" and not allow_negative) else np.ones_like(lhs, bool)
        with np.errstate(over="ignore"):
            h = _problem_hash(np, lhs[keep], cv.OPERATORS.index(op), rhs[keep], split_seed)
        n_heldout += int(np.sum(h < threshold))
        n_total += int(keep.sum())
    if n_heldout == 0 or n_heldout == n_total:
        raise ValueError(
            f"ArithmeticTask.heldout_fraction={fraction} (split_seed={split_seed}) puts {n_heldout} of {n_total} "
            "problems in the held-out split; both splits must be non-empty"
        )


# ----------------------------------------------------------------------------- tokens


def _digits_msb(x_b: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """Digit tokens `[b, width]` of x >= 0, most significant first, and their validity
    (leading zeros invalid; 0 itself is the single digit '0')."""
    powers = 10 ** jnp.arange(width - 1, -1, -1, dtype=jnp.int32)
    digits = (x_b[:, None] // powers) % 10
    n_digits = 1 + jnp.sum(x_b[:, None] >= powers[None, :-1], axis=1)  # thresholds 10^(width-1)..10
    valid = jnp.arange(width)[None, :] >= (width - n_digits)[:, None]
    return (cv.DIGIT0_ID + digits).astype(jnp.int32), valid


def _const(token_id: int, b: int, valid=True) -> tuple[jax.Array, jax.Array]:
    return jnp.full((b, 1), token_id, jnp.int32), jnp.broadcast_to(jnp.asarray(valid), (b,))[:, None]


def pack(pieces, length: int, left_pad: bool) -> tuple[jax.Array, jax.Array]:
    """Concatenates (tokens_bw, valid_bw) pieces, keeps the valid tokens in order and
    pads them to `[b, length]`: at the end (`left_pad=False`) or the start. Returns
    (tokens_bl, mask_bl) int32; `length` must be >= the most valid tokens of a row."""
    tokens = jnp.concatenate([t for t, _ in pieces], axis=1)
    valid = jnp.concatenate([v for _, v in pieces], axis=1).astype(jnp.int32)
    rank = jnp.cumsum(valid, axis=1) - 1
    start = (length - jnp.sum(valid, axis=1, keepdims=True)) if left_pad else 0
    slot = jnp.where(valid == 1, rank + start, length)  # invalid tokens go out of range

    def row(tok_w, slot_w):
        out = jnp.full((length,), cv.PAD_ID, jnp.int32).at[slot_w].set(tok_w, mode="drop")
        mask = jnp.zeros((length,), jnp.int32).at[slot_w].set(1, mode="drop")
        return out, mask

    return jax.vmap(row)(tokens, slot)


def _answer_body_pieces(task: ArithmeticTask, answer_b: jax.Array):
    b = answer_b.shape[0]
    digits, valid = _digits_msb(jnp.abs(answer_b), task.answer_width)
    sign = _const(cv.MINUS_ID, b, answer_b < 0)
    forward = (digits, valid)
    backward = (digits[:, ::-1], valid[:, ::-1])
    if task.answer_format == "plain":
        return [sign, forward]
    if task.answer_format == "reversed":
        return [sign, backward]
    return [backward, _const(cv.SEMICOLON_ID, b), sign, forward]


def _check_given_problems(task: ArithmeticTask, lhs_b, op_b, rhs_b) -> None:
    """Raises ValueError for concrete problems outside the task (skipped under tracing)."""
    if any(isinstance(x, jax.core.Tracer) for x in (lhs_b, op_b, rhs_b)):
        return
    lhs, op, rhs = (np.asarray(x) for x in (lhs_b, op_b, rhs_b))
    allowed_ops = [cv.OPERATORS.index(o) for o in task.ops]
    for name, x in (("lhs_b", lhs), ("rhs_b", rhs)):
        bad = np.nonzero((x < 0) | (x >= 10**task.max_digits))[0]
        if len(bad):
            raise ValueError(f"make_problems: {name}[{bad[0]}]={x[bad[0]]} is outside [0, 10**max_digits)")
    bad = np.nonzero(~np.isin(op, allowed_ops))[0]
    if len(bad):
        raise ValueError(f"make_problems: op_b[{bad[0]}]={op[bad[0]]} is not an index of task.ops={task.ops} "
                         f"in OPERATORS={cv.OPERATORS}")
    if not task.allow_negative:
        bad = np.nonzero((op == cv.OPERATORS.index("-")) & (lhs < rhs))[0]
        if len(bad):
            raise ValueError(f"make_problems: problem {bad[0]} ({lhs[bad[0]]}-{rhs[bad[0]]}) is negative but "
                             "task.allow_negative=False")


def make_problems(task: ArithmeticTask, lhs_b, op_b, rhs_b) -> Problems:
    """Tokenises given problems `[b]` (op_b indexes `char_vocab.OPERATORS`); jit-able.

    Operands must be in [0, 10**max_digits), ops in `task.ops`, and differences >= 0
    unless `allow_negative`; concrete (non-traced) inputs are checked.
    """
    _check_given_problems(task, lhs_b, op_b, rhs_b)
    return _tokenised(task, *(jnp.asarray(x, jnp.int32) for x in (lhs_b, op_b, rhs_b)))


# Integer token arithmetic only, so one program is exact wherever it is called: called eagerly (a chat turn,
# a test) it compiles once per task and batch size instead of as a few dozen single-operation programs;
# inside a caller's jit it is inlined.
@functools.partial(jax.jit, static_argnums=0)
def _tokenised(task: ArithmeticTask, lhs_b: jax.Array, op_b: jax.Array, rhs_b: jax.Array) -> Problems:
    b = lhs_b.shape[0]
    answer_b = jnp.select([op_b == 0, op_b == 1], [lhs_b + rhs_b, lhs_b - rhs_b], lhs_b * rhs_b)
    op_tokens = (cv.PLUS_ID + op_b)[:, None]  # '+', '-', '*' ids are contiguous, in OPERATORS order

    def operand(x_b):
        digits, valid = _digits_msb(x_b, task.max_digits)
        return digits, (jnp.ones_like(valid) if task.pad_operands else valid)

    prompt_tokens, prompt_mask = pack(
        [_const(cv.BOS_ID, b), operand(lhs_b), (op_tokens, jnp.ones((b, 1), bool)), operand(rhs_b),
         _const(cv.EQUALS_ID, b)],
        task.prompt_len, left_pad=True)
    target_tokens, target_mask = _answer_targets(task, answer_b)
    return Problems(prompt_tokens, prompt_mask, lhs_b, op_b, rhs_b, answer_b, target_tokens, target_mask,
                    jnp.sum(target_mask, axis=1))


def read_answer(task: ArithmeticTask, response: str) -> int | None:
    """The value a response's text (without `<eos>`) states in `task.answer_format`, None when it
    states none (`'231'` reversed -> 132; `'231;132'` worked -> 132; `'-7'` -> -7)."""
    text = response.split(";")[-1] if task.answer_format == "worked" else response
    sign = -1 if text.startswith("-") else 1
    digits = text[1:] if sign < 0 else text
    if not digits.isdigit() or not digits.isascii():
        return None
    return sign * int(digits[::-1] if task.answer_format == "reversed" else digits)


def carryless_answer(lhs_b, op_b, rhs_b, max_digits: int) -> jax.Array:
    """int32 `[b]`: the answer with the classic column mistake: '+' drops every carry
    (digit i is (l_i + r_i) mod 10), '-' takes |l_i - r_i| in each column (no borrow);
    '*' rows keep the true product. Equal to the true answer exactly when no column
    carries / borrows."""
    lhs_b, op_b, rhs_b = (jnp.asarray(x, jnp.int32) for x in (lhs_b, op_b, rhs_b))
    powers = 10 ** jnp.arange(max_digits, dtype=jnp.int32)
    l_bd, r_bd = (lhs_b[:, None] // powers) % 10, (rhs_b[:, None] // powers) % 10
    plus = jnp.sum(((l_bd + r_bd) % 10) * powers, axis=1)
    minus = jnp.sum(jnp.abs(l_bd - r_bd) * powers, axis=1)
    return jnp.select([op_b == 0, op_b == 1], [plus, minus], lhs_b * rhs_b).astype(jnp.int32)


def with_answers(task: ArithmeticTask, problems: Problems, answer_b) -> Problems:
    """`problems` whose answers and targets are `answer_b` (e.g. flawed demonstrations)."""
    answer_b = jnp.asarray(answer_b, jnp.int32)
    target_tokens, target_mask = _answer_targets(task, answer_b)
    return problems._replace(answer_b=answer_b, target_tokens_ba=target_tokens, target_mask_ba=target_mask,
                             target_len_b=jnp.sum(target_mask, axis=1))


@functools.partial(jax.jit, static_argnums=0)  # one program, as `_tokenised` (inlined there)
def _answer_targets(task: ArithmeticTask, answer_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """int32 `[b, answer_len]` target tokens (the answer in `task.answer_format`, then `<eos>`) and mask."""
    return pack(_answer_body_pieces(task, answer_b) + [_const(cv.EOS_ID, answer_b.shape[0])], task.answer_len,
                left_pad=False)


# ----------------------------------------------------------------------------- sampling


def _draw_candidates(task: ArithmeticTask, key: jax.Array, shape) -> tuple[jax.Array, jax.Array, jax.Array]:
    k_op, k_nl, k_nr, k_l, k_r = jax.random.split(key, 5)
    op_ids = jnp.asarray([cv.OPERATORS.index(op) for op in task.ops], jnp.int32)
    op = op_ids[jax.random.randint(k_op, shape, 0, len(task.ops))]

    def operand(k_n, k_v):
        n = jax.random.randint(k_n, shape, task.min_digits, task.max_digits + 1)
        low = jnp.where(n == 1, 0, 10 ** (n - 1))
        return jax.random.randint(k_v, shape, low, 10**n)

    lhs, rhs = operand(k_nl, k_l), operand(k_nr, k_r)
    if not task.allow_negative:
        swap = (op == cv.OPERATORS.index("-")) & (lhs < rhs)
        lhs, rhs = jnp.where(swap, rhs, lhs), jnp.where(swap, lhs, rhs)
    return lhs, op, rhs


def sample_operands(task: ArithmeticTask, rng: jax.Array, batch: int, split: str = "train"):
    """(lhs_b, op_b, rhs_b) drawn from `split` by rejection (a while_loop over rounds of
    `_CANDIDATES_PER_ROUND` candidates per row; the first in-split candidate wins)."""
    if split not in SPLITS:
        raise ValueError(f"sample_problems: split={split!r}; expected one of {SPLITS}")
    want_heldout = split == "heldout"

    def cond(state):
        return ~jnp.all(state[-1])

    def body(state):
        key, lhs, op, rhs, done = state
        key, sub = jax.random.split(key)
        c_lhs, c_op, c_rhs = _draw_candidates(task, sub, (batch, _CANDIDATES_PER_ROUND))
        ok = is_heldout(task, c_lhs, c_op, c_rhs) == want_heldout
        first = jnp.argmax(ok, axis=1)
        found = jnp.any(ok, axis=1)
        take = found & ~done
        pick = lambda c, old: jnp.where(take, jnp.take_along_axis(c, first[:, None], axis=1)[:, 0], old)
        return key, pick(c_lhs, lhs), pick(c_op, op), pick(c_rhs, rhs), done | found

    zeros = jnp.zeros((batch,), jnp.int32)
    state = (rng, zeros, zeros, zeros, jnp.zeros((batch,), bool))
    _, lhs, op, rhs, _ = jax.lax.while_loop(cond, body, state)
    return lhs, op, rhs


def sample_problems(task: ArithmeticTask, rng: jax.Array, batch: int, split: str = "train") -> Problems:
    """`batch` random problems of `split` ('train' or 'heldout'); pure, jit/vmap/scan-able."""
    return make_problems(task, *sample_operands(task, rng, batch, split))


# ----------------------------------------------------------------------------- reward


def _fit_width(x_bt: jax.Array, width: int, fill: int) -> jax.Array:
    t = x_bt.shape[1]
    if t >= width:
        return x_bt[:, :width]
    return jnp.pad(x_bt, ((0, 0), (0, width - t)), constant_values=fill)


def target_matches(task: ArithmeticTask, problems: Problems, response_tokens_bt, response_mask_bt):
    """Boolean `[b, answer_len]`: response position i holds target token i with mask 1.

    Only target positions (i < target_len) are meaningful; a response shorter than
    answer_len counts as masked there. Tokens after the target's EOS are not read:
    generation ends at the first EOS.
    """
    tokens = _fit_width(jnp.asarray(response_tokens_bt, jnp.int32), task.answer_len, cv.PAD_ID)
    mask = _fit_width(jnp.asarray(response_mask_bt, jnp.int32), task.answer_len, 0)
    return (tokens == problems.target_tokens_ba) & (mask == 1) & (problems.target_mask_ba == 1)


def reward(task: ArithmeticTask, problems: Problems, response_tokens_bt, response_mask_bt) -> jax.Array:
    """float32 `[b]` reward of responses `[b, t]` (generated tokens, mask 1 where valid).

    exact: 1.0 iff the response's first target_len tokens are the answer then EOS
    (so an extra digit, a wrong digit or a missing/masked EOS give 0.0).
    per_token: fraction of the target_len positions that match (see ArithmeticTask).
    """
    match = target_matches(task, problems, response_tokens_bt, response_mask_bt)
    n_match = jnp.sum(match, axis=1)
    if task.reward_mode == "exact":
        return (n_match == problems.target_len_b).astype(jnp.float32)
    return n_match.astype(jnp.float32) / problems.target_len_b.astype(jnp.float32)


# The reward's parts (`reward_components`): the answer before the `<eos>`, and stopping right after it.
REWARD_COMPONENTS = (RewardComponent("answer", 1.0), RewardComponent("stop", 1.0))


def reward_components(task: ArithmeticTask, problems: Problems, response_tokens_bt, response_mask_bt) -> jax.Array:
    """float32 `[b, 2]`: the `answer` and `stop` components of `reward` (`REWARD_COMPONENTS`), whose sum it is.

    The target is the answer's `n = target_len - 1` tokens, then `<eos>`.
    exact: answer = 1 iff the n answer tokens match; stop = -1 iff they match but the `<eos>` does not
      follow them (0 otherwise), so answer + stop = 1 iff all target_len tokens match: the reward.
    per_token: answer = (matching answer tokens) / target_len, stop = [`<eos>` in place] / target_len.
    """
    match = target_matches(task, problems, response_tokens_bt, response_mask_bt)
    n_b = problems.target_len_b - 1
    eos_ok_b = jnp.take_along_axis(match, n_b[:, None], axis=1)[:, 0]
    body_b = jnp.sum(match & (jnp.arange(task.answer_len)[None, :] < n_b[:, None]), axis=1)
    if task.reward_mode == "exact":
        answer_b = body_b == n_b
        return jnp.stack([answer_b.astype(jnp.float32), jnp.where(answer_b & ~eos_ok_b, -1.0, 0.0)], axis=1)
    length_b = problems.target_len_b.astype(jnp.float32)
    return jnp.stack([body_b / length_b, eos_ok_b / length_b], axis=1).astype(jnp.float32)


def first_error_position(task: ArithmeticTask, problems: Problems, response_tokens_bt, response_mask_bt):
    """int32 `[b]`: 0-based first target position the response gets wrong, or target_len if none."""
    match = target_matches(task, problems, response_tokens_bt, response_mask_bt)
    wrong = (~match) & (problems.target_mask_ba == 1)
    return jnp.where(jnp.any(wrong, axis=1), jnp.argmax(wrong, axis=1), problems.target_len_b).astype(jnp.int32)


def solution_tokens(task: ArithmeticTask, problems: Problems) -> tuple[jax.Array, jax.Array]:
    """A correct answer (target without the EOS) as (tokens_ba, mask_ba), right-padded."""
    body = problems.target_mask_ba * (jnp.arange(task.answer_len)[None, :] < problems.target_len_b[:, None] - 1)
    return jnp.where(body == 1, problems.target_tokens_ba, cv.PAD_ID), body.astype(jnp.int32)


def feedback_tokens(task: ArithmeticTask, problems: Problems, response_tokens_bt, response_mask_bt):
    """Environment feedback for SDPO teacher contexts, `(tokens, mask)` of `[b, feedback_len]`.

    position style: `<correct>` or `<wrong><at>k` with k the 1-based first wrong target
      position (k = target_len means the EOS was missing or wrong).
    reveal style: `<correct><answer>ANSWER` or `<wrong><answer>ANSWER`.
    """
    b = problems.lhs_b.shape[0]
    error_pos = first_error_position(task, problems, response_tokens_bt, response_mask_bt)
    correct = error_pos == problems.target_len_b
    verdict = (jnp.where(correct, cv.CORRECT_ID, cv.WRONG_ID)[:, None].astype(jnp.int32), jnp.ones((b, 1), bool))
    if task.feedback_style == "position":
        digits, valid = _digits_msb(error_pos + 1, len(str(task.answer_len)))
        pieces = [verdict, _const(cv.AT_ID, b, ~correct), (digits, valid & ~correct[:, None])]
    else:
        pieces = [verdict, _const(cv.ANSWER_ID, b), solution_tokens(task, problems)]
    return pack(pieces, task.feedback_len, left_pad=False)


# ----------------------------------------------------------------------------- teacher contexts

CONTEXT_KINDS = ("none", "solution", "feedback")


def teacher_prompt(task: ArithmeticTask, problems: Problems, solution, has_solution_b, feedback, has_feedback_b,
                   solve_b) -> tuple[jax.Array, jax.Array]:
    """The SDPO / VPD teacher's prompt `[b, q]`, left-padded, q = 3 + solution width +
    feedback_len + prompt_len: `<solution> SOLUTION` where `has_solution_b`, `<feedback>
    FEEDBACK` where `has_feedback_b`, `<solve>` where `solve_b`, then the prompt.
    `solution` / `feedback`: (tokens, mask) pairs `[b, w]`."""
    b = problems.prompt_tokens_bp.shape[0]

    def tag(token_id, on_b):
        return jnp.full((b, 1), token_id, jnp.int32), jnp.asarray(on_b)[:, None].astype(jnp.int32)

    def gated(piece, on_b):
        return piece[0], piece[1] * jnp.asarray(on_b)[:, None].astype(piece[1].dtype)

    pieces = [tag(cv.SOLUTION_ID, has_solution_b), gated(solution, has_solution_b),
              tag(cv.FEEDBACK_ID, has_feedback_b), gated(feedback, has_feedback_b),
              tag(cv.SOLVE_ID, solve_b), (problems.prompt_tokens_bp, problems.prompt_mask_bp)]
    q = 3 + solution[0].shape[1] + feedback[0].shape[1] + problems.prompt_tokens_bp.shape[1]
    return pack(pieces, q, left_pad=True)


def context_prompts(task: ArithmeticTask, problems: Problems, kind_b, feedback_correct_b) -> tuple[jax.Array, jax.Array]:
    """Teacher prompts `[b, 3 + answer_len + feedback_len + prompt_len]` built as
    `ArithmeticTask.teacher_prompts` builds them for a response of width answer_len. `kind_b`
    indexes CONTEXT_KINDS: 0 -> the plain prompt (no tags); 1 -> `<solution> ANSWER <eos>
    <solve> prompt` (a sibling's correct response); 2 -> `<feedback> FEEDBACK <solve> prompt`,
    the feedback on a response that is correct where `feedback_correct_b` (the target) and
    else empty (wrong at position 1)."""
    kind_b = jnp.asarray(kind_b, jnp.int32)
    resp_mask = problems.target_mask_ba * jnp.asarray(feedback_correct_b, jnp.int32)[:, None]
    feedback = feedback_tokens(task, problems, problems.target_tokens_ba, resp_mask)
    return teacher_prompt(task, problems, (problems.target_tokens_ba, problems.target_mask_ba), kind_b == 1,
                          feedback, kind_b == 2, kind_b > 0)


def with_contexts(task: ArithmeticTask, problems: Problems, kind_b, feedback_correct_b) -> Problems:
    """`problems` whose prompts are `context_prompts(...)` (targets unchanged)."""
    tokens, mask = context_prompts(task, problems, kind_b, feedback_correct_b)
    return problems._replace(prompt_tokens_bp=tokens, prompt_mask_bp=mask)


def draw_contexts(rng, batch: int, context_fraction: float) -> tuple[jax.Array, jax.Array]:
    """(kind_b, feedback_correct_b): a context on a `context_fraction` share of rows, half
    solution, half feedback (the feedback's verdict a fair coin)."""
    k_kind, k_verdict = jax.random.split(rng)
    u = jax.random.uniform(k_kind, (batch,))
    kind = jnp.where(u < context_fraction, jnp.where(u < context_fraction / 2, 1, 2), 0)
    return kind.astype(jnp.int32), jax.random.bernoulli(k_verdict, 0.5, (batch,))


def warmup_demonstrations(task: ArithmeticTask, rng, batch: int, context_fraction: float = 0.0,
                          mistake_rate: float = 0.0) -> Problems:
    """A supervised warm-up batch of train problems (`run/warmup.py`): a `context_fraction` share
    shown with a teacher context (`draw_contexts`, true targets), and on the plain rows the target
    replaced by `carryless_answer` with probability `mistake_rate`."""
    problems = sample_problems(task, rng, batch, split="train")
    kind_b = jnp.zeros((batch,), jnp.int32)
    if context_fraction > 0:
        kind_b, correct_b = draw_contexts(jax.random.fold_in(rng, 1), batch, context_fraction)
        problems = with_contexts(task, problems, kind_b, correct_b)
    if mistake_rate > 0:
        wrong = carryless_answer(problems.lhs_b, problems.op_b, problems.rhs_b, task.max_digits)
        flawed_b = jax.random.bernoulli(jax.random.fold_in(rng, 2), mistake_rate, (batch,)) & (kind_b == 0)
        demo = with_answers(task, problems, wrong)
        problems = jax.tree.map(lambda d, t: jnp.where(flawed_b.reshape((-1,) + (1,) * (t.ndim - 1)), d, t),
                                demo, problems)
    return problems


class ArithmeticScorer:
    """The JAX reward as a host scorer (the host loop with the built-in task); teacher
    prompts are built on device (`ArithmeticTask.teacher_prompts`)."""

    def __init__(self, task: ArithmeticTask):
        self.task = task

    def score(self, problems: Problems, tokens_br, mask_br) -> Scored:
        return Scored(np.asarray(reward(self.task, problems, tokens_br, mask_br), np.float32))

    def take_counts(self) -> dict[str, int]:
        return {}  # it counts nothing

    def close(self) -> None:
        pass
