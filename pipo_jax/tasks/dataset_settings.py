"""config.task.dataset / task.math / task.code: the keys of the tasks read from a dataset file
(`dataset.py`: math and code; reasoning-gym rendered with a tokenizer uses the prompt keys), declared
beside their code. This module imports only the schema, so declaring the config loads no task."""

from __future__ import annotations

import dataclasses
import re

from pipo_jax.config.schema import Section, above, at_least, key

FORMATS = ("auto", "jsonl", "parquet", "tfds")
PROMPT_STYLES = ("instruct", "base")
THINKING = ("template", "true", "false")
OVERLONG_MODES = ("drop", "truncate_left", "truncate_right", "error")


def _regex(text: str) -> str | None:
    try:
        re.compile(text)
    except re.error as e:
        return f"{text!r} is not a valid regex ({e})"
    return None


@dataclasses.dataclass(frozen=True)
class DatasetSettings(Section):
    """The file, its fields, the prompt rendering and the verifier's limits."""

    _section = "task.dataset"
    path: str = key("", "JSONL / JSONL.gz / parquet file, or a tensorflow-datasets name (format=tfds); prompts "
                    "through the tokenizer's chat template, rewards verified on the host (needs model.path and "
                    "log.jit_loop=false)")
    format: str = key("auto", "auto (by the file's extension) | jsonl | parquet | tfds", choices=FORMATS)
    tfds_split: str = key("train", "tfds: the split")
    data_dir: str = key("", "tfds: the directory of prepared datasets (\"\" = tfds's default, ~/tensorflow_datasets)")
    tfds_download: bool = key(False, "tfds: download and prepare a dataset data_dir lacks (else: an error naming it)")
    limit: int = key(0, "first rows only; 0 = all", at_least(0))
    prompt_field: str = key("problem", "the prompt's (dotted) field name")
    tokenizer_path: str = key("", "\"\" = model.path")
    prompt_style: str = key("instruct", "instruct | base (see pipo_jax.data.prompts)", choices=PROMPT_STYLES)
    instruction: str = key("auto", "auto = the task's default; \"\" = none")
    enable_thinking: str = key("template", "template (its default) | true | false", choices=THINKING)
    max_prompt_tokens: int = key(512, "longest prompt in tokens (longer ones follow task.dataset.overlong)",
                                 at_least(1))
    overlong: str = key("drop", "drop (counted, logged) | truncate_left | truncate_right | error",
                        choices=OVERLONG_MODES)
    verify_timeout_s: float = key(5.0, "math: per answer (extraction + check); code: per test", above(0))
    verify_batch_budget_s: float = key(60.0, "wall-clock budget of one batch's checks (math answers, code tests); "
                                       "what is not checked by then scores 0 and is counted (metric "
                                       "reward/unscored_count)", above(0))
    verify_workers: int = key(0, "math verifier processes / concurrent code sandboxes / reasoning-gym scoring "
                              "threads; 0 = one per CPU core (max 16)", at_least(0))

    def tokenizer_dir(self, model_path: str) -> str:
        """The directory of a text task's tokenizer: `tokenizer_path`, else the model's (`model.path`);
        "" when neither is set."""
        return self.tokenizer_path or model_path


@dataclasses.dataclass(frozen=True)
class MathSettings(Section):
    """`task.name=math`: the reference answer and how the final answer is found."""

    _section = "task.math"
    answer_field: str = key("answer", "the reference answer's (dotted) field")
    answer_pattern: str = key("", "regex for the final answer instead of \\boxed{}", _regex)


@dataclasses.dataclass(frozen=True)
class CodeSettings(Section):
    """`task.name=code`: the tests and the sandbox generated programs run in."""

    _section = "task.code"
    tests_field: str = key("tests", "assert list, [{input, output}] or APPS input_output")
    sandbox_memory_mb: int = key(1024, "memory of one sandbox", at_least(1))
    sandbox_scratch_mb: int = key(64, "the sandbox's scratch directory as a whole (a tmpfs)", at_least(1))
    sandbox_scratch_files: int = key(10_000, "files and directories the scratch directory may hold", at_least(1))
    sandbox_response_budget_s: float = key(20.0, "wall-clock seconds for all of one response's tests; what is not "
                                           "checked by then scores 0 and is counted", above(0))
    sandbox_allow_unconfined: bool = key(False, "run generated programs even where the kernel has no Landlock "
                                         "(file system then open to them)")
    sandbox_allow_network: bool = key(False, "run generated programs even where there is no network namespace; "
                                      "then only a Python audit hook, which ctypes gets past, keeps them off the "
                                      "network")
