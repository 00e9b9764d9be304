"""Countdown: given `count` numbers and a target, write an arithmetic expression that uses each
number at most once and evaluates to the target (README "Add a task" builds it step by step).

A problem is `count` digits 1..`max_number` and the target `(n0 o1 n1) o2 n2 ...` (each `o` '+'
or '*', left to right); every such problem is enumerated once (`problem_tables`, cached), and a
fixed permutation (`split_seed`) holds out `heldout_fraction` of them, so no problem is in both
splits. Shown in the character vocabulary `data/text_vocab.py` as `<bos>3 5 7:56<answer>`; the
reference response is the generating expression `(3+5)*7<eos>` (the supervised warm-up's
demonstration; other expressions are right too: `7*(5+3)`).

The reward is 1.0 when the response up to its `<eos>` is a valid expression that reaches the
target, else 0.0. The expression is never run: `evaluate_expression` parses it with `ast` and
walks the tree, accepting only integer literals (each a given number, each used at most once),
+ - * / and parentheses, in exact fractions (`fractions.Fraction`; division by zero is invalid).
The reward is a JAX function that calls this check on the host (`jax.pure_callback`), so an
iteration stays one jitted scan.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import itertools
from fractions import Fraction
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.sections import RunConfig
from pipo_jax.data import text_vocab
from pipo_jax.tasks.protocol import Task, TaskCapabilities
from pipo_jax.tasks.row_split import RowSampling, RowScorer

GENERATING_OPS = ("+", "*")  # the target's expression; a response may also use '-' and '/'
MAX_EXPRESSION_CHARS = 15  # a longer response scores 0 (and the response width is this + <eos>)
_ALLOWED_CHARS = frozenset("0123456789+-*/() ")
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b}


class _Invalid(Exception):
    pass


def evaluate_expression(text: str, numbers) -> Fraction | None:
    """The exact value of `text` if it is an expression of integer literals, + - * / and
    parentheses whose literals are among `numbers` (each at most as often as given); else None
    (a syntax error, another construct such as a name, a call, '**' or a unary minus, a number
    not given or used twice, a division by zero, more than `MAX_EXPRESSION_CHARS` characters)."""
    if not text or len(text) > MAX_EXPRESSION_CHARS or not set(text) <= _ALLOWED_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    used = collections.Counter()

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise _Invalid
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used[node.value] += 1
            return Fraction(node.value)
        raise _Invalid

    try:
        result = value(tree.body)
    except _Invalid:
        return None
    given = collections.Counter(int(n) for n in numbers)
    return result if all(used[n] <= given[n] for n in used) else None


def score_text(text: str, numbers, target: int) -> float:
    """1.0 if `text` is a valid expression over `numbers` (`evaluate_expression`) equal to `target`, else 0.0."""
    return float(evaluate_expression(text, numbers) == target)


def response_text(tokens_r: np.ndarray, mask_r: np.ndarray) -> str | None:
    """The response's text before its first `<eos>` (valid tokens only), None without an `<eos>`."""
    ids = np.asarray(tokens_r)[np.asarray(mask_r) == 1]
    ends = np.nonzero(ids == text_vocab.EOS_ID)[0]
    return text_vocab.decode(ids[:ends[0]]) if len(ends) else None


class Tables(NamedTuple):
    """Every problem, once: numbers `[N, count]`, targets `[N]`, prompts left-padded `[N, P]` and
    their lengths `[N]`, references (expression + `<eos>`) right-padded `[N, A]` and lengths `[N]`,
    and the row ids of the two splits."""

    numbers_nk: np.ndarray
    target_n: np.ndarray
    prompt_tokens_np: np.ndarray
    prompt_lengths_n: np.ndarray
    reference_tokens_na: np.ndarray
    reference_lengths_n: np.ndarray
    train_rows: np.ndarray
    heldout_rows: np.ndarray


def prompt_text(numbers, target: int) -> str:
    """`3 5 7:56`: the numbers, then the target."""
    return " ".join(str(int(n)) for n in numbers) + f":{int(target)}"


def generating_expression(numbers, ops) -> str:
    """`(3+5)*7`: the numbers combined left to right by `ops`, each step but the last parenthesised."""
    text = str(int(numbers[0]))
    for i, (op, n) in enumerate(zip(ops, numbers[1:])):
        text = f"{text}{op}{int(n)}"
        if i < len(ops) - 1:
            text = f"({text})"
    return text


@functools.lru_cache(maxsize=8)
def problem_tables(count: int, max_number: int, heldout_fraction: float, split_seed: int) -> Tables:
    """Enumerates every (numbers, target) problem (the first generating expression of each kept as
    its reference) and splits them: a fixed permutation, the last round(N * fraction) held out."""
    problems: dict[tuple, str] = {}
    for numbers in itertools.product(range(1, max_number + 1), repeat=count):
        for ops in itertools.product(GENERATING_OPS, repeat=count - 1):
            expression = generating_expression(numbers, ops)
            problems.setdefault((*numbers, int(evaluate_expression(expression, numbers))), expression)
    keys = list(problems)
    n = len(keys)
    prompts = [[text_vocab.BOS_ID, *text_vocab.encode(prompt_text(k[:-1], k[-1])), text_vocab.ANSWER_ID] for k in keys]
    refs = [[*text_vocab.encode(problems[k]), text_vocab.EOS_ID] for k in keys]
    p = -(-max(map(len, prompts)) // 8) * 8
    a = MAX_EXPRESSION_CHARS + 1
    prompt_tokens = np.full((n, p), text_vocab.PAD_ID, np.int32)
    ref_tokens = np.full((n, a), text_vocab.PAD_ID, np.int32)
    for i, (ids, ref) in enumerate(zip(prompts, refs)):
        prompt_tokens[i, p - len(ids):] = ids
        ref_tokens[i, :len(ref)] = ref
    perm = np.random.default_rng(split_seed).permutation(n).astype(np.int32)
    n_held = min(max(int(round(n * heldout_fraction)), 1), n - 1)
    return Tables(numbers_nk=np.asarray([k[:-1] for k in keys], np.int32), target_n=np.asarray([k[-1] for k in keys],
                                                                                              np.int32),
                  prompt_tokens_np=prompt_tokens, prompt_lengths_n=np.asarray([len(x) for x in prompts], np.int32),
                  reference_tokens_na=ref_tokens, reference_lengths_n=np.asarray([len(x) for x in refs], np.int32),
                  train_rows=np.sort(perm[: n - n_held]), heldout_rows=np.sort(perm[n - n_held:]))


class Problems(NamedTuple):
    """A batch of countdown problems (a pytree): left-padded prompts `[b, P]`, row ids `[b]`, the
    numbers `[b, count]` and targets `[b]`, and the reference responses right-padded `[b, A]`."""

    prompt_tokens_bp: jax.Array
    prompt_mask_bp: jax.Array
    index_b: jax.Array
    numbers_bk: jax.Array
    target_b: jax.Array
    target_tokens_ba: jax.Array
    target_mask_ba: jax.Array


@dataclasses.dataclass(frozen=True)
class CountdownTask(RowSampling, Task):
    """The countdown task (hashable by its settings: jit-static).

    count: numbers per problem (2..4); max_number: the numbers are 1..max_number (<= 9: one
    character each); heldout_fraction in (0, 1) and split_seed: the held-out split.
    """

    count: int = 3
    max_number: int = 9
    heldout_fraction: float = 0.1
    split_seed: int = 0

    name: ClassVar[str] = "countdown"
    # A JAX reward (the host check through `jax.pure_callback`); many expressions are right (no
    # exact answers); the generating expression is the warm-up's demonstration; no teacher contexts.
    capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(device_reward=True, warmup=True)
    stop_token_ids: ClassVar[tuple[int, ...]] = (text_vocab.EOS_ID,)
    pad_id: ClassVar[int] = text_vocab.PAD_ID
    token_id_bound: ClassVar[int] = text_vocab.VOCAB_SIZE

    def __post_init__(self):
        if not 2 <= self.count <= 4:
            raise ValueError(f"CountdownTask.count={self.count} must be in [2, 4]")
        if not 1 <= self.max_number <= 9:
            raise ValueError(f"CountdownTask.max_number={self.max_number} must be in [1, 9] (one character each)")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"CountdownTask.heldout_fraction={self.heldout_fraction} must be in (0, 1)")

    @property
    def tables(self) -> Tables:
        return problem_tables(self.count, self.max_number, self.heldout_fraction, self.split_seed)

    @property
    def prompt_len(self) -> int:
        return int(self.tables.prompt_tokens_np.shape[1])

    @property
    def answer_len(self) -> int:
        return MAX_EXPRESSION_CHARS + 1

    @property
    def train_size(self) -> int:
        return 0  # problems are drawn with replacement: `iterations`, no epochs

    def prompt_table(self) -> None:
        """The tables are small: the programs hold them as constants (no table argument)."""
        return None

    def problems_at(self, rows_b) -> Problems:
        """The problems of table rows `rows_b` (jit-able)."""
        t, rows_b = self.tables, jnp.asarray(rows_b, jnp.int32)
        p, a = self.prompt_len, self.answer_len
        lengths, ref_lengths = jnp.asarray(t.prompt_lengths_n)[rows_b], jnp.asarray(t.reference_lengths_n)[rows_b]
        return Problems(
            prompt_tokens_bp=jnp.asarray(t.prompt_tokens_np)[rows_b],
            prompt_mask_bp=(jnp.arange(p)[None, :] >= p - lengths[:, None]).astype(jnp.int32), index_b=rows_b,
            numbers_bk=jnp.asarray(t.numbers_nk)[rows_b], target_b=jnp.asarray(t.target_n)[rows_b],
            target_tokens_ba=jnp.asarray(t.reference_tokens_na)[rows_b],
            target_mask_ba=(jnp.arange(a)[None, :] < ref_lengths[:, None]).astype(jnp.int32))

    def row_split(self) -> tuple[np.ndarray, np.ndarray]:
        return self.tables.train_rows, self.tables.heldout_rows

    def reference_responses(self, problems: Problems) -> tuple[jax.Array, jax.Array]:
        """The generating expression and `<eos>` (the warm-up's demonstrations)."""
        return problems.target_tokens_ba, problems.target_mask_ba

    def score(self, index_b, tokens_br, mask_br) -> np.ndarray:
        """Host: float32 rewards (`score_text` of each response's text before `<eos>`; 0 without
        one), any leading batch shape `[..., b]` (vmapped seeds)."""
        index_b = np.asarray(index_b)
        tokens = np.asarray(tokens_br).reshape(-1, np.shape(tokens_br)[-1])
        mask = np.asarray(mask_br).reshape(tokens.shape)
        t = self.tables
        out = np.zeros(len(tokens), np.float32)
        for i, row in enumerate(index_b.reshape(-1)):
            text = response_text(tokens[i], mask[i])
            out[i] = 0.0 if text is None else score_text(text, t.numbers_nk[row], int(t.target_n[row]))
        return out.reshape(index_b.shape)

    def reward(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        """float32 `[b]`: `score` on the host (`jax.pure_callback`; under `vmap` one call for every seed)."""
        shape = jax.ShapeDtypeStruct(problems.index_b.shape, jnp.float32)
        return jax.pure_callback(self.score, shape, problems.index_b, tokens_br, mask_br, vmap_method="broadcast_all")

    def scorer(self) -> RowScorer:
        return RowScorer(self)


def from_config(run: RunConfig) -> CountdownTask:
    """`task.name=countdown` of the typed run config `run` (`RunConfig`): the split from
    `task.heldout_fraction` / `task.split_seed` (the other settings keep their defaults)."""
    return CountdownTask(heldout_fraction=run.task.heldout_fraction, split_seed=run.task.split_seed)
