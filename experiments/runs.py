"""Running many configs of the tiny task: a shared warmed-up base model per seed, and
summaries (final held-out accuracy, area under the reward curve) read from metrics.jsonl."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from experiments import overfit
from experiments.cli import UsageError
from pipo_jax.models import hf
from pipo_jax.config.schema import to_config
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import observe, warmup
from pipo_jax.run.setup import train_spec
from pipo_jax.run.trainer import train
from pipo_jax.run.workdir import flat_config


def parse_seeds(text: str) -> list[int]:
    """'0-9' -> [0..9]; '0,3,5' -> [0, 3, 5]; anything else (or no seed) is a `UsageError` naming --seeds."""
    text = text.strip()
    try:
        if "-" in text and "," not in text:
            low, high = (int(x) for x in text.split("-"))
            if high < low:
                raise UsageError(f"--seeds={text!r}: empty range")
            return list(range(low, high + 1))
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f"--seeds={text!r}: expected 'a-b' (inclusive) or a comma list of integers") from None
    if not seeds:
        raise UsageError(f"--seeds={text!r}: no seed given")
    return seeds


WARMUP_RECORD = "warmup.json"


def warmup_record(config: RunConfig, seed: int) -> dict[str, Any]:
    """What a warmed-up base depends on: the model, the task, the warm-up and its evaluation size, and with a
    sampled stop target (`warmup.target_pass_rate` / `target_mixed_groups`) the rollout's sampling, which that
    check draws with (`WarmupSettings.from_config`), so where the warm-up stops depends on it."""
    record = {"seed": seed, "model": to_config(config.model), "task": to_config(config.task),
              "warmup": to_config(config.warmup), "eval_n": config.eval.n}
    w, r = config.warmup, config.rollout
    if w.target_pass_rate is not None or w.target_mixed_groups is not None:
        record["sampled_check"] = {"group_size": r.group_size, "temperature": r.temperature, "top_k": r.top_k,
                                   "top_p": r.top_p, "max_new_tokens": r.max_new_tokens}
    return json.loads(json.dumps(record, default=str))


def warmed_up_model(config: RunConfig, seed: int, root: str) -> str:
    """Runs the supervised warm-up of the typed `config` once for `seed` and saves it as a HF directory
    with the settings it was made with (`warmup.json`); a stored base made with other settings
    is refused (`UsageError` naming the keys), never reused."""
    path = os.path.join(root, f"base_seed{seed}")
    want = warmup_record(config, seed)
    if os.path.exists(os.path.join(path, "config.json")):
        try:
            with open(os.path.join(path, WARMUP_RECORD)) as f:
                have = json.load(f)
        except (OSError, ValueError):
            raise UsageError(f"{path}: a base model without a readable {WARMUP_RECORD}; "
                             "remove it or pass another --base_dir") from None
        want_flat, have_flat = flat_config(want), flat_config(have)
        diff = sorted(k for k in want_flat.keys() | have_flat.keys() if want_flat.get(k) != have_flat.get(k))
        if diff:
            raise UsageError(f"{path} was warmed up with other settings ({', '.join(diff[:8])}); "
                             "remove it or pass another --base_dir")
        return path
    spec = train_spec(config)
    settings = warmup.WarmupSettings.from_config(config, spec.task)
    params, _ = warmup.warmup(spec.model, spec.task, settings, seed=seed)
    # a kill while saving leaves no base that looks whole; each process its own partial directory, so two
    # processes warming up one seed at once (a sweep's parallel groups) never write into one another's
    partial = f"{path}.partial.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    hf.save(partial, spec.model, jax.device_get(params))
    with open(os.path.join(partial, WARMUP_RECORD), "w") as f:
        json.dump(want, f, indent=1)
    try:
        os.rename(partial, path)
    except OSError:
        if not os.path.exists(os.path.join(path, "config.json")):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # another process saved the same base first: keep theirs
        return warmed_up_model(config, seed, root)  # (checked against `want` as any stored base is)
    return path


def run(config: RunConfig, workdir: str, base_model: str | None) -> dict[str, Any]:
    """Trains the typed `config` from `base_model` (a HF dir; None keeps the config's own base) and summarises."""
    if base_model:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=base_model),
                                     warmup=dataclasses.replace(config.warmup, enabled=False))
    config = dataclasses.replace(config, log=dataclasses.replace(config.log, progress=False))
    out = train(config, workdir)
    # Many runs in one process: drop this run's compiled programs (their code mappings count
    # against the kernel's per-process map limit; see tests/conftest.py).
    del out["state"]
    jax.clear_caches()
    return summarise(workdir) | {"final_accuracy": out["final_accuracy"]}


def summarise(workdir: str) -> dict[str, Any]:
    """Reward / accuracy curves and their summaries from a run's metrics.jsonl (with `overfit.run_figures`)."""
    rows = observe.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    steps = np.array([r["step"] for r in rows if "reward_mean" in r])
    reward = np.array([r["reward_mean"] for r in rows if "reward_mean" in r])
    acc = [(r["step"], r["heldout_accuracy"]) for r in rows if "heldout_accuracy" in r]
    out = {
        "steps": steps.tolist(), "reward": reward.tolist(),
        "acc_steps": [a[0] for a in acc], "accuracy": [a[1] for a in acc],
        "reward_auc": float(np.mean(reward)) if len(reward) else float("nan"),
        "initial_accuracy": acc[0][1] if acc else float("nan"),
        "pi_steps": int(sum(r.get("pi_step_applied", 0) for r in rows)),
    }
    return out | overfit.run_figures(out)  # heldout_auc beside reward_auc, and the train / held-out gap_flag
