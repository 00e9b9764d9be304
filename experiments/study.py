"""The sweep engine: a study's points, grouped into programs, run, stored and read back.

A point is a base config with some dotted keys set (`overrides`, e.g. {"pipo.lam": 0.1}) and a seed,
held typed (`RunConfig`). Every point is validated before anything runs (`train_spec`, as
`--check_config` does; a bad value is a `UsageError` naming the point and the key). Points whose
jit-static specs (`train_spec(config)`, a frozen, hashable `TrainSpec`) and loop shape (iterations,
evaluation) are equal form a group, which runs as ONE program (`vmapped.run_group`, its members
batched or, `members="map"`, one after another): the seeds of a point always do, and every other
value the train state carries. Each group's results go to their own file under `<out>/groups/`
(atomic write); a point stored there with the same config (`fingerprint`) and the same code
(`code_version`: the commit, and for an edited tree the hash of its sources) is read back, not rerun,
so a stopped sweep continues where it stopped; a stored point of another config, code or members
form is reported and moved aside to `groups/stale/`.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from collections.abc import Callable, Hashable
from typing import Any

import jax
import ml_collections

from experiments import cli
from experiments.overrides import with_overrides
from experiments.runs import warmed_up_model, warmup_record
from experiments.vmapped import run_group
from pipo_jax.models import hf
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import atomic
from pipo_jax.run.setup import train_spec
from pipo_jax.run.workdir import flat_config, stored_form

GROUPS = "groups"


@dataclasses.dataclass(frozen=True, eq=False)
class Point:
    """One run of a study: `config` is the base with `overrides` set and `seed`, typed."""

    label: str  # the swept values, 'pipo.lam=0.1,train.lr=0.0003' ('base' when nothing is set)
    seed: int
    overrides: dict[str, Any]
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.label}/seed{self.seed}"


def point_label(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"


def fingerprint(config: RunConfig) -> dict:
    """A config as plain JSON values, keys sorted (what a stored result must equal to be reused)."""
    return json.loads(json.dumps(stored_form(config), sort_keys=True))


def config_diff(base: RunConfig, config: RunConfig) -> dict[str, list]:
    """{key: [base value, point value]} for every leaf where `config` differs from `base`."""
    a, b = flat_config(fingerprint(base)), flat_config(fingerprint(config))
    return {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def same_code(stored: str | None, current: str) -> bool:
    """Whether a stored result was made by this code: equal code versions (a commit, or `code_version`'s
    commit and source hash), never an unknown one or a bare dirty commit (a tree whose changes are unknown)."""
    return stored == current and current != "unknown" and not current.endswith("+dirty")


SOURCES = ("pipo_jax", "experiments", "configs")  # the code a run executes


def code_version(commit: str) -> str:
    """`commit` for a clean checkout; for a dirty one `commit:<hash>` of every .py file under `SOURCES`
    (path and bytes), so runs of the same edited tree (a sweep and the processes it starts) recognise
    each other's results and an edit between them does not."""
    if not commit.endswith("+dirty"):
        return commit
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha1()
    for top in SOURCES:
        for folder, dirs, files in sorted(os.walk(os.path.join(root, top))):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return f"{commit}:{digest.hexdigest()[:16]}"


def checked_config(base: ml_collections.ConfigDict, overrides: dict[str, Any], where: str) -> RunConfig:
    """`base` (the command's config) with `overrides` set, parsed and validated as `--check_config` does
    (`train_spec`); a bad key or value is a `UsageError` naming `where` (the point) and the key."""
    try:
        config = RunConfig.from_config(with_overrides(base, overrides))
        train_spec(config)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError naming the key
        raise cli.UsageError(f"{where}: {cli.one_line(e)}") from None
    return config


def make_points(base: ml_collections.ConfigDict, grid: list[dict[str, Any]], seeds: list[int]) -> list[Point]:
    """Every grid entry at every seed (an entry that sets 'seed' itself is that one point), each
    config built and validated (`train_spec`) before any runs: a bad key or value is a `UsageError`
    naming the point and the key. A point equal to an earlier one (same config) is dropped and counted."""
    points, seen, dropped = [], {}, []
    for overrides in grid:
        own_seed = "seed" in overrides
        for seed in ([None] if own_seed else seeds):
            label = point_label(overrides)
            where = f"sweep point {label}" + ("" if own_seed else f" (seed {seed})")
            c = checked_config(base, overrides if own_seed else dict(overrides, seed=seed), where)
            point = Point(label, c.seed, dict(overrides), c)
            key = json.dumps(fingerprint(c), sort_keys=True)
            if key in seen:
                dropped.append(f"{point.name} (= {seen[key]})")
                continue
            seen[key] = point.name
            points.append(point)
    if dropped:
        print(f"{len(dropped)} sweep point(s) dropped, each the same config as an earlier one: "
              + "; ".join(dropped), flush=True)
    return points


def group_key(config: RunConfig) -> Hashable:
    """What the points of one program share: the jit-static spec and the loop's length and evaluation."""
    return (train_spec(config), config.iterations, config.eval.n, config.eval.every, config.eval.heldout_samples)


def group_indices(keys: list[Hashable]) -> list[list[int]]:
    """Indices of equal keys, grouped in order of first appearance: [a, b, a, c] -> [[0, 2], [1], [3]]."""
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return list(groups.values())


def group_points(points: list[Point]) -> list[list[Point]]:
    """The points grouped by `group_key` (each group one vmapped program), in order of first appearance."""
    return [[points[i] for i in idx] for idx in group_indices([group_key(p.config) for p in points])]


def base_dir_of(root: str, config: RunConfig) -> str:
    """Where the warmed-up bases of `config`'s warm-up settings live: `root/warmup-<hash>/base_seed<s>`
    (points whose warm-up settings differ get their own bases, never one another's)."""
    record = warmup_record(config, 0)
    del record["seed"]
    digest = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()[:10]
    return os.path.join(root, f"warmup-{digest}")


def group_file(out: str, names: list[str]) -> str:
    return os.path.join(out, GROUPS, hashlib.sha1("\n".join(names).encode()).hexdigest()[:12] + ".json")


def stored_points(out: str, points: list[Point], code: str, members: str = "vmap") -> dict[str, dict]:
    """The points of `points` finished in `out` (`{name: entry}`: entry["result"] the run's row), read
    from the group files. A stored point whose config or code differs, or that was computed with other
    `members` (`vmapped.MEMBERS`; a point stored before the choice existed was vmapped), is reported, moved
    aside to `groups/stale/` (its file rewritten without it) and not reused; other stored points are left
    alone."""
    want = {p.name: fingerprint(p.config) for p in points}
    found: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(out, GROUPS, "*.json"))):
        try:
            with open(path) as f:
                entries = json.load(f)["points"]
        except (ValueError, KeyError, TypeError, OSError):
            entries = None
        stale = {}
        for name, entry in (entries or {}).items():
            if name not in want:
                continue
            if entry.get("config") != want[name]:
                have, now = flat_config(entry.get("config") or {}), flat_config(want[name])
                diff = sorted(k for k in have.keys() | now.keys() if have.get(k) != now.get(k))
                print(f"{name}: stored in {path} with another config (differs in {', '.join(diff[:6])}); rerun",
                      flush=True)
                stale[name] = entry
            elif not same_code(entry.get("code"), code):
                print(f"{name}: stored in {path} by other code ({entry.get('code')}, now {code}); rerun",
                      flush=True)
                stale[name] = entry
            elif (form := entry.get("members", "vmap")) != members:  # stored before the choice: vmapped
                print(f"{name}: stored in {path} with --members={form} (now {members}); rerun", flush=True)
                stale[name] = entry
            else:
                found[name] = entry
        if entries is None or stale:
            _move_aside(path, entries, stale)
    return found


def _move_aside(path: str, entries: dict | None, stale: dict[str, dict]) -> None:
    """Moves `stale` entries of the group file `path` (all of it if unreadable) to groups/stale/."""
    aside_dir = os.path.join(os.path.dirname(path), "stale")
    os.makedirs(aside_dir, exist_ok=True)
    k = 0
    while os.path.exists(aside := os.path.join(aside_dir, f"{k}_{os.path.basename(path)}")):
        k += 1
    if entries is None:
        os.replace(path, aside)
        print(f"{path}: unreadable; moved to {aside}", flush=True)
        return
    atomic.write_json_atomic(aside, {"points": stale}, indent=None)
    rest = {n: e for n, e in entries.items() if n not in stale}
    if rest:
        atomic.write_json_atomic(path, {"points": rest}, indent=None)
    else:
        os.remove(path)


def run_group_points(group: list[Point], bases: list, members: str = "vmap") -> tuple[list[dict], dict[str, float]]:
    """One group's points as one program, member i from `bases[i]` (evaluated every eval.every iterations),
    its members sharing it as `members` says (`vmapped.MEMBERS`): their rows and the group's {wall_s, compile_s}."""
    rows, timing = run_group([p.config for p in group], bases, group[0].config.eval.every, members)
    jax.clear_caches()  # many groups in one process: drop this one's programs (see tests/conftest.py)
    return rows, timing


def base_of(point: Point, base_root: str) -> str:
    """The warmed-up base of the point's seed and warm-up settings (made once, then read from disk)."""
    return warmed_up_model(point.config, point.seed, base_dir_of(base_root, point.config))


def run_points(group: list[Point], out: str, base_path: Callable[[Point], str], code: str, members: str = "vmap"
               ) -> dict[str, dict]:
    """Runs one group's points, each from its warmed-up base (`base_path(point)`: a HF directory, made on first
    use; a sweep's `base_of`), its members sharing the program as `members` says; writes their entries to the
    group's own file (atomic) and returns them by name."""
    paths = [base_path(p) for p in group]
    loaded = {path: hf.load(path)[1] for path in dict.fromkeys(paths)}  # a base shared by members read once
    rows, timing = run_group_points(group, [loaded[path] for path in paths], members)
    entries = {p.name: {"label": p.label, "seed": p.seed, "overrides": p.overrides, "config": fingerprint(p.config),
                        "code": code, "members": members, "result": row,
                        "group": {"size": len(group), "wall_s": timing["wall_s"], "compile_s": timing["compile_s"]}}
               for p, row in zip(group, rows)}
    path = group_file(out, [p.name for p in group])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic.write_json_atomic(path, {"points": entries}, indent=None)
    return entries
