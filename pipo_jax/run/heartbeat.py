"""A console that is never silent long: `Heartbeat` names what the run is doing (`phase`) and, while a
phase runs `period_s` without another line, a background thread prints "still <phase> (N s): <what
JAX is doing>" - compiling which program (and whether the next run loads it from the persistent
compilation cache), loading it from that cache, tracing or lowering it.

What JAX is doing is read from the main thread's Python stack (`jax_activity`), never changed: the
heartbeat only reads frames and prints, so it cannot change a run's numbers; it holds no lock
the run takes (the logging module's own aside), and its thread ends with the `Heartbeat` context.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import jax

from pipo_jax.run import compile_cache

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 10.0

_JAX_DIR = "/jax/_src/"
_LOADING = ("_cache_read", "get_executable_and_time")


def _code_name(frame: FrameType) -> tuple[str, str]:
    return frame.f_code.co_filename.replace("\\", "/"), frame.f_code.co_name


def jax_activity(frame: FrameType | None) -> str | None:
    """What the stack ending at `frame` (its innermost frame) is doing in JAX: "compiling <program>"
    (inside `compile_or_get_cached`, its `module_name`), "loading <program> from the compilation cache"
    (inside its cache read), "lowering <function>", "tracing (in <file>:<function>)", or None (running
    a program, or outside JAX)."""
    names = []  # (file, function, frame), innermost first
    while frame is not None:
        names.append((*_code_name(frame), frame))
        frame = frame.f_back
    for path, name, f in names:
        if path.endswith(_JAX_DIR + "compiler.py") and name == "compile_or_get_cached":
            program = f.f_locals.get("module_name", "a program")
            inner = {n for p, n, _ in names if p.endswith(_JAX_DIR + "compiler.py")
                     or p.endswith(_JAX_DIR + "compilation_cache.py")}
            if inner & set(_LOADING):
                return f"loading {program} from the compilation cache"
            return f"compiling {program}"
    for path, name, f in names:
        if path.endswith(_JAX_DIR + "interpreters/pxla.py") and name == "lower_sharding_computation":
            return f"lowering {f.f_locals.get('fun_name', 'a program')}"
    if any(_JAX_DIR in path and "partial_eval" in path for path, _, _ in names):
        user = next((f"{p.rsplit('/pipo_jax/', 1)[-1]}:{n}" for p, n, _ in names if "/pipo_jax/" in p
                     and _JAX_DIR not in p and not p.endswith("run/heartbeat.py")), None)
        return "tracing" + (f" (in {user})" if user else "")
    return None


class CompileCounts:
    """Programs JAX built in this process (`jax.monitoring` events, counted from `watch()` on): `built`
    (compiled or loaded from the persistent cache), `loaded` (of those, from the cache) and `seconds`
    (building them). One listener per process: JAX cannot remove one."""

    built = loaded = 0
    seconds = 0.0
    _watching = False

    @classmethod
    def watch(cls) -> None:
        if cls._watching:
            return
        cls._watching = True

        def on_event(event: str, **_) -> None:
            if event == "/jax/compilation_cache/cache_hits":
                cls.loaded += 1

        def on_duration(event: str, seconds: float, **_) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                cls.built += 1
                cls.seconds += seconds

        jax.monitoring.register_event_listener(on_event)
        jax.monitoring.register_event_duration_secs_listener(on_duration)

    @classmethod
    def now(cls) -> tuple[int, int, float]:
        return cls.built, cls.loaded, cls.seconds


def describe_builds(before: tuple[int, int, float], after: tuple[int, int, float]) -> str | None:
    """"compiled N programs (S s), loaded M from the compilation cache" between two `CompileCounts.now()`;
    None when none was built."""
    built, loaded, seconds = (a - b for a, b in zip(after, before))
    if not built:
        return None
    parts = [f"compiled {built - loaded} program{'s' * (built - loaded != 1)}"] if built > loaded else []
    if loaded:
        parts.append(f"loaded {loaded} from the compilation cache")
    return f"{', '.join(parts)} in {seconds:.1f} s"


def cache_note(activity: str | None) -> str:
    """What a "compiling" activity means for the next run: loaded from the cache, or compiled again."""
    if activity is None or not activity.startswith("compiling"):
        return ""
    where = compile_cache.current_dir()
    if where is None:
        return "; the compilation cache is off: the next run compiles it again"
    return "; stored in the compilation cache: the next run loads it"


class Heartbeat:
    """`with Heartbeat(period_s) as hb:` ... `with hb.phase("the warm-up"):` ...

    While a phase is open and nothing was said for `period_s` (a phase opening, `touch()`, `say()`, or the
    heartbeat's own line), one line: "still <phase> (N s in it): <jax_activity>". `period_s <= 0`: no such
    lines. `quiet`: no line at all (phases are still kept: a run without a console, `log.progress=false`).
    `emit` prints a line (default: this module's logger at INFO); `clock`: seconds, monotonic.
    """

    def __init__(self, period_s: float = DEFAULT_PERIOD_S, emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, quiet: bool = False):
        self.period_s, self.clock = (0.0 if quiet else float(period_s)), clock
        self.quiet = quiet
        self.emit = emit or (lambda line: log.info("%s", line))
        self._phases: list[tuple[str, float]] = []  # (what, start), innermost last
        self._last_line = clock()
        self._watched = threading.get_ident()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        CompileCounts.watch()
        if self.period_s > 0:
            self._watched = threading.get_ident()
            self._thread = threading.Thread(target=self._beat, name="pipo_jax-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def say(self, line: str) -> None:
        """Prints `line` (unless quiet); the silence starts again now."""
        if not self.quiet:
            self.emit(line)
        self.touch()

    def touch(self) -> None:
        """Another line was printed: the silence starts again now."""
        with self._lock:
            self._last_line = self.clock()

    @contextlib.contextmanager
    def phase(self, what: str, announce: str | None = None, report_builds: bool = False) -> Iterator[None]:
        """Names what runs inside (nested phases: the innermost is named); `announce`: a line said on
        entry; `report_builds`: on a normal exit, one line of the programs compiled or loaded inside
        (`describe_builds`), if any."""
        if announce:
            self.say(announce)
        before = CompileCounts.now()
        with self._lock:
            self._phases.append((what, self.clock()))
            self._last_line = self.clock()
        try:
            yield
        finally:
            with self._lock:
                _, start = self._phases.pop()
                self._last_line = self.clock()
        built = describe_builds(before, CompileCounts.now()) if report_builds else None
        if built:
            self.say(f"{what}: {built}, {self.clock() - start:.0f} s in all")

    def line(self) -> str | None:
        """The heartbeat line due now (None: no phase open, or something was said less than `period_s` ago)."""
        with self._lock:
            now = self.clock()
            if not self._phases or now - self._last_line < self.period_s:
                return None
            what, start = self._phases[-1]
            self._last_line = now
        activity = jax_activity(sys._current_frames().get(self._watched))
        text = f"still {what} ({now - start:.0f} s)"
        return text + (f": {activity}{cache_note(activity)}" if activity else "")

    def _beat(self) -> None:
        tick = min(1.0, self.period_s / 4)
        while not self._stop.wait(tick):
            text = self.line()
            if text is not None:
                self.emit(text)
