"""Verifiable tasks from dataset files for RL training: math answers or code tests.

`load_dataset_task` reads a JSONL / parquet / tensorflow-datasets source, renders each
question with the tokenizer's chat template (`pipo_jax.data.prompts`), and keeps the
prompts as one left-padded token table `[N, P]`. The table (`PromptTable`) is an argument
of the jitted rollout, not a constant compiled into it; prompts are drawn inside the same
programs as the built-in task's (`sample_problems`: pure, jit-able), and only the reward
runs on the host:
`DatasetReward` decodes each response and scores it with the math verifier or the code
sandbox against the row's reference (`Problems.index_b` names the row).

A fixed permutation (`split_seed`) sets aside `heldout_fraction` of the rows, never
trained on, for the trainer's held-out accuracy.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.sections import RunConfig
from pipo_jax.data import tokenizer as tok_lib
from pipo_jax.data.prompts import DEFAULT_INSTRUCTION, PromptConfig, build_prompts, render_prompt
from pipo_jax.data.sources import DataError, Example, SourceConfig, load_examples
from pipo_jax.tasks import code
from pipo_jax.tasks.dataset_settings import DatasetSettings
from pipo_jax.tasks.math import MathVerifier, MathVerifyConfig, gold_answer, resolve_workers
from pipo_jax.tasks.protocol import ContextChoice, Scored, Task, TaskCapabilities, TaskConfigError

log = logging.getLogger(__name__)

KINDS = ("math", "code")
CODE_INSTRUCTION = "Write a Python solution in a single ```python code block."


class Problems(NamedTuple):
    """A batch of dataset problems (a pytree): left-padded prompts `[b, P]` and row ids `[b]`."""

    prompt_tokens_bp: jax.Array
    prompt_mask_bp: jax.Array
    index_b: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class DatasetTask(Task):
    """A dataset task. Hashes by identity (it is part of the jit-static `TrainSpec`).

    kind: "math" (reference answers) or "code" (tests).
    prompt_tokens_np / prompt_lengths_np: the left-padded prompt table `[N, P]` (pad id
      `pad_id`) and each prompt's length `[N]`.
    references: per row, the math answer or the code tests.
    train_rows_np / heldout_rows_np: row ids of the two splits.
    stop_token_ids, pad_id: the tokenizer's response end and padding ids.
    tokenizer, prompt_config: what rendered the prompts; responses are decoded and SDPO
      teacher prompts rendered with the same.
    origins: where each row came from ("file.jsonl:12"), for messages.
    num_dropped / num_truncated: prompts dropped or truncated for length while loading.
    """

    kind: str
    prompt_tokens_np: np.ndarray
    prompt_lengths_np: np.ndarray
    references: tuple
    train_rows_np: np.ndarray
    heldout_rows_np: np.ndarray
    stop_token_ids: tuple[int, ...]
    pad_id: int
    tokenizer: Any = None
    prompt_config: PromptConfig = PromptConfig()
    origins: tuple[str, ...] = ()
    questions: tuple = ()  # each row's prompt (text or chat messages), for SDPO teacher prompts
    num_dropped: int = 0
    num_truncated: int = 0
    math_config: MathVerifyConfig | None = None  # the host reward's settings (`scorer()`)
    sandbox_config: code.SandboxConfig | None = None

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_tokens_np.shape[1])

    @property
    def answer_len(self) -> int:
        """No natural response length: `rollout.max_new_tokens` must be set."""
        return 0

    @property
    def size(self) -> int:
        return int(self.prompt_tokens_np.shape[0])

    # ------------------------------------------------------------- the Task protocol (tasks/protocol.py)

    @property
    def name(self) -> str:
        return self.kind

    @property
    def capabilities(self) -> TaskCapabilities:
        """A host reward; teacher contexts (a sibling's solution or the verifier's feedback); math
        tasks also score `eval.benchmarks`."""
        return TaskCapabilities(teacher_contexts=True, answer_benchmarks=self.kind == "math")

    @property
    def token_id_bound(self) -> int:
        return int(max(self.prompt_tokens_np.max(), max(self.stop_token_ids), self.pad_id)) + 1

    @property
    def train_size(self) -> int:
        return len(self.train_rows_np)

    def prompt_table(self) -> PromptTable:
        return prompt_arrays(self)

    def sample_problems(self, table: PromptTable, rng: jax.Array, n: int, split: str = "train") -> Problems:
        if table is None:
            raise ValueError(f"the {self.kind} task samples from its prompt table: pass table=task.prompt_table() "
                             "(placed on device)")
        return sample_problems(table, rng, n, split)

    def heldout_problems(self, table: PromptTable, n: int, rng: jax.Array) -> Problems:
        """The first `n` held-out rows (the same rows every time; `rng` unused)."""
        del rng
        if table.heldout_rows.shape[0] == 0:
            raise ValueError("the dataset task has no held-out rows: set task.heldout_fraction > 0")
        return problems_at(table, table.heldout_rows[:n])

    def scorer(self) -> DatasetReward:
        return DatasetReward(self, self.math_config, self.sandbox_config)


def prompt_table(token_ids: Sequence[Sequence[int]], pad_id: int, multiple: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded int32 table `[N, P]` (P = longest prompt rounded up to `multiple`) and lengths `[N]`."""
    lengths = np.asarray([len(ids) for ids in token_ids], np.int32)
    if len(lengths) == 0 or lengths.min() < 1:
        raise ValueError("every prompt needs at least one token")
    width = -(-int(lengths.max()) // multiple) * multiple
    table = np.full((len(token_ids), width), pad_id, np.int32)
    for i, ids in enumerate(token_ids):
        table[i, width - len(ids):] = ids
    return table, lengths


def split_rows(n: int, heldout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows): a fixed permutation, the last `round(n * fraction)` held out
    (at least one each when the fraction is in (0, 1))."""
    if not 0 <= heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction} must be in [0, 1)")
    perm = np.random.default_rng(seed).permutation(n).astype(np.int32)
    n_held = int(round(n * heldout_fraction))
    if heldout_fraction > 0:
        n_held = min(max(n_held, 1), n - 1)
    if n - n_held < 1:
        raise ValueError(f"{n} rows leave nothing to train on with heldout_fraction={heldout_fraction}")
    return np.sort(perm[: n - n_held]), np.sort(perm[n - n_held:])


def check_math_references(examples: Sequence[Example]) -> None:
    """Every example's reference answer is one the math scorer reads (`gold_answer`: a string or
    number, a balanced ``\\boxed``, not empty); else a `DataError` naming the first bad row."""
    for ex in examples:
        if ex.answer is None or (isinstance(ex.answer, str) and not ex.answer.strip()):
            raise DataError(f"{ex.origin}: empty reference answer")
        try:
            gold_answer(ex.answer)
        except (TypeError, ValueError) as e:
            raise DataError(f"{ex.origin}: reference answer: {e}") from None


def references_of(kind: str, examples: Sequence[Example], tests_field: str) -> tuple:
    """Per example: the reference answer (math) or the parsed tests (code); errors name the row."""
    if kind == "math":
        check_math_references(examples)
        return tuple(ex.answer for ex in examples)
    out = []
    for ex in examples:
        try:
            out.append(tuple(code.tests_from_spec(ex.extra.get(tests_field))))
        except ValueError as e:
            raise DataError(f"{ex.origin}: field {tests_field!r}: {e}") from e
    return tuple(out)


def load_dataset_task(kind: str, examples: Sequence[Example], tokenizer: Any, prompt_config: PromptConfig, *,
                      stop_token_ids: tuple[int, ...], pad_id: int, heldout_fraction: float, split_seed: int,
                      tests_field: str = "tests") -> DatasetTask:
    """Builds the task from loaded `examples` (see `pipo_jax.data.sources.load_examples`)."""
    if kind not in KINDS:
        raise ValueError(f"dataset task kind {kind!r} is not one of {KINDS}")
    if kind == "math":  # every row's reference, also of a prompt dropped for length, before any training
        check_math_references(examples)
    prompts = build_prompts(examples, tokenizer, prompt_config)
    if not prompts.examples:
        raise ValueError(f"no prompts left out of {len(examples)} examples (all longer than "
                         f"max_prompt_tokens={prompt_config.max_prompt_tokens})")
    table, lengths = prompt_table(prompts.token_ids, pad_id)
    train_rows, heldout_rows = split_rows(len(prompts.examples), heldout_fraction, split_seed)
    task = DatasetTask(
        kind=kind, prompt_tokens_np=table, prompt_lengths_np=lengths,
        references=references_of(kind, prompts.examples, tests_field), train_rows_np=train_rows,
        heldout_rows_np=heldout_rows, stop_token_ids=tuple(int(i) for i in stop_token_ids), pad_id=int(pad_id),
        tokenizer=tokenizer, prompt_config=prompt_config,
        origins=tuple(ex.origin for ex in prompts.examples), questions=tuple(ex.prompt for ex in prompts.examples),
        num_dropped=prompts.num_dropped,
        num_truncated=prompts.num_truncated)
    log.info("%s task: %d prompts (%d train, %d held out; %d dropped, %d truncated for length), prompt width %d",
             kind, task.size, len(train_rows), len(heldout_rows), task.num_dropped, task.num_truncated,
             task.prompt_len)
    return task


class PromptTable(NamedTuple):
    """A dataset task's prompts as arrays (a pytree): what the jitted rollout takes as an
    argument, so the compiled program holds no copy of the dataset and serves any table of
    the same shapes. tokens_np: left-padded `[N, P]`; lengths_n `[N]`; train_rows /
    heldout_rows: row ids of the two splits."""

    tokens_np: Any
    lengths_n: Any
    train_rows: Any
    heldout_rows: Any


def prompt_arrays(task: DatasetTask) -> PromptTable:
    """`task`'s prompt table as host (numpy) arrays; `jax.device_put` it once and pass it to the programs."""
    return PromptTable(tokens_np=task.prompt_tokens_np, lengths_n=task.prompt_lengths_np,
                       train_rows=task.train_rows_np, heldout_rows=task.heldout_rows_np)


def problems_at(table: PromptTable, rows_b: jax.Array) -> Problems:
    """The problems of table rows `rows_b` (jit-able, the table an argument)."""
    p = table.tokens_np.shape[1]
    rows_b = jnp.asarray(rows_b, jnp.int32)
    tokens = jnp.asarray(table.tokens_np)[rows_b]
    lengths = jnp.asarray(table.lengths_n)[rows_b]
    mask = (jnp.arange(p)[None, :] >= p - lengths[:, None]).astype(jnp.int32)
    return Problems(prompt_tokens_bp=tokens, prompt_mask_bp=mask, index_b=rows_b)


def sample_problems(table: PromptTable, rng: jax.Array, batch: int, split: str = "train") -> Problems:
    """`batch` problems drawn uniformly (with replacement) from `split`; pure and jit-able."""
    rows = {"train": table.train_rows, "heldout": table.heldout_rows}.get(split)
    if rows is None:
        raise ValueError(f"split {split!r} is not 'train' or 'heldout'")
    if rows.shape[0] == 0:
        raise ValueError(f"the {split} split is empty (task.heldout_fraction)")
    pick = jax.random.randint(rng, (batch,), 0, rows.shape[0])
    return problems_at(table, jnp.asarray(rows)[pick])


# ----------------------------------------------------------------------------- SDPO teacher prompts

SOLUTION_CONTEXT = "Here is a correct solution to this problem:\n{text}\n\nNow solve the problem yourself."
FEEDBACK_CONTEXT = "Feedback on an earlier attempt at this problem:\n{text}\n\nNow solve the problem again."


def with_context(question, context: str):
    """The question (text, or chat messages: the last user turn) followed by `context`."""
    if isinstance(question, str):
        return question + "\n\n" + context
    messages = [dict(m) for m in question]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last]["content"] = messages[last]["content"] + "\n\n" + context
    return messages


def teacher_prompt_ids(tokenizer: Any, prompt_config: PromptConfig, question, context: str, width: int) -> list[int]:
    """Token ids of the chat-template prompt of `question` plus `context`, at most `width` long:
    a context that does not fit is cut (at token level, from its end) until the prompt fits."""
    def ids_for(ctx: str) -> list[int]:
        text = render_prompt(tokenizer, with_context(question, ctx), prompt_config)
        return list(tokenizer(text, add_special_tokens=prompt_config.add_special_tokens)["input_ids"])

    ids = ids_for(context)
    ctx_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    while len(ids) > width and ctx_ids:
        ctx_ids = ctx_ids[: max(0, len(ctx_ids) - (len(ids) - width) - 1)]
        ids = ids_for(tokenizer.decode(ctx_ids))
    return ids if len(ids) <= width else []


def teacher_prompts(task: DatasetTask, index_b, responses: Sequence[str], feedback: Sequence[str],
                    choice: ContextChoice, width: int) -> tuple[np.ndarray, ...]:
    """SDPO teacher prompts `[B, width]` (left-padded) and `has_context_b`: the question with the
    chosen sibling's response as the solution (`choice.has_demo_b`), else the verifier's feedback
    on this response (`choice.feedback_b`, when there is feedback); rows with neither get
    has_context 0 and an empty prompt. Host (numpy) function."""
    demo_b, has_demo_b, feedback_b = (np.asarray(x) for x in choice)
    b = len(responses)
    index_b = np.asarray(index_b)
    tokens = np.full((b, width), task.pad_id, np.int32)
    mask = np.zeros((b, width), np.int32)
    has = np.zeros((b,), np.float32)
    for i in range(b):
        if has_demo_b[i]:
            context = SOLUTION_CONTEXT.format(text=responses[int(demo_b[i])])
        elif feedback_b[i] and feedback[i]:
            context = FEEDBACK_CONTEXT.format(text=feedback[i])
        else:
            continue
        ids = teacher_prompt_ids(task.tokenizer, task.prompt_config, task.questions[int(index_b[i])], context, width)
        if ids:
            tokens[i, width - len(ids):], mask[i, width - len(ids):], has[i] = ids, 1, 1.0
    return tokens, mask, has


# ----------------------------------------------------------------------------- host reward


class DatasetReward:
    """Host reward of a dataset task: `rewards_b, feedback_b = reward(tokens_br, mask_br, index_b)`.

    Decodes each response's valid tokens (special tokens skipped; the task's tokenizer) and scores it against
    its row's reference with the math verifier (answers) or the code sandbox (tests).
    A context manager: the math verifier's worker processes stop on `close()`.
    `take_counts()`: the responses since the last call that a time budget left unscored, wholly or
    partly (``reward/unscored_count``; code: `SandboxConfig.response_budget_s` / `batch_budget_s`), and
    for a math task those whose own check timed out (``reward/check_timeouts``).
    """

    def __init__(self, task: DatasetTask, math_config=None, sandbox_config=None):
        self.task = task
        self.tokenizer = task.tokenizer
        self.verifier = None
        self._sandbox = sandbox_config
        self._counts = {"reward/unscored_count": 0, "reward/check_timeouts": 0} if task.kind == "math" else {
            "reward/unscored_count": 0}
        if task.kind == "math":
            self.verifier = MathVerifier(math_config or MathVerifyConfig())
        elif self._sandbox is None:
            self._sandbox = code.SandboxConfig()

    def decode(self, tokens_br, mask_br) -> list[str]:
        tokens_br, mask_br = np.asarray(tokens_br), np.asarray(mask_br)
        return [self.tokenizer.decode(row[m == 1].tolist(), skip_special_tokens=True)
                for row, m in zip(tokens_br, mask_br)]

    def score_texts(self, texts: Sequence[str], index_b) -> tuple[np.ndarray, list[str]]:
        refs = [self.task.references[int(i)] for i in np.asarray(index_b)]
        if self.task.kind == "math":
            results = self.verifier.score_batch(list(texts), refs)
            self._counts["reward/unscored_count"] += sum(r.unscored for r in results)
            self._counts["reward/check_timeouts"] += sum(r.status == "timeout" and not r.unscored for r in results)
        else:
            results = code.score_code_batch(list(texts), refs, self._sandbox)
            self._counts["reward/unscored_count"] += sum(r.unscored for r in results)
        return np.asarray([r.reward for r in results], np.float32), [r.feedback for r in results]

    def __call__(self, tokens_br, mask_br, index_b) -> tuple[np.ndarray, list[str]]:
        return self.score_texts(self.decode(tokens_br, mask_br), index_b)

    def score(self, problems: Problems, tokens_br, mask_br) -> Scored:
        """Rewards of the responses; `context`: their decoded texts and the verifier's feedback
        (what `teacher_prompts` renders)."""
        texts = self.decode(tokens_br, mask_br)
        rewards_b, feedback = self.score_texts(texts, np.asarray(problems.index_b))
        return Scored(rewards_b, (texts, feedback))

    def teacher_prompts(self, problems: Problems, tokens_br, mask_br, scored: Scored, choice: ContextChoice,
                        width: int) -> tuple[np.ndarray, ...]:
        """SDPO / VPD teacher prompts of the learner's `choice` (`teacher_prompts`: the chosen
        sibling's solution, else the verifier's feedback), `width` tokens wide."""
        del tokens_br, mask_br  # rendered from the decoded texts in `scored.context`
        texts, feedback = scored.context
        return teacher_prompts(self.task, np.asarray(problems.index_b), texts, feedback, choice, width)

    def benchmark_inputs(self) -> tuple[Any, PromptConfig, MathVerifier]:
        """(tokenizer, prompt config, math verifier) that `eval.benchmarks` renders and scores with."""
        if self.verifier is None:
            raise ValueError(f"the {self.task.kind} task has no answer benchmarks (capabilities.answer_benchmarks)")
        return self.tokenizer, self.task.prompt_config, self.verifier

    def take_counts(self) -> dict[str, int]:
        """The counts since the last call (then reset)."""
        out = dict(self._counts)
        self._counts = dict.fromkeys(self._counts, 0)
        return out

    def close(self) -> None:
        if self.verifier is not None:
            self.verifier.close()

    def __enter__(self) -> DatasetReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------- construction from a run config


def prompt_config(ds, auto_instruction: str) -> PromptConfig:
    """A text task's `PromptConfig` from its `config.task.dataset` section (`instruction=auto`:
    `auto_instruction`)."""
    instruction = auto_instruction if ds.instruction == "auto" else ds.instruction
    thinking = None if ds.enable_thinking == "template" else ds.enable_thinking == "true"
    try:
        return PromptConfig(style=ds.prompt_style, instruction=instruction, enable_thinking=thinking,
                            max_prompt_tokens=ds.max_prompt_tokens, overlong=ds.overlong)
    except ValueError as e:
        raise TaskConfigError(f"config.task.dataset: {e}") from e


def settings_missing(run: RunConfig) -> list[str]:
    """What a text task (math / code / reasoning-gym with a tokenizer) needs and the typed run config
    `run` (`RunConfig`) lacks, one `--config...` hint each."""
    out = []
    if not run.model.path:
        out.append("--config.model.path=/path/to/hf_model (a Hugging Face model and its tokenizer)")
    if not run.task.dataset.path:
        out.append("--config.task.dataset.path=FILE (a JSONL / parquet file or tfds name)")
    if run.log.jit_loop:
        out.append("--config.log.jit_loop=false (the reward is computed on the host)")
    if run.rollout.max_new_tokens < 1:
        out.append("--config.rollout.max_new_tokens=N (the response budget; there is no task default)")
    if run.warmup.enabled:
        out.append("--config.warmup.enabled=false (the warm-up trains the built-in task's model)")
    return out


def math_from_config(run: RunConfig) -> DatasetTask:
    """`task.name=math`: `dataset_from_config`."""
    return dataset_from_config(run)


def code_from_config(run: RunConfig) -> DatasetTask:
    """`task.name=code`: the sandbox checked first (`check_sandbox`), then `dataset_from_config`."""
    missing = settings_missing(run)
    if not missing:
        check_sandbox(run.task)
    return dataset_from_config(run)


def dataset_from_config(run: RunConfig) -> DatasetTask:
    """Loads `task.dataset.path` of the typed run config `run` (`RunConfig`) with the tokenizer of
    `task.dataset.tokenizer_path` (default `model.path`); math reads `task.math`, code `task.code`."""
    tc = run.task
    ds: DatasetSettings = tc.dataset
    missing = settings_missing(run)
    if missing:  # every one at once, not one per start
        raise TaskConfigError(f"config: task.name={tc.name!r} needs " + "; ".join(missing))
    tok_path = ds.tokenizer_dir(run.model.path)
    is_math = tc.name == "math"
    tests_field = tc.code.tests_field
    prompts = prompt_config(ds, DEFAULT_INSTRUCTION if is_math else CODE_INSTRUCTION)
    try:
        tokenizer = tok_lib.load_tokenizer(tok_path)
        source = SourceConfig(ds.path, format=ds.format, prompt_field=ds.prompt_field,
                              answer_field=tc.math.answer_field if is_math else None,
                              extra_fields=() if is_math else (tests_field,),
                              split=ds.tfds_split, limit=ds.limit or None,
                              data_dir=ds.data_dir or None, tfds_download=ds.tfds_download)
        examples = load_examples(source)
        task = load_dataset_task(
            tc.name, examples, tokenizer, prompts, stop_token_ids=tok_lib.stop_token_ids(tokenizer, tok_path),
            pad_id=tok_lib.pad_token_id(tokenizer), heldout_fraction=tc.heldout_fraction,
            split_seed=tc.split_seed, tests_field=tests_field)
    except (DataError, FileNotFoundError, ValueError, ImportError) as e:  # ImportError: format=tfds without tfds
        raise TaskConfigError(f"config.task.dataset (path={ds.path!r}, tokenizer={tok_path!r}): {e}") from e
    return dataclasses.replace(task, math_config=math_verify_config(tc), sandbox_config=sandbox_config(tc))


def math_verify_config(tc) -> MathVerifyConfig:
    """The math verifier's settings from the typed `config.task` (its `dataset` and `math` sections)."""
    ds, ms = tc.dataset, tc.math
    return MathVerifyConfig(answer_pattern=ms.answer_pattern or None, timeout_s=ds.verify_timeout_s,
                            batch_budget_s=ds.verify_batch_budget_s, num_workers=ds.verify_workers)


def sandbox_config(tc) -> code.SandboxConfig:
    """The code sandbox's settings from the typed `config.task` (its `dataset` and `code` sections)."""
    ds, cs = tc.dataset, tc.code
    try:
        return code.SandboxConfig(timeout_s=ds.verify_timeout_s, memory_mb=cs.sandbox_memory_mb,
                                  allow_unconfined=cs.sandbox_allow_unconfined,
                                  allow_network=cs.sandbox_allow_network,
                                  max_workers=resolve_workers(ds.verify_workers), scratch_mb=cs.sandbox_scratch_mb,
                                  scratch_files=cs.sandbox_scratch_files,
                                  response_budget_s=cs.sandbox_response_budget_s,
                                  batch_budget_s=ds.verify_batch_budget_s)
    except ValueError as e:
        raise TaskConfigError(f"config.task.code: {e}") from e


def check_sandbox(tc) -> None:
    """The code sandbox can run generated programs here under `config.task.code`'s settings; else an
    error naming the key that would allow it (before any file is read)."""
    config = sandbox_config(tc)
    for key, check in (("sandbox_allow_unconfined", code.check_confinement),
                       ("sandbox_allow_network", code.check_network_isolation)):
        try:
            check(config)
        except code.SandboxUnavailable as e:
            raise TaskConfigError(f"config.task.code.{key}: {e}") from e
    try:
        code.check_process_bound(config)
    except code.SandboxUnavailable as e:
        raise TaskConfigError(f"config.task.code: {e}") from e
