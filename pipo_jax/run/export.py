"""A policy as a Hugging Face directory other tools load (`experiments/export.py`, the trainer's
end-of-run `hf_export/`).

The directory holds:
  config.json + model.safetensors (or shards + index)  the weights, in `dtype` (default: as trained)
  tokenizer.json, tokenizer_config.json                 the built-in task's character vocabulary
                                                        (`data/char_tokenizer.py`), or the run's /
                                                        model directory's tokenizer
  generation_config.json                                eos (stop) / pad / bos ids; for the built-in
                                                        task greedy with its answer width
  README.md                                             a model card: source, step, config, metrics
                                                        at that step, commit / versions / machine
Every file is mode 0644 and the directory 0755 whatever the process umask or safetensors
(which creates files 0600) would give, so the export can be shared as it is.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import jax
import ml_dtypes
import numpy as np

from pipo_jax import provenance
from pipo_jax.data import char_tokenizer
from pipo_jax.data import char_vocab as cv
from pipo_jax.data import text_vocab
from pipo_jax.data.tokenizer import load_tokenizer, pad_token_id, stop_token_ids
from pipo_jax.models import hf, qwen3
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.run import atomic, evaluate, observe
from pipo_jax.run.checkpoint import saved_steps

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
GENERATION_CONFIG = "generation_config.json"
FILE_MODE, DIR_MODE = 0o644, 0o755
_NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
              "float16": np.dtype(np.float16)}
# Model fields the card lists.
_CARD_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings", "param_dtype")


class ExportError(ValueError):
    """A request that cannot be exported (the output is the policy itself, an unknown dtype, ...)."""


def cast_params(params: Any, dtype: str) -> Any:
    """Host copies of `params` in `dtype` ('float32' | 'bfloat16' | 'float16')."""
    if dtype not in _NP_DTYPES:
        raise ExportError(f"dtype {dtype!r}: expected one of {DTYPES}")
    return jax.tree.map(lambda x: np.asarray(x).astype(_NP_DTYPES[dtype], copy=False), params)


def metrics_at(workdir: str, step: int) -> dict[str, Any]:
    """The metrics a run logged at iteration `step` (its rows merged), {} when there are none."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    out: dict[str, Any] = {}
    for row in observe.read_metrics(path):
        if row.get("step") == step:
            out.update(row)
    return out


def _builtin_generation_config(spec: TrainSpec) -> dict[str, Any]:
    """Greedy, the task's stop / pad ids, its answer width as the budget."""
    stops = [int(i) for i in spec.task.stop_token_ids]
    return {"bos_token_id": cv.BOS_ID, "eos_token_id": stops[0] if len(stops) == 1 else stops,
            "pad_token_id": int(spec.task.pad_id), "do_sample": False, "max_new_tokens": int(spec.task.answer_len)}


def _text_vocab_note() -> str:
    return ("Tokenizer: a character vocabulary (the built-in task's tokens, then printable ASCII, one token per "
            "character; `<word>` tokens whole), as reasoning-gym's character form uses it. A prompt is `<bos>`, the "
            "question and `<answer>`; the answer follows, then `<eos>`.")


def _builtin_note(task: Any) -> str:
    """The built-in task's vocabulary and how its prompts are written (the task says), for the model card."""
    return ("Tokenizer: the built-in arithmetic task's character vocabulary (one token per character, `<word>` "
            "tokens whole). " + task.prompt_note()).strip()


def _write_tokenizer(out: str, tokenizer: Any, source_dir: str | None, max_new_tokens: int | None) -> None:
    """A text tokenizer and its generation_config.json (the source's when it has one: its eos ids
    end responses; else one from the tokenizer's eos / pad ids)."""
    tokenizer.save_pretrained(out)
    source = os.path.join(source_dir, GENERATION_CONFIG) if source_dir else None
    if source and os.path.exists(source):
        shutil.copyfile(source, os.path.join(out, GENERATION_CONFIG))
        return
    stops = stop_token_ids(tokenizer)
    gen = {"eos_token_id": stops[0] if len(stops) == 1 else list(stops), "pad_token_id": pad_token_id(tokenizer)}
    if tokenizer.bos_token_id is not None:
        gen["bos_token_id"] = int(tokenizer.bos_token_id)
    if max_new_tokens:
        gen["max_new_tokens"] = int(max_new_tokens)
    _write_json(os.path.join(out, GENERATION_CONFIG), gen)


def _write_json(path: str, obj: Any) -> None:
    atomic.write_json_atomic(path, obj)


def share_modes(path: str) -> None:
    """Every file under `path` 0644, every directory 0755."""
    os.chmod(path, DIR_MODE)
    for root, dirs, files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), DIR_MODE)
        for f in files:
            os.chmod(os.path.join(root, f), FILE_MODE)


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def model_card(model: qwen3.Qwen3Config, dtype: str, *, source: str, step: int | None,
               run_config: RunConfig | None = None, metrics: dict[str, Any] | None = None,
               tokenizer_note: str = "") -> str:
    """README.md of an export: what it is, its model config, the metrics at its step, provenance."""
    rec = provenance.record()
    head = ["---", "library_name: transformers", "tags:", "- pipo_jax", "- qwen3", "- reinforcement-learning", "---",
            ""]
    title = "# Qwen3 policy trained with pipo_jax" if run_config is not None else "# Qwen3 policy (pipo_jax export)"
    body = [title, ""]
    if step is not None:
        body.append(f"Exported from the run `{source}` at iteration {step}"
                    + (f" of {run_config.iterations}." if run_config is not None else "."))
    else:
        body.append(f"Exported from `{source}`.")
    if run_config is not None:
        pipo = "on" if run_config.pipo.enabled else "off"
        body += ["", _table([("algorithm", run_config.algorithm), ("PIPO", pipo), ("task", run_config.task.name),
                             ("seed", run_config.seed)])]
    if tokenizer_note:
        body += ["", tokenizer_note]
    body += ["", "## Model", "", _table([(k, getattr(model, k)) for k in _CARD_FIELDS if k != "param_dtype"]
                                         + [("weights", dtype)])]
    if metrics:
        shown = [(k, _fmt(v)) for k, v in sorted(metrics.items()) if k != "step" and isinstance(v, (int, float))]
        body += ["", f"## Metrics at iteration {step}", "", _table(shown)]
    body += ["", "## Provenance", "", _table([("commit", rec["commit"]), ("machine", rec["cpu_model"]),
                                               ("platform", rec["platform"])]
                                              + [(k, v) for k, v in rec["versions"].items()])]
    body += ["", "## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             "model = AutoModelForCausalLM.from_pretrained(DIR)",
             "tokenizer = AutoTokenizer.from_pretrained(DIR)",
             "ids = tokenizer(PROMPT, return_tensors='pt').input_ids",
             "out = model.generate(ids)  # generation_config.json: stop / pad ids",
             "print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))", "```", ""]
    return "\n".join(head + body)


def write_export(out: str, model: qwen3.Qwen3Config, params: Any, *, spec: TrainSpec | None = None,
                 run_config: RunConfig | None = None, tokenizer_dir: str | None = None, step: int | None = None,
                 metrics: dict[str, Any] | None = None, dtype: str | None = None, source: str = "") -> str:
    """Writes the export of (`model`, `params`) into `out`; returns `out`.

    `spec` (a run's TrainSpec): its task gives the tokenizer (the built-in task's character
    vocabulary, or the dataset task's tokenizer read from `tokenizer_dir`) and the stop / pad ids.
    Without `spec`, `tokenizer_dir` (a model directory) must hold a tokenizer.
    `dtype`: the stored weights' dtype (default the model's `param_dtype`).
    """
    dtype = dtype or model.param_dtype
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}: expected one of {DTYPES}")
    builtin = spec is not None and spec.task.tokenizer is None  # a character vocabulary
    vocab = None
    if builtin:
        vocab = next((v for v in (cv.TOKENS, text_vocab.TOKENS) if spec.task.token_id_bound <= len(v)), None)
        if vocab is None:
            raise ExportError(f"{source}: the task's ids reach {spec.task.token_id_bound}, past the character "
                              f"vocabularies ({cv.VOCAB_SIZE}, {text_vocab.VOCAB_SIZE}); no tokenizer to export")
    params = cast_params(params, dtype)
    model = model.replace(param_dtype=dtype)
    hf.save(out, model, params)
    note = ""
    if builtin:
        char_tokenizer.hf_tokenizer(vocab).save_pretrained(out)
        _write_json(os.path.join(out, GENERATION_CONFIG), _builtin_generation_config(spec))
        note = _builtin_note(spec.task) if vocab == cv.TOKENS else _text_vocab_note()
    else:
        tokenizer = spec.task.tokenizer if spec is not None else load_tokenizer(tokenizer_dir)
        max_new = run_config.rollout.max_new_tokens if run_config is not None else None
        _write_tokenizer(out, tokenizer, tokenizer_dir, max_new)
    atomic.write_text_atomic(os.path.join(out, "README.md"), model_card(
        model, dtype, source=source or out, step=step, run_config=run_config, metrics=metrics, tokenizer_note=note))
    share_modes(out)
    return out


def run_tokenizer_dir(run_config: RunConfig) -> str | None:
    """The directory of a dataset run's tokenizer (`task.dataset.tokenizer_path`, else `model.path`;
    `DatasetSettings.tokenizer_dir`), None for a run with neither."""
    return run_config.task.dataset.tokenizer_dir(run_config.model.path) or None


def export_policy(policy: str, out: str, step: int | None = None, dtype: str | None = None) -> str:
    """Exports a run workdir's checkpoint `step` (default: the newest that reads) or a HF model
    directory into `out` (see the module docstring); returns `out`."""
    if os.path.abspath(out) == os.path.abspath(policy):
        raise ExportError(f"--out={out} is the policy directory itself; export into another directory")
    is_run = os.path.isdir(os.path.join(policy, "checkpoints"))
    if is_run and step is not None:
        steps = saved_steps(os.path.join(policy, "checkpoints"))
        if step not in steps:
            raise FileNotFoundError(f"{policy}/checkpoints: no checkpoint of step {step} (saved: {steps})")
    if not is_run and step is not None:
        raise ExportError(f"--step={step}: {policy} is not a run workdir (no checkpoints/), it has one policy")
    if not is_run and os.path.exists(os.path.join(policy, "config.json")):
        load_tokenizer(policy)  # a model directory without a tokenizer is refused before any weight is read
    if not is_run:
        model, params, _ = evaluate.load_policy(policy)
        return write_export(out, model, params, tokenizer_dir=policy, dtype=dtype, source=policy)
    spec, state = evaluate.restore_run(policy, step)
    run_config = evaluate.load_run_config(policy)
    step = int(state.step)
    return write_export(out, spec.model, state.params, spec=spec, run_config=run_config, step=step,
                        metrics=metrics_at(policy, step), dtype=dtype, source=os.path.abspath(policy),
                        tokenizer_dir=run_tokenizer_dir(run_config))

