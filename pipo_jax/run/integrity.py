"""A checkpoint's integrity record: the size and sha256 of every file of a step's saved items,
written into the step while orbax still holds it as `<step>.orbax-checkpoint-tmp` (after its data is
complete, before the rename that finalizes it), so a finalized step that this code saved always
carries one.

`write_record` makes it; `verify` reads it back before a restore trusts the step and raises
`CheckpointDamaged` naming the first file whose bytes differ (garbage written into a data file, a
truncated or deleted one); `is_complete` tells a whole step this code saved (the only ones checkpoint
rotation counts and removes) from a foreign, an older code's or a cut one, without reading the data.
The record is a file of its own: what orbax saves and restores is unchanged. Its cost: process 0
reads every saved file once more at a save (in orbax's save thread), and a restore reads them once
before orbax does.
"""

from __future__ import annotations

import hashlib
import json
import os

from pipo_jax.run import atomic

RECORD_NAME = "pipo_integrity.json"
FORMAT = "pipo_jax checkpoint integrity 1"


class CheckpointDamaged(RuntimeError):
    """A file of a checkpoint differs from the integrity record written when it was saved."""


def _files(step_dir: str) -> list[str]:
    """The regular files of the saved items (`step_dir/<item>/...`: the arrays, their metadata and
    manifests; relative paths, sorted). The step's own files beside them (orbax's
    `_CHECKPOINT_METADATA`, which it rewrites as it finalizes, and this record) are left out."""
    out = []
    for root, dirs, names in os.walk(step_dir):
        dirs.sort()
        if os.path.samefile(root, step_dir):
            continue
        out.extend(os.path.relpath(os.path.join(root, n), step_dir) for n in names
                   if os.path.isfile(os.path.join(root, n)))
    return sorted(out)


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_record(step_dir: str, step: int) -> None:
    """Writes `step_dir/pipo_integrity.json` (atomically): `step` and each file's size and sha256."""
    paths = {rel: os.path.join(step_dir, rel) for rel in _files(step_dir)}
    files = {rel: {"bytes": os.path.getsize(path), "sha256": _digest(path)} for rel, path in paths.items()}
    atomic.write_json_atomic(os.path.join(step_dir, RECORD_NAME),
                             {"format": FORMAT, "step": int(step), "algorithm": "sha256", "files": files})


def read_record(step_dir: str) -> dict | None:
    """The integrity record of `step_dir` (None: there is none, or it is not one this code writes)."""
    path = os.path.join(step_dir, RECORD_NAME)
    try:
        with atomic.open_regular(path) as f:
            record = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(record, dict) and record.get("format") == FORMAT and isinstance(record.get("files"), dict)
    return record if ok else None


def is_complete(step_dir: str, step: int) -> bool:
    """Whether `step_dir` is a checkpoint of `step` this code saved, whole as far as `stat` tells: a
    record of that step, and every file it lists there with its size (no file is read)."""
    record = read_record(step_dir)
    if record is None or record.get("step") != step:
        return False
    for rel, want in record["files"].items():
        try:
            if os.path.getsize(os.path.join(step_dir, rel)) != want.get("bytes"):
                return False
        except OSError:
            return False
    return True


def verify(step_dir: str, step: int) -> bool:
    """Checks every file the record of `step_dir` lists against its size and sha256; raises
    `CheckpointDamaged` naming the first that differs (or is missing, or the record names another
    step). Returns False when the step has no record (saved by older code: nothing to check), True
    when every file matches."""
    path = os.path.join(step_dir, RECORD_NAME)
    if not os.path.lexists(path):
        return False
    record = read_record(step_dir)
    if record is None:
        raise CheckpointDamaged(f"{path}: not a readable integrity record")
    if record.get("step") != step:
        raise CheckpointDamaged(f"{path}: the record is of step {record.get('step')!r}, not {step}")
    for rel, want in sorted(record["files"].items()):
        file = os.path.join(step_dir, rel)
        if not os.path.isfile(file):
            raise CheckpointDamaged(f"{file}: missing (listed in {RECORD_NAME})")
        size = os.path.getsize(file)
        if size != want.get("bytes"):
            raise CheckpointDamaged(f"{file}: {size} bytes, {want.get('bytes')} bytes when saved ({RECORD_NAME})")
        if _digest(file) != want.get("sha256"):
            raise CheckpointDamaged(f"{file}: its bytes differ from those saved (sha256 in {RECORD_NAME})")
    return True
