"""reasoning-gym (https://github.com/open-thought/reasoning-gym) as a task source: procedural
reasoning datasets (chain_sum, gcd, spell_backward, ...), each scored by the library's own
verifier `dataset.score_answer(answer, entry)` (some with partial credit), never a re-implementation.

`generate_entries` draws `size` entries of one dataset (its own config, seeded), drops repeated
questions (counted) and splits the rest into train / held-out rows by a fixed permutation
(`dataset.split_rows`): a question is never in both. Two ways to show them to a model:

- `ReasoningGymTask` (the CPU-sized model, no tokenizer): each question in the character vocabulary
  `data/text_vocab.py` (verbatim, or `compact`: the text every question of the dataset shares cut
  off, e.g. gcd's 'Find the Greatest Common Divisor (GCD) of these numbers: 49, 29. Give only ...'
  becomes '49, 29'), as `<bos>` question `<answer>`; the library's answer + `<eos>` is the
  reference response (the supervised warm-up's demonstration). Its reward is a JAX function that
  calls the host scorer (`jax.pure_callback`), so an iteration, and a vmapped batch of seeds, stays
  one program; a response is decoded up to its `<eos>` and scored as is.
- `load_text_task` (a model directory: a Hugging Face tokenizer and chat template): a dataset task
  (`tasks/dataset.py`) whose prompts are the library's questions with the instruction to answer in
  `<answer>...</answer>` tags, and whose host reward (`ReasoningGymReward`) extracts that answer with
  the library's `extract_answer` and scores it with `score_answer`.

Scoring runs on `workers` threads per batch (`score_texts`). The package is an optional extra:
`pip install -e ".[rg]"` (`import_reasoning_gym` says so when it is missing).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.sections import RunConfig
from pipo_jax.data import text_vocab
from pipo_jax.data import tokenizer as tok_lib
from pipo_jax.data.prompts import PromptConfig, build_prompts
from pipo_jax.data.sources import DataError, Example
from pipo_jax.tasks import dataset as dataset_lib
from pipo_jax.tasks.dataset import DatasetTask, split_rows
from pipo_jax.tasks.dataset_settings import DatasetSettings
from pipo_jax.tasks.math import resolve_workers
from pipo_jax.tasks.protocol import ContextChoice, RewardComponent, Scored, Task, TaskCapabilities, TaskConfigError
from pipo_jax.tasks.reasoning_gym_settings import OVERLONG, PROMPT_FORMS, ReasoningGymSettings
from pipo_jax.tasks.row_split import RowSampling, RowScorer

log = logging.getLogger(__name__)

EXTRA = "rg"
MISSING = ("task.name=reasoning_gym needs the reasoning-gym package (the optional extra): "
           f"pip install -e \".[{EXTRA}]\"")


def import_reasoning_gym():
    """The `reasoning_gym` module; ImportError naming the extra when it is not installed."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError(MISSING) from e
    return reasoning_gym


def parse_config(text: str) -> dict[str, Any]:
    """The dataset's own config from its JSON object text ('' = the library's defaults), as
    `ReasoningGymSettings` checked it (`task.reasoning_gym.config`: a JSON object or empty)."""
    return json.loads(text) if text else {}


class Entries(NamedTuple):
    """A dataset's generated entries after de-duplication, and its split."""

    dataset: Any  # the library's dataset object (its `score_answer`)
    entries: tuple[dict, ...]  # unique questions, in generation order
    train_rows: np.ndarray
    heldout_rows: np.ndarray
    num_generated: int
    num_duplicates: int  # entries dropped because an earlier entry has the same question


# Run by `draw_entries` in a child whose string hashes are unseeded; stdin / stdout: pickles.
_DRAW_CHILD = """
import pickle, sys
import reasoning_gym
name, config, size, seed = pickle.load(sys.stdin.buffer)
dataset = reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
pickle.dump([dataset[i] for i in range(size)], sys.stdout.buffer)
"""


def draw_entries(dataset: Any, name: str, config: dict[str, Any], size: int, seed: int) -> list[dict]:
    """Entries 0..size-1 of `dataset` (the library's dataset `name` made with `config`, `size`, `seed`),
    the same in every process. Some datasets draw from a set (isomorphic_strings:
    `rng.choice(list(set_of_letters))`), whose order follows the process's string-hash seed, random per
    process unless PYTHONHASHSEED is set: their questions would change from run to run (and between a
    stopped comparison and its resumption). They are drawn here with hashes unseeded (PYTHONHASHSEED=0):
    from `dataset` when this process runs so, else in a child process."""
    if sys.flags.hash_randomization == 0:
        return [dataset[i] for i in range(size)]
    proc = subprocess.run([sys.executable, "-c", _DRAW_CHILD], input=pickle.dumps((name, config, size, seed)),
                          capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"dataset={name!r} with config={json.dumps(config)}: drawing its entries in a child "
                         f"process (PYTHONHASHSEED=0) failed: {last}")
    return pickle.loads(proc.stdout)


def unknown_dataset(name: str, registered: Iterable[str]) -> str | None:
    """None if `name` is one of reasoning-gym's `registered` datasets; else the message: the close
    matches of `name` when there are some, every name otherwise."""
    names = sorted(registered)
    if name in names:
        return None
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    if close:
        return f"dataset={name!r} is not a reasoning-gym dataset; did you mean {' or '.join(map(repr, close))}?"
    return f"dataset={name!r} is not a reasoning-gym dataset; its {len(names)} datasets: {', '.join(names)}"


def generate_entries(name: str, config: dict[str, Any], size: int, seed: int, heldout_fraction: float) -> Entries:
    """`size` entries of dataset `name` (seed `seed`; `draw_entries`: the same in every process), repeated
    questions dropped (counted, logged), split train / held-out by a permutation of `seed` (disjoint
    questions)."""
    rg = import_reasoning_gym()
    if size < 2:
        raise ValueError(f"size={size} must be >= 2 (train and held-out rows)")
    message = unknown_dataset(name, rg.factory.DATASETS)
    if message:
        raise ValueError(message)
    try:
        dataset = rg.create_dataset(name, seed=seed, size=size, **config)
    except (ValueError, TypeError, KeyError, AssertionError) as e:
        raise ValueError(f"dataset={name!r} with config={json.dumps(config)}: {type(e).__name__}: {e}") from e
    seen, unique = set(), []
    for entry in draw_entries(dataset, name, config, size, seed):
        if entry["question"] not in seen:
            seen.add(entry["question"])
            unique.append(entry)
    if len(unique) < 2:
        raise ValueError(f"dataset={name!r}: {size} entries hold {len(unique)} distinct question(s)")
    train, heldout = split_rows(len(unique), heldout_fraction, seed)
    out = Entries(dataset, tuple(unique), train, heldout, size, size - len(unique))
    log.info("reasoning-gym %s: %d entries, %d repeated questions dropped, %d train / %d held out", name, size,
             out.num_duplicates, len(train), len(heldout))
    return out


# ----------------------------------------------------------------------------- scoring


def score_texts(dataset: Any, entries: Sequence[dict], answers: Sequence[str | None], workers: int = 1) -> np.ndarray:
    """float32 `[b]`: `dataset.score_answer(answers[i], entries[i])` (on `workers` threads)."""
    def one(i: int) -> float:
        return float(dataset.score_answer(answers[i], entries[i]))

    if workers <= 1 or len(answers) < 2:
        return np.asarray([one(i) for i in range(len(answers))], np.float32)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return np.asarray(list(pool.map(one, range(len(answers)))), np.float32)


def response_texts(tokens_br: np.ndarray, mask_br: np.ndarray) -> list[str]:
    """Each response's text in the character vocabulary, up to (without) its first `<eos>`."""
    out = []
    for row, m in zip(np.asarray(tokens_br), np.asarray(mask_br)):
        ids = row[m == 1].tolist()
        if text_vocab.EOS_ID in ids:
            ids = ids[: ids.index(text_vocab.EOS_ID)]
        out.append(text_vocab.decode(ids))
    return out


# ----------------------------------------------------------------------------- the character-vocabulary task


def compact_questions(questions: Sequence[str]) -> list[str]:
    """Each question without the text all of them share at the start and at the end (cut at a
    word boundary: a number or word is never split)."""
    first, last = min(questions), max(questions)  # the common prefix of all = that of the extremes
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    while n > 0 and first[n - 1].isalnum() and any(len(q) > n and q[n].isalnum() for q in questions):
        n -= 1
    rev = sorted(q[::-1] for q in questions)
    a, b = rev[0], rev[-1]
    m = 0
    while m < min(len(a), len(b)) and a[m] == b[m]:
        m += 1
    while m > 0 and a[m - 1].isalnum() and any(len(q) > m and q[::-1][m].isalnum() for q in questions):
        m -= 1
    out = []
    for q in questions:
        end = max(n, len(q) - m)
        out.append(q[n:end].strip())
    return out


class Problems(NamedTuple):
    """A batch of reasoning-gym problems (a pytree): left-padded prompts `[b, P]`, row ids `[b]`,
    and the library's answer + `<eos>` right-padded `[b, A]` (the reference response)."""

    prompt_tokens_bp: jax.Array
    prompt_mask_bp: jax.Array
    index_b: jax.Array
    target_tokens_ba: jax.Array
    target_mask_ba: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class ReasoningGymTask(RowSampling, Task):
    """A reasoning-gym dataset in the character vocabulary. Hashes by identity (jit-static).

    prompts / answers: each row's prompt text and the library's answer; the tables hold them as
    `<bos>` prompt `<answer>` left-padded `[N, P]` and answer `<eos>` right-padded `[N, A]`.
    """

    dataset_name: str
    source: Entries
    prompts: tuple[str, ...]
    prompt_tokens_np: np.ndarray
    prompt_lengths_np: np.ndarray
    target_tokens_np: np.ndarray
    target_lengths_np: np.ndarray
    workers: int = 1
    num_dropped: int = 0

    name: ClassVar[str] = "reasoning_gym"
    # A JAX reward (calling the library); the verifier may accept other answers or give partial
    # credit (no exact answers); the library's answers are the warm-up's demonstrations; the reward
    # splits into full and partial credit (GDPO's components).
    capabilities: ClassVar[TaskCapabilities] = TaskCapabilities(device_reward=True, warmup=True,
                                                                reward_components=True)
    tokenizer: ClassVar[Any] = None
    stop_token_ids: ClassVar[tuple[int, ...]] = (text_vocab.EOS_ID,)
    pad_id: ClassVar[int] = text_vocab.PAD_ID
    token_id_bound: ClassVar[int] = text_vocab.VOCAB_SIZE

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_tokens_np.shape[1])

    @property
    def answer_len(self) -> int:
        return int(self.target_tokens_np.shape[1])

    @property
    def sequence_len(self) -> int:
        return self.prompt_len + self.answer_len

    @property
    def train_size(self) -> int:
        return len(self.source.train_rows)

    def prompt_table(self) -> None:
        """The tables are small: the programs hold them as constants (no table argument)."""
        return None

    def problems_at(self, rows_b) -> Problems:
        rows_b = jnp.asarray(rows_b, jnp.int32)
        p, a = self.prompt_len, self.answer_len
        lengths = jnp.asarray(self.prompt_lengths_np)[rows_b]
        targets = jnp.asarray(self.target_lengths_np)[rows_b]
        return Problems(
            prompt_tokens_bp=jnp.asarray(self.prompt_tokens_np)[rows_b],
            prompt_mask_bp=(jnp.arange(p)[None, :] >= p - lengths[:, None]).astype(jnp.int32),
            index_b=rows_b, target_tokens_ba=jnp.asarray(self.target_tokens_np)[rows_b],
            target_mask_ba=(jnp.arange(a)[None, :] < targets[:, None]).astype(jnp.int32))

    def row_split(self) -> tuple[np.ndarray, np.ndarray]:
        return self.source.train_rows, self.source.heldout_rows

    def reference_responses(self, problems: Problems) -> tuple[jax.Array, jax.Array]:
        """The library's answer and `<eos>` (the warm-up's demonstrations)."""
        return problems.target_tokens_ba, problems.target_mask_ba

    def score(self, index_b, tokens_br, mask_br) -> np.ndarray:
        """Host: float32 rewards, any leading batch shape `[..., b]` (vmapped seeds)."""
        index_b = np.asarray(index_b)
        tokens = np.asarray(tokens_br).reshape(-1, np.shape(tokens_br)[-1])
        mask = np.asarray(mask_br).reshape(tokens.shape)
        entries = [self.source.entries[int(i)] for i in index_b.reshape(-1)]
        rewards = score_texts(self.source.dataset, entries, response_texts(tokens, mask), self.workers)
        return rewards.reshape(index_b.shape)

    def reward(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        """float32 `[b]`: the library's `score_answer` of each decoded response, on the host
        (`jax.pure_callback`; under `vmap` one call scores every seed's batch)."""
        shape = jax.ShapeDtypeStruct(problems.index_b.shape, jnp.float32)
        return jax.pure_callback(self.score, shape, problems.index_b, tokens_br, mask_br,
                                 vmap_method="broadcast_all")

    def reward_weights(self) -> tuple[RewardComponent, ...]:
        """`full_credit` and `partial_credit`, weight 1 each (`reward_components`)."""
        return REWARD_COMPONENTS

    def credit_parts(self, index_b, tokens_br, mask_br) -> np.ndarray:
        """Host: float32 `[..., b, 2]`, the library's score split into full credit (a score of 1) and
        partial credit (a score below 1, e.g. the answer inside a longer text); they sum to `score`."""
        scores = self.score(index_b, tokens_br, mask_br)
        full = np.where(scores >= 1.0, scores, 0.0).astype(np.float32)
        return np.stack([full, scores - full], axis=-1)

    def reward_components(self, problems: Problems, tokens_br, mask_br) -> jax.Array:
        """float32 `[b, 2]` (`REWARD_COMPONENTS`): `credit_parts` of each response, on the host."""
        shape = jax.ShapeDtypeStruct((*problems.index_b.shape, len(REWARD_COMPONENTS)), jnp.float32)
        return jax.pure_callback(self.credit_parts, shape, problems.index_b, tokens_br, mask_br,
                                 vmap_method="broadcast_all")

    def scorer(self) -> RowScorer:
        return RowScorer(self)


# The reward's parts (`reward_components`): the library's full credit, and its partial credit.
REWARD_COMPONENTS = (RewardComponent("full_credit", 1.0), RewardComponent("partial_credit", 1.0))


def _left_padded(rows: Sequence[list[int]], width: int) -> np.ndarray:
    out = np.full((len(rows), width), text_vocab.PAD_ID, np.int32)
    for i, ids in enumerate(rows):
        out[i, width - len(ids):] = ids
    return out


def keep_rows(source: Entries, kept: np.ndarray, dropped: str) -> Entries:
    """`source` with only its entries `kept` (indices, in order) and its train / held-out split
    renumbered to them; ValueError (`dropped`: what was dropped, then the split left) if a side is empty."""
    remap = np.full(len(source.entries), -1, np.int32)
    remap[kept] = np.arange(len(kept), dtype=np.int32)
    train, heldout = remap[source.train_rows], remap[source.heldout_rows]
    train, heldout = train[train >= 0], heldout[heldout >= 0]
    if len(train) == 0 or len(heldout) == 0:
        raise ValueError(f"{dropped} leave {len(train)} train / {len(heldout)} held-out rows")
    return source._replace(entries=tuple(source.entries[i] for i in kept), train_rows=train, heldout_rows=heldout)


def char_task(name: str, source: Entries, *, prompt_form: str = "compact", max_prompt_chars: int = 48,
              max_answer_chars: int = 8, overlong: str = "error", workers: int = 1) -> ReasoningGymTask:
    """The character-vocabulary task of `source`. A row whose prompt or answer is longer than the
    limits, or holds a character outside the vocabulary, raises naming it (`overlong='error'`) or is
    dropped, counted and logged by reason ('drop')."""
    if prompt_form not in PROMPT_FORMS:
        raise ValueError(f"prompt={prompt_form!r}; expected one of {PROMPT_FORMS}")
    if overlong not in OVERLONG:
        raise ValueError(f"overlong={overlong!r}; expected one of {OVERLONG}")
    questions = [e["question"] for e in source.entries]
    texts = compact_questions(questions) if prompt_form == "compact" else questions
    keep, prompts, answers = [], [], []
    dropped = {"too long": 0, "outside the vocabulary": 0}
    for i, (text, entry) in enumerate(zip(texts, source.entries)):
        answer = str(entry["answer"])
        unknown = next(((what, s, bad) for what, s in (("question", text), ("answer", answer))
                        if (bad := text_vocab.unknown_char(s)) is not None), None)
        if unknown is not None:
            what, s, bad = unknown
            if overlong == "error":
                raise ValueError(f"dataset {name!r} row {i}: {what} {s!r} has character {bad[1]!r} (position "
                                 f"{bad[0]}) outside the text vocabulary (printable ASCII and newline; or set "
                                 "task.reasoning_gym.overlong=drop)")
            dropped["outside the vocabulary"] += 1
            continue
        if len(text) > max_prompt_chars or len(answer) > max_answer_chars or not text:
            if overlong == "error":
                raise ValueError(f"dataset {name!r} row {i}: prompt {text!r} ({len(text)} chars) / answer "
                                 f"{answer!r} ({len(answer)}) over task.reasoning_gym.max_prompt_chars="
                                 f"{max_prompt_chars} / max_answer_chars={max_answer_chars} (or set "
                                 "task.reasoning_gym.overlong=drop)")
            dropped["too long"] += 1
            continue
        keep.append(i)
        prompts.append(text)
        answers.append(answer)
    num_dropped = len(texts) - len(keep)
    reasons = ", ".join(f"{n} {why}" for why, n in dropped.items() if n)
    source = keep_rows(source, np.asarray(keep, np.int32),
                       f"dataset {name!r}: {num_dropped} of {len(texts)} rows dropped ({reasons})")
    if num_dropped:
        log.warning("reasoning-gym %s: %d of %d rows dropped (%s; prompt > %d or answer > %d characters is too "
                    "long)", name, num_dropped, len(texts), reasons, max_prompt_chars, max_answer_chars)
    prompt_ids = [[text_vocab.BOS_ID, *text_vocab.encode(t), text_vocab.ANSWER_ID] for t in prompts]
    target_ids = [[*text_vocab.encode(a), text_vocab.EOS_ID] for a in answers]
    p = -(-max(len(r) for r in prompt_ids) // 8) * 8
    a = max(len(r) for r in target_ids)
    targets = np.full((len(target_ids), a), text_vocab.PAD_ID, np.int32)
    for i, ids in enumerate(target_ids):
        targets[i, :len(ids)] = ids
    return ReasoningGymTask(
        dataset_name=name, source=source, prompts=tuple(prompts), prompt_tokens_np=_left_padded(prompt_ids, p),
        prompt_lengths_np=np.asarray([len(r) for r in prompt_ids], np.int32), target_tokens_np=targets,
        target_lengths_np=np.asarray([len(r) for r in target_ids], np.int32), workers=workers,
        num_dropped=num_dropped)


# ----------------------------------------------------------------------------- with a model's tokenizer

TEXT_INSTRUCTION = ("Once you have thought it through, give the final answer in the format <answer>answer here"
                    "</answer>, only the answer inside the tags.")


@dataclasses.dataclass(frozen=True, eq=False)
class ReasoningGymTextTask(DatasetTask):
    """A reasoning-gym dataset rendered with a tokenizer's chat template (a `DatasetTask` of kind
    'reasoning_gym'): row i's entry is `source.entries[i]`; `scorer()` is `ReasoningGymReward`."""

    source: Entries | None = None
    workers: int = 1

    def scorer(self) -> ReasoningGymReward:
        return ReasoningGymReward(self)


class ReasoningGymReward:
    """Host reward of `ReasoningGymTextTask`: each response decoded (special tokens skipped), its
    `<answer>` extracted with the library's `extract_answer` (None when absent), scored by
    `score_answer`. With SDPO / VPD settings, teacher prompts show a successful sibling."""

    def __init__(self, task: ReasoningGymTextTask):
        self.task = task
        self.extract = import_reasoning_gym().utils.extract_answer

    def decode(self, tokens_br, mask_br) -> list[str]:
        return [self.task.tokenizer.decode(row[m == 1].tolist(), skip_special_tokens=True)
                for row, m in zip(np.asarray(tokens_br), np.asarray(mask_br))]

    def score_texts(self, texts: Sequence[str], index_b) -> np.ndarray:
        entries = [self.task.source.entries[int(i)] for i in np.asarray(index_b)]
        return score_texts(self.task.source.dataset, entries, [self.extract(t) for t in texts], self.task.workers)

    def score(self, problems, tokens_br, mask_br) -> Scored:
        texts = self.decode(tokens_br, mask_br)
        return Scored(self.score_texts(texts, np.asarray(problems.index_b)), texts)

    def teacher_prompts(self, problems, tokens_br, mask_br, scored: Scored, choice: ContextChoice,
                        width: int) -> tuple[np.ndarray, ...]:
        """A successful sibling's response as the solution (the library gives no feedback)."""
        del tokens_br, mask_br
        texts = scored.context
        return dataset_lib.teacher_prompts(self.task, np.asarray(problems.index_b), texts, [""] * len(texts), choice,
                                           width)

    def take_counts(self) -> dict[str, int]:
        return {}  # it counts nothing

    def close(self) -> None:
        pass


def text_task(name: str, source: Entries, tokenizer: Any, prompt_config: PromptConfig, *,
              stop_token_ids: tuple[int, ...], pad_id: int, workers: int = 1) -> ReasoningGymTextTask:
    """`source`'s questions rendered with `tokenizer`'s chat template (`prompt_config`: its
    instruction, `max_prompt_tokens` and `overlong` policy; dropped rows counted and logged)."""
    examples = [Example(prompt=e["question"], answer=e["answer"], extra={"row": i}, origin=f"{name} entry {i}")
                for i, e in enumerate(source.entries)]
    prompts = build_prompts(examples, tokenizer, prompt_config)
    kept = np.asarray([ex.extra["row"] for ex in prompts.examples], np.int32)
    source = keep_rows(source, kept, f"dataset {name!r}: {prompts.num_dropped} of {len(examples)} prompts over "
                                     f"max_prompt_tokens={prompt_config.max_prompt_tokens}")
    train, heldout = source.train_rows, source.heldout_rows
    table, lengths = dataset_lib.prompt_table(prompts.token_ids, pad_id)
    task = ReasoningGymTextTask(
        kind="reasoning_gym", prompt_tokens_np=table, prompt_lengths_np=lengths,
        references=tuple(str(e["answer"]) for e in source.entries), train_rows_np=train, heldout_rows_np=heldout,
        stop_token_ids=tuple(int(i) for i in stop_token_ids), pad_id=int(pad_id), tokenizer=tokenizer,
        prompt_config=prompt_config, origins=tuple(ex.origin for ex in prompts.examples),
        questions=tuple(ex.prompt for ex in prompts.examples), num_dropped=prompts.num_dropped,
        num_truncated=prompts.num_truncated, source=source, workers=workers)
    log.info("reasoning-gym %s: %d prompts (%d train, %d held out; %d dropped, %d truncated for length), width %d",
             name, task.size, len(train), len(heldout), task.num_dropped, task.num_truncated, task.prompt_len)
    return task


# ----------------------------------------------------------------------------- construction from a run config


def from_config(run: RunConfig) -> ReasoningGymTask | ReasoningGymTextTask:
    """A reasoning-gym dataset (`config.task.reasoning_gym`): in the character vocabulary for the task
    model, or rendered with `model.path`'s tokenizer and chat template (`task.dataset.*`'s prompt keys;
    `task.dataset.tokenizer_path` overrides the tokenizer); `run`: the typed run config (`RunConfig`)."""
    tc = run.task
    rg: ReasoningGymSettings = tc.reasoning_gym
    ds: DatasetSettings = tc.dataset
    if not rg.dataset:
        raise TaskConfigError("config.task.reasoning_gym.dataset: name a reasoning-gym dataset (e.g. chain_sum, gcd, "
                              "spell_backward)")
    try:
        import_reasoning_gym()
    except ImportError as e:
        raise TaskConfigError(f"config.task.name: {e}") from e
    try:
        source = generate_entries(rg.dataset, parse_config(rg.config), rg.size, tc.split_seed, tc.heldout_fraction)
    except ValueError as e:
        raise TaskConfigError(f"config.task.reasoning_gym: {e}") from e
    workers = resolve_workers(ds.verify_workers)
    if not run.model.path:
        try:
            return char_task(rg.dataset, source, prompt_form=rg.prompt, max_prompt_chars=rg.max_prompt_chars,
                             max_answer_chars=rg.max_answer_chars, overlong=rg.overlong, workers=workers)
        except ValueError as e:
            raise TaskConfigError(f"config.task.reasoning_gym: {e}") from e
    missing = [hint for hint in dataset_lib.settings_missing(run) if "task.dataset.path" not in hint]
    if missing:
        raise TaskConfigError("config: task.name='reasoning_gym' with model.path needs " + "; ".join(missing))
    tok_path = ds.tokenizer_dir(run.model.path)
    try:
        tokenizer = tok_lib.load_tokenizer(tok_path)
        return text_task(rg.dataset, source, tokenizer, dataset_lib.prompt_config(ds, TEXT_INSTRUCTION),
                         stop_token_ids=tok_lib.stop_token_ids(tokenizer, tok_path),
                         pad_id=tok_lib.pad_token_id(tokenizer), workers=workers)
    except (DataError, FileNotFoundError, ValueError) as e:
        if isinstance(e, TaskConfigError):
            raise
        raise TaskConfigError(f"config.task (reasoning_gym.dataset={rg.dataset!r}, tokenizer={tok_path!r}): "
                              f"{e}") from e
