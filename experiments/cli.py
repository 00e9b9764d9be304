"""`run(main)`: `absl.app.run` for the experiments' scripts, with a config or data error
printed as one line on stderr and exit status 2 instead of a traceback.

A config error is a `ConfigError` (validation), a `--config.key=value` override that
ml-collections rejects (unknown key: its "Did you mean" hint is kept), a `DataError`
(a dataset row), a missing file, checkpoints none of which reads, an export that cannot be
made, or a command's optional dependency (`[serve]`) that is not installed. Anything else is a
bug or a failed run and keeps its traceback. A run stopped by SIGTERM / SIGINT after saving
its checkpoint (`RunInterrupted`) says so in one line and exits 128 + the signal's number,
as a shell reports a process ended by that signal.
"""

from __future__ import annotations

import sys

from absl import app, flags

from pipo_jax.data.sources import DataError
from pipo_jax.models.hf import CheckpointError
from pipo_jax.rl.checkpoint import NoReadableCheckpoint
from pipo_jax.rl.export import ExportError
from pipo_jax.rl.preemption import RunInterrupted
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.workdir import WorkdirError



class MissingExtra(RuntimeError):
    """An optional dependency of a command is not installed (the message names the extra)."""


USER_ERRORS = (ConfigError, DataError, CheckpointError, NoReadableCheckpoint, FileNotFoundError, WorkdirError,
               ExportError, MissingExtra)
EXIT_USER_ERROR = 2


def one_line(e: BaseException) -> str:
    """The message of `e` (unwrapping `KeyError(KeyError(...))` quoting) on one line."""
    while e.args and isinstance(e.args[0], BaseException):
        e = e.args[0]
    text = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else str(e)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a rejected `--config.*` override turned into a `ConfigError`."""
    try:
        return flags.FLAGS(argv)
    except flags.Error:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # ml-collections' override errors
        raise ConfigError(f"command-line override: {one_line(e)}") from e


def run(main) -> None:
    """`app.run(main)`; a config / data error exits with status 2 after one line on stderr."""
    try:
        app.run(main, flags_parser=_parse_flags)
    except USER_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except RunInterrupted as e:  # a clean stop on SIGTERM / SIGINT: the shell's status for that signal
        print(f"stopped: {one_line(e)}", file=sys.stderr)
        sys.exit(128 + e.signum)
