"""Run observability: metrics.jsonl, TensorBoard event files, optional W&B, a console
progress bar, and PNG plots of the PIPO signals at the end of a run.

No sink blocks or stops training: every write is synchronous (TensorBoard's too, `event_file.py`)
and a failed one (a full disk, a quota, a FIFO put in a file's place, W&B's error) is one warning
line naming the sink, once until it writes again; its rows meanwhile are dropped and counted, and
the row that writes again says how many in one line. The run's checkpoints are what keeps its
state: a checkpoint that cannot be written stops the run (`trainer.train`)."""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Iterable

import numpy as np

from pipo_jax.run import atomic, metric_keys
from pipo_jax.run.event_file import ScalarEventFile
from pipo_jax.run.workdir import WorkdirError

log = logging.getLogger(__name__)

PROGRESS_KEYS = (("reward_mean", "reward"), ("xi", "xi"), ("c", "c"), ("heldout_accuracy", "acc"),
                 ("tokens_per_s", "tok/s"))


def _scalar(v) -> float | None:
    try:
        x = float(np.asarray(v))
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _check_row(row: Any) -> dict[str, Any]:
    """`row` if it is a metrics row (a JSON object whose "step" is an integer), else ValueError."""
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f'"step" is {step!r}, not an integer')
    return row


def _parse_rows(path: str) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a metrics.jsonl and the text of a torn last line (None if the file ends
    cleanly). A last line that is not a metrics row (`_check_row`: it does not parse, or its
    "step" is no integer) is what a kill mid-write leaves, or a hand edit: kept aside like a
    torn one; any other such line is damage, an error naming the file and line."""
    if not os.path.exists(path):
        return [], None
    with atomic.open_regular(path, errors="replace") as f:  # a FIFO in its place: one line, never a hang
        lines = f.read().split("\n")
    rows, torn = [], None
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    for n, (lineno, line) in enumerate(numbered):
        try:
            row = _check_row(json.loads(line))
        except (ValueError, RecursionError) as e:  # RecursionError: a line nested thousands deep
            if n == len(numbered) - 1:
                torn = line
                break
            raise WorkdirError(f"{path}:{lineno}: not a metrics row ({e}); move the file aside to resume") from None
        rows.append(row)
    return rows, torn


def _one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: first line` of `e`, clipped."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (one dict per iteration or event), keys an earlier run wrote
    under a name since renamed read under today's (`metric_keys.RENAMED`); a torn last line (a
    kill mid-write) is left out with a warning."""
    rows, torn = _parse_rows(path)
    if torn is not None:
        log.warning("%s: the last line is torn (a run killed mid-write), left out: %r", path, torn[:80])
    return [{metric_keys.current_name(k): v for k, v in row.items()} for row in rows]


class RunLogger:
    """Writes each iteration's scalars to every sink; `close()` flushes and draws the plots."""

    def __init__(self, workdir: str, *, total: int, tensorboard: bool = True, wandb: bool = False,
                 wandb_project: str = "pipo_jax", progress: bool = True, run_config: dict | None = None,
                 start_step: int | None = None, enabled: bool = True):
        """`start_step`: the iteration a resumed run restarts from (None: a fresh run). Rows an
        earlier attempt logged after it (all of them on a fresh run) move to
        `metrics.superseded.jsonl`. `enabled=False` (processes other than 0 of a multi-process
        job): every method does nothing."""
        self.enabled = enabled
        self.workdir = workdir
        self._failing: dict[str, list[int]] = {}  # sink -> the steps of the rows it dropped since it failed
        self._keys_seen: set[str] = set()  # keys checked against `metric_keys` (each once)
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
        self._truncate_after(start_step)
        self._tb = None
        if tensorboard:
            # A SessionLog START at the iteration after the resumed checkpoint (0 on a fresh start)
            # purges the events a previous attempt logged from there on, as `_truncate_after` does
            # for metrics.jsonl. The suffix keeps a resumed attempt from reusing the earlier file,
            # whose name has only the second it was opened.
            self._tb = ScalarEventFile(os.path.join(workdir, "tensorboard"),
                                       purge_step=0 if start_step is None else start_step + 1,
                                       filename_suffix=f".from{start_step or 0}")
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError as e:
                raise ImportError("config.log.wandb=True needs the 'track' extra: pip install -e \".[track]\"") from e
            self._wandb = self._guarded("W&B", start_step or 0,
                                        lambda: wandb_lib.init(project=wandb_project, config=run_config, dir=workdir))
        self._bar = None
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start_step or 0, desc="PIPO" if run_config is None else
                             run_config.get("algorithm", "train"), dynamic_ncols=True)

    def _guarded(self, sink: str, step: int, write):
        """`write()` (its result), or None when it raises: a warning line the first time `sink` fails
        (then its rows are dropped, counted, until one writes again, said in one line)."""
        try:
            out = write()
        except Exception as e:  # noqa: BLE001 - no sink's failure may stop training
            dropped = self._failing.setdefault(sink, [])
            if not dropped:
                log.warning("%s: a write failed (%s): training goes on; its rows are dropped until it writes again",
                            sink, _one_line(e))
            dropped.append(step)
            return None
        dropped = self._failing.pop(sink, None)
        if dropped:
            log.warning("%s: written again; %d rows of iterations %d-%d were dropped", sink, len(dropped), dropped[0],
                        dropped[-1])
        return out

    def _check_declared(self, row: dict[str, Any]) -> None:
        """One warning naming the keys of `row` first seen here that `metric_keys` does not declare (so
        docs/metrics.md does not explain them); the row is written whole either way."""
        new = set(row) - self._keys_seen
        if new:
            self._keys_seen |= new
            missing = metric_keys.undeclared(new)
            if missing:
                log.warning("metrics %s: not declared in pipo_jax/run/metric_keys.py (docs/metrics.md)", missing)

    def _truncate_after(self, step: int | None) -> None:
        """Keeps the rows up to `step` (none for a fresh run, `step` None); the rows after it
        and a torn last line (a kill mid-write) go to `metrics.superseded.jsonl`, with a warning.
        The kept rows replace the file atomically (a full disk leaves it as it was)."""
        rows, torn = _parse_rows(self.jsonl_path)
        kept = [r for r in rows if step is not None and r["step"] <= step]
        dropped = [r for r in rows if not (step is not None and r["step"] <= step)]
        if torn is not None:
            log.warning("%s: the last line is torn (a run killed mid-write): repaired, the text kept in "
                        "metrics.superseded.jsonl", self.jsonl_path)
            dropped.append({"torn_line": torn})
        if dropped:
            superseded = os.path.join(self.workdir, "metrics.superseded.jsonl")
            atomic.append_line(superseded, "\n".join(json.dumps(r) for r in dropped))
            log.warning("%s: %d rows an earlier attempt logged %s moved to %s", self.jsonl_path, len(dropped),
                        "(a fresh run)" if step is None else f"after iteration {step} (resuming there)", superseded)
        atomic.write_text_atomic(self.jsonl_path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step)}
        row.update({k: s for k, v in metrics.items() if (s := _scalar(v)) is not None})
        self._check_declared(row)
        # A whole row or none: never a torn one.
        self._guarded(self.jsonl_path, step, lambda: atomic.append_line(self.jsonl_path, json.dumps(row)))
        if self._tb is not None:
            self._guarded(self._tb.path, step, lambda: self._tb.write(step, {k: v for k, v in row.items()
                                                                              if k != "step"}))
        if self._wandb is not None:
            self._guarded("W&B", step, lambda: self._wandb.log(row, step=step))
        if self._bar is not None:
            shown = {label: f"{row[k]:.3g}" for k, label in PROGRESS_KEYS if k in row}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.n = max(self._bar.n, int(step))
            self._bar.refresh()

    def log_many(self, first_step: int, stacked: dict[str, np.ndarray], extra: dict[str, Any] | None = None):
        """Logs a chunk of iterations whose metrics are stacked on axis 0."""
        n = len(next(iter(stacked.values()))) if stacked else 0
        for i in range(n):
            row = {k: v[i] for k, v in stacked.items()}
            if extra and i == n - 1:
                row.update(extra)
            self.log(first_step + i + 1, row)

    def close(self, plots: bool = True) -> list[str]:
        if not self.enabled:
            return []
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._guarded("W&B", -1, self._wandb.finish)
        if not plots:
            return []
        return self._guarded("plots", -1, lambda: plot_run(read_metrics(self.jsonl_path), self.workdir)) or []


def _series(rows: Iterable[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], r[key]) for r in rows if key in r]
    if not pts:
        return np.zeros(0), np.zeros(0)
    x, y = zip(*pts)
    return np.asarray(x), np.asarray(y)


# A panel: (y-axis label: the quantity and its unit, ((metrics key, legend label), ...)).
# A plot: (file, title, panels); x: the RL iteration. Quantities of different scale get panels of their own.
PLOTS = (
    ("reward.png", "reward", (("reward per response / accuracy (fraction, 0-1)",
                               (("reward_mean", "batch reward"), ("heldout_accuracy", "held-out accuracy"))),)),
    ("mu_vs_mu_his.png", "PIPO window", (("batch mean reward (reward per response)",
                                          (("mu_t", "mu_t"), ("mu_his", "mu_his"))),)),
    ("xi_c.png", "improvement signal", (("xi (window std. devs)", (("xi", "xi"),)),
                                        ("c (PI step scale)", (("c", "c"),)),
                                        ("PI step applied (0/1)", (("pi_step_applied", "PI step applied"),)))),
    ("response_length.png", "response length", (("mean response length (tokens)",
                                                 (("response_length", "mean length"),)),)),
    ("kl.png", "KL to reference", (("KL(pi || ref), k3 (nats per token)", (("kl_ref", "k3 KL(pi || ref)"),)),)),
)
X_LABEL = "RL iteration (step)"


def run_caption(workdir: str) -> str:
    """`<run> (<algorithm>[ + PIPO], seed <seed>)`: the workdir's name and its `config.json`'s algorithm,
    PIPO switch and seed (the name alone where the workdir has no readable config)."""
    name = os.path.basename(os.path.normpath(os.path.abspath(workdir)))
    try:
        with atomic.open_regular(os.path.join(workdir, "config.json")) as f:  # never blocks on a FIFO
            config = json.load(f)
    except (OSError, ValueError, RecursionError, atomic.NotRegularFile):
        return name
    if not isinstance(config, dict):
        return name
    pipo = " + PIPO" if (config.get("pipo") or {}).get("enabled") else ""
    return f"{name} ({config.get('algorithm', '?')}{pipo}, seed {config.get('seed', '?')})"


def plot_run(rows: list[dict], workdir: str) -> list[str]:
    """Draws the standard run plots (PNG) from metrics rows; returns the written paths. Each title names the
    run, its algorithm and seed (`run_caption`); each panel's y axis the quantity and its unit (`PLOTS`);
    a legend (panels of several series) sits outside the panel, covering no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caption = run_caption(workdir)
    written = []
    for fname, title, panels in PLOTS:
        drawn = [(ylabel, [(label, *_series(rows, key)) for key, label in keys]) for ylabel, keys in panels]
        drawn = [(ylabel, [s for s in series if len(s[1])]) for ylabel, series in drawn]
        drawn = [(ylabel, series) for ylabel, series in drawn if series]
        if not drawn:
            continue
        fig, axes = plt.subplots(len(drawn), 1, sharex=True, figsize=(6.4, 1.2 + 2.3 * len(drawn)), squeeze=False)
        for ax, (ylabel, series) in zip(axes[:, 0], drawn):
            for label, x, y in series:
                ax.plot(x, y, label=label, marker="o" if len(x) < 30 else None, markersize=3)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if len(series) > 1:
                ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")
        axes[-1, 0].set_xlabel(X_LABEL)
        axes[0, 0].set_title(f"{title}: {caption}")
        fig.tight_layout()
        path = os.path.join(workdir, fname)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
