"""The console's heartbeat (pipo_jax/run/heartbeat.py): a line after `period_s` of silence in a phase,
naming the program JAX compiles and what the compilation cache does with it."""

import re
import uuid

import jax
import jax.numpy as jnp
import pytest

from pipo_jax.run import heartbeat


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_line_after_period_s_of_silence_in_a_phase():
    clock = Clock()
    hb = heartbeat.Heartbeat(10.0, emit=lambda line: None, clock=clock)
    clock.t += 60
    assert hb.line() is None  # no phase open: nothing to say
    with hb.phase("in the warm-up"):
        clock.t += 9.9
        assert hb.line() is None
        clock.t += 0.2
        assert hb.line() == "still in the warm-up (10 s)"  # the main thread is in no JAX call: no activity
        clock.t += 5
        assert hb.line() is None  # the heartbeat's own line counts as said
        clock.t += 5
        assert hb.line() == "still in the warm-up (20 s)"
        with hb.phase("evaluating iteration 0"):
            clock.t += 10
            assert hb.line() == "still evaluating iteration 0 (10 s)"  # the innermost phase
        clock.t += 9  # leaving a phase is a line's worth: the silence starts again
        assert hb.line() is None
        hb.touch()
        clock.t += 9
        assert hb.line() is None
        clock.t += 1
        assert hb.line() == "still in the warm-up (49 s)"


def test_announce_and_no_thread_when_off():
    lines = []
    with heartbeat.Heartbeat(0, emit=lines.append) as hb:
        assert hb._thread is None
        with hb.phase("x", announce="doing x"):
            pass
        hb.say("done")
    assert lines == ["doing x", "done"]


def test_quiet_says_nothing():
    """A run without a console (`log.progress=false`): no announce, no heartbeat, no report of builds."""
    lines = []
    with heartbeat.Heartbeat(0.01, emit=lines.append, quiet=True) as hb:
        assert hb._thread is None
        with hb.phase("x", announce="doing x", report_builds=True):
            jax.jit(lambda v: v * 3 + 1)(jnp.arange(5.0)).block_until_ready()
        hb.say("done")
    assert lines == []


def _slow_to_compile(x):
    """A chain of 60 matmuls and sines: long enough to compile for the heartbeat to see it."""
    for i in range(60):
        x = jnp.sin(x @ x) + i
    return x


@pytest.fixture
def every_program_cached():
    """The persistent cache (the tests', conftest) stores every program, however fast it compiles."""
    saved = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved)


def test_the_thread_names_the_program_compiled_and_the_cache(every_program_cached):
    assert heartbeat.compile_cache.current_dir() is not None
    lines = []
    x = jnp.full((4, 4), 0.5)
    salt = float(uuid.uuid4().int % 10_000)  # a new constant each run: a program the cache has not seen
    def heartbeat_probe(x):
        return _slow_to_compile(x) * salt

    probe = jax.jit(heartbeat_probe)
    with heartbeat.Heartbeat(0.05, emit=lines.append) as hb:
        with hb.phase("compiling the probe", report_builds=True):
            probe(x).block_until_ready()
        jax.clear_caches()
        with hb.phase("loading the probe", report_builds=True):
            probe(x).block_until_ready()
    assert any(re.fullmatch(r"still compiling the probe \(\d+ s\): compiling jit_heartbeat_probe; stored in the "
                            r"compilation cache: the next run loads it", line) for line in lines), lines
    built = [line for line in lines if line.startswith("compiling the probe: ")]
    assert len(built) == 1 and re.fullmatch(r"compiling the probe: compiled 1 program in [\d.]+ s, \d+ s in all",
                                            built[0]), lines
    loaded = [line for line in lines if line.startswith("loading the probe: ")]
    assert len(loaded) == 1 and re.fullmatch(r"loading the probe: loaded 1 from the compilation cache in [\d.]+ s, "
                                             r"\d+ s in all", loaded[0]), lines


def test_jax_activity_outside_jax_and_the_note_when_the_cache_is_off(monkeypatch):
    assert heartbeat.jax_activity(None) is None
    import sys
    assert heartbeat.jax_activity(sys._getframe()) is None
    monkeypatch.setattr(heartbeat.compile_cache, "current_dir", lambda: None)
    assert heartbeat.cache_note("compiling jit_f") == "; the compilation cache is off: the next run compiles it again"
    assert heartbeat.cache_note("tracing") == ""


def test_describe_builds():
    assert heartbeat.describe_builds((3, 1, 2.0), (3, 1, 2.0)) is None
    assert heartbeat.describe_builds((3, 1, 2.0), (6, 1, 9.5)) == "compiled 3 programs in 7.5 s"
    assert heartbeat.describe_builds((0, 0, 0.0), (2, 1, 1.25)) == ("compiled 1 program, loaded 1 from the "
                                                                    "compilation cache in 1.2 s")
    assert heartbeat.describe_builds((0, 0, 0.0), (1, 1, 0.5)) == "loaded 1 from the compilation cache in 0.5 s"
