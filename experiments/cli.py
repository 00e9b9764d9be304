"""`run(main)`: `absl.app.run` for the experiments' scripts, with a user error printed as one
line on stderr (`error: ...`) and exit status 2 instead of a traceback.

A user error is: a bad flag (unknown flag, a value of the wrong type such as
`--config.pipo.window=abc`, a missing required flag), a config file that does not load (no
such file, unknown preset: the line names the flag and the reason), a `--config.key=value`
override that ml-collections rejects (an unknown key: the closest declared keys in full, `--config.pipo.lamb:
unknown key; did you mean --config.pipo.lam?`), a
`ConfigError` (validation), a `DataError` (a dataset row), a path that is missing, not a
directory, a directory or not permitted (`--workdir` naming a file), a disk that refuses a write (full,
read-only, no permission, quota: `StorageError`, or any `OSError` of those errnos, naming the
path), a run's own file that is a FIFO, a device or a directory (`NotRegularFile`), checkpoints
none of which reads or one asked for by its step whose files differ from its integrity record
(`CheckpointDamaged`), a run stopped by its guards (`train.max_bad_steps` non-finite updates in a row,
DAPO's dynamic sampling exhausted: both name the iteration / key to change), and a
`UsageError` (or absl's `app.UsageError`) a script raises for a bad flag value, an export
that cannot be made (`ExportError`), and a command's optional dependency (`[serve]`) that is not
installed (`MissingExtra`, naming the extra). Anything else
is a bug and keeps its traceback. A run stopped by SIGTERM / SIGINT after saving its
checkpoint (`RunInterrupted`) says so in one line and exits 128 + the signal's number, as a
shell reports a process ended by that signal.

Every command takes `--compilation_cache=DIR|off`: JAX's persistent compilation cache, on by default
in a directory of the user's (`pipo_jax/run/compile_cache.py`), set up before `main` runs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar


def quiet_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables an experiments script sets at start-up, each only where the user did not set
    it: TRANSFORMERS_NO_ADVISORY_WARNINGS=1, so transformers, which this package uses for tokenizers
    and needs no torch for, does not print `PyTorch was not found` at its import (read when it logs,
    so set before)."""
    return {k: v for k, v in {"TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}.items() if k not in environ}


os.environ.update(quiet_environment(os.environ))

from absl import app, flags  # noqa: E402

from pipo_jax.data.sources import DataError  # noqa: E402
from pipo_jax.models.hf import CheckpointError  # noqa: E402
from pipo_jax.rl.loop import DynamicSamplingExhausted, NonFiniteUpdates  # noqa: E402
from pipo_jax.config import schema  # noqa: E402
from pipo_jax.config.sections import RunConfig  # noqa: E402
from pipo_jax.rl.spec import ConfigError  # noqa: E402
from pipo_jax.run import compile_cache  # noqa: E402
from pipo_jax.run.atomic import NotRegularFile, StorageError, storage_error  # noqa: E402
from pipo_jax.run.checkpoint import NoReadableCheckpoint  # noqa: E402
from pipo_jax.run.integrity import CheckpointDamaged  # noqa: E402
from pipo_jax.run.export import ExportError  # noqa: E402
from pipo_jax.run.preemption import RunInterrupted  # noqa: E402
from pipo_jax.run.workdir import WorkdirError  # noqa: E402


class UsageError(ValueError):
    """A bad flag value or input of an experiments script: one line, exit status 2."""


class MissingExtra(RuntimeError):
    """An optional dependency of a command is not installed (the message names the extra)."""


PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)
USER_ERRORS = (ConfigError, DataError, CheckpointError, NoReadableCheckpoint, WorkdirError, UsageError,
               NonFiniteUpdates, DynamicSamplingExhausted, ExportError, MissingExtra, StorageError, NotRegularFile,
               CheckpointDamaged) + PATH_ERRORS
EXIT_USER_ERROR = 2

_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None,
    f"JAX's persistent compilation cache: a directory, or 'off' (default: ${compile_cache.ENV}, else "
    f"${compile_cache.JAX_ENV}, else $XDG_CACHE_HOME/pipo_jax/jax_cache/<host>, ~/.cache without XDG_CACHE_HOME)")

T = TypeVar("T")


def one_line(e: BaseException) -> str:
    """The message of `e` (unwrapping `KeyError(KeyError(...))` quoting) on one line."""
    while e.args and isinstance(e.args[0], BaseException):
        e = e.args[0]
    text = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else str(e)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def flag_error_line(e: flags.Error) -> str:
    """absl's flag error on one line; a config file that raised while loading gives the flag
    and that exception's last line, not the traceback ml-collections puts in the message."""
    head, sep, rest = str(e).partition(": Error whilst parsing config file:")
    if sep:
        lines = [line.strip() for line in rest.splitlines() if line.strip()]
        return f"{head}: {lines[-1] if lines else 'the config file failed to load'}"
    return one_line(e)


def parse_list(flag: str, values: Sequence[str], kind: Callable[[str], T]) -> list[T]:
    """`values` of the list flag `--flag` as `kind` (int, float), or a `UsageError` naming the flag."""
    try:
        return [kind(v) for v in values]
    except ValueError:
        raise UsageError(f"--{flag}={','.join(values)}: every entry must be a {kind.__name__}") from None


def _load_config_flags() -> None:
    """Touches every flag's value, so a config file that did not load (ml-collections defers
    that error to the first use) is a `UsageError` naming the flag."""
    for name in list(flags.FLAGS):
        error = getattr(type(flags.FLAGS[name].value), "_ReportError", None)  # ml-collections' _ErrorConfig
        if error is None:
            continue
        try:
            error(flags.FLAGS[name].value)
        except OSError as e:
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            path = flags.FLAGS[name].serialize().partition("=")[2] or name
            raise UsageError(f"--{name}={path}: cannot load the config file ({lines[-1] if lines else e})") from None


HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")  # absl's: each prints and exits 1


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether `argv` (after the program) holds one of absl's help flags (`--help`, `-?`, `--helpfull`...)."""
    return any(arg.startswith("-") and arg.lstrip("-").partition("=")[0] in HELP_FLAGS for arg in argv)


def unknown_override(argv: Sequence[str]) -> str | None:
    """The first `--config.KEY=...` of `argv` whose KEY is not a declared key, with the closest
    declared keys in full (`--config.pipo.lamb: unknown key; did you mean --config.pipo.lam?`)."""
    for arg in argv:
        match = re.match(r"^--?config\.([^=\s]+)", arg)
        message = match and schema.unknown_key(RunConfig, match[1], prefix="--config.")
        if message:
            return f"--config.{match[1]}: {message}"
    return None


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a bad flag or config file a `UsageError` and a rejected
    `--config.*` override a `ConfigError`; a help flag prints the usage and exits 0 (absl exits 1)."""
    try:
        rest = flags.FLAGS(argv)
    except SystemExit as e:
        if e.code == 1 and asks_for_help(argv[1:]):
            sys.exit(0)
        raise
    except flags.Error as e:
        raise UsageError(flag_error_line(e)) from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # ml-collections' override errors
        raise ConfigError(f"command-line override: {unknown_override(argv[1:]) or one_line(e)}") from e
    _load_config_flags()
    try:
        compile_cache.configure(_COMPILATION_CACHE.value)
    except OSError as e:
        raise UsageError(f"--compilation_cache={_COMPILATION_CACHE.value}: cannot use it "
                         f"({e.strerror or e})") from None
    return rest


def _user_errors_of(main):
    """`main` with the chatty libraries' logs quieted (`quiet_library_logs`) and absl's `app.UsageError`
    (which `app.run` would answer with the usage text and exit 1) turned into our one-line `UsageError`."""
    def wrapped(argv):
        quiet_library_logs()  # here, not before app.run: its logging set-up puts the absl logger back to NOTSET
        try:
            return main(argv)
        except app.UsageError as e:
            raise UsageError(one_line(e)) from None
    return wrapped


# Loggers whose INFO lines are start-up chatter on a user's console: jax's backend probe (`Unable to
# initialize backend 'tpu'` on every host without a TPU, which absl's INFO-level root handler would print;
# a platform named in JAX_PLATFORMS that fails still raises), orbax's and absl's checkpoint notes.
CHATTY_LOGGERS = ("jax._src", "orbax", "absl")


def quiet_library_logs() -> None:
    """`CHATTY_LOGGERS` at WARNING: their warnings and errors still print."""
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def run(main) -> None:
    """`app.run(main)`, with `quiet_library_logs`; a user error exits with status 2 after one line on stderr."""
    try:
        app.run(_user_errors_of(main), flags_parser=_parse_flags)
    except USER_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except OSError as e:  # a full / read-only disk, a quota, outside the run's own reporting
        found = storage_error(e)
        if found is None:
            raise
        print(f"error: {found[1] or e.filename or 'a file'}: {os.strerror(found[0])}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except RunInterrupted as e:  # a clean stop on SIGTERM / SIGINT: the shell's status for that signal
        print(f"stopped: {one_line(e)}", file=sys.stderr)
        sys.exit(128 + e.signum)
