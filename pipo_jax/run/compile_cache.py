"""JAX's persistent compilation cache for the experiments' commands: on by default, so a rerun, a
resume or a sweep point whose programs an earlier process compiled loads them from disk instead of
compiling them again (the main job's RL program alone takes about a minute to compile on two cores).

Where it lives, first match wins (`choose`):
  1. `--compilation_cache=DIR` (every `experiments.*` command; `off` turns it off),
  2. the environment variable `PIPO_JAX_COMPILATION_CACHE` (a directory, or `off`),
  3. JAX's own setting (`JAX_COMPILATION_CACHE_DIR`, or `jax.config` set before the command runs:
     the tests' cache, tests/conftest.py),
  4. `$XDG_CACHE_HOME/pipo_jax/jax_cache/<host>` (default `~/.cache/...`).

`<host>` names the CPU (model, vector extensions, schedulable cores): JAX's cache key names the CPU
platform only, while XLA:CPU's code, and so a run's last bits, follow the CPU it was compiled on;
a home directory shared by machines of two CPU models keeps one cache per model. JAX's key hashes
the program, the XLA flags and the jax / jaxlib versions, so an entry is never used for another
program. The cache is not size-capped (JAX's capped cache breaks when a process is killed between
its two writes, tests/compilation_cache.py); delete the directory to reclaim the space.
`configure` also exports the choice to the environment, so the commands a command starts
(`experiments.main_job_seeds` starts `experiments.train`) use the same cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import platform
from collections.abc import Mapping, MutableMapping

import jax

from pipo_jax import provenance

log = logging.getLogger(__name__)

ENV = "PIPO_JAX_COMPILATION_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF_WORDS = ("off", "none", "false", "no", "0")
# Programs that compile in less are not stored (JAX's default is 1 s): the trainer's evaluation and
# warm-up programs take 0.2-1 s each on two cores, dozens of them; the eager ops' take milliseconds.
MIN_COMPILE_TIME_S = 0.2
MIN_COMPILE_TIME_KEY = "jax_persistent_cache_min_compile_time_secs"


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """path: the cache directory (None: off); source: what chose it (`--compilation_cache`, `ENV`,
    `JAX_ENV` / jax.config, or "default")."""
    path: str | None
    source: str

    def describe(self) -> str:
        if self.path is None:
            return f"JAX compilation cache off ({self.source}): every run compiles its programs"
        return (f"JAX compilation cache: {self.path} ({self.source}; move it with --compilation_cache=DIR or "
                f"{ENV}=DIR, turn it off with =off)")


def host_tag() -> str:
    """`<machine>-<hash of the CPU model, its vector extensions and the schedulable cores>`."""
    what = "|".join([provenance.cpu_model(), ",".join(provenance.cpu_isa()), str(provenance.schedulable_cpus())])
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(what.encode()).hexdigest()[:12]}"


def default_dir(environ: Mapping[str, str]) -> str:
    """`$XDG_CACHE_HOME/pipo_jax/jax_cache/<host_tag>` (`~/.cache` without XDG_CACHE_HOME)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pipo_jax", "jax_cache", host_tag())


def _is_off(value: str) -> bool:
    return value.strip().lower() in OFF_WORDS


def choose(flag: str | None, environ: Mapping[str, str], jax_dir: str | None) -> CacheChoice:
    """The cache directory by the precedence of the module docstring (pure: `jax_dir` is JAX's
    configured `jax_compilation_cache_dir`)."""
    if flag is not None and flag.strip():
        return CacheChoice(None if _is_off(flag) else os.path.abspath(os.path.expanduser(flag.strip())),
                           "--compilation_cache")
    if environ.get(ENV, "").strip():
        value = environ[ENV]
        return CacheChoice(None if _is_off(value) else os.path.abspath(os.path.expanduser(value.strip())), ENV)
    if jax_dir:
        return CacheChoice(jax_dir, f"{JAX_ENV} / jax.config")
    return CacheChoice(default_dir(environ), "default")


def configure(flag: str | None = None, environ: MutableMapping[str, str] | None = None) -> CacheChoice:
    """Chooses the cache (`choose`), creates its directory, sets it in `jax.config` and exports it to
    `environ` (default `os.environ`) for child processes. An explicit directory that cannot be created
    raises its `OSError`; the default one that cannot turns the cache off with a warning."""
    environ = os.environ if environ is None else environ
    choice = choose(flag, environ, jax.config.jax_compilation_cache_dir)
    if choice.path is not None:
        try:
            os.makedirs(choice.path, exist_ok=True)
            if not os.access(choice.path, os.W_OK | os.X_OK):
                raise PermissionError(13, "not writable", choice.path)
        except OSError as e:
            if choice.source != "default":
                raise
            log.warning("JAX compilation cache off: cannot use %s (%s)", choice.path, e.strerror or e)
            choice = CacheChoice(None, f"{choice.path} not writable")
    jax.config.update("jax_compilation_cache_dir", choice.path)
    if choice.path is None:
        environ[ENV] = "off"  # a child process reads ENV before JAX_ENV
        environ.pop(JAX_ENV, None)
        return choice
    environ[JAX_ENV] = choice.path
    if choice.source == "--compilation_cache":
        environ[ENV] = choice.path
    if MIN_COMPILE_TIME_KEY.upper() not in environ:  # the tests' and the user's own setting win
        jax.config.update(MIN_COMPILE_TIME_KEY, MIN_COMPILE_TIME_S)
        environ[MIN_COMPILE_TIME_KEY.upper()] = str(MIN_COMPILE_TIME_S)
    return choice


def current_dir() -> str | None:
    """The directory compiled programs are stored in now (None: the persistent cache is off)."""
    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir or None


def describe_contents(path: str | None) -> str:
    """`N programs, X MB` stored at `path` ("off" for None; "empty" for none)."""
    if path is None:
        return "off"
    try:
        sizes = [e.stat().st_size for e in os.scandir(path) if e.name.endswith("-cache") and e.is_file()]
    except OSError:
        return "unreadable"
    return f"{len(sizes)} programs, {sum(sizes) / 1e6:.0f} MB" if sizes else "empty"
