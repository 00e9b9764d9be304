"""experiments/benchmarks/memory_accounting.py: the bound, the buffer assignment's total and which one
a readiness row holds to its limit. The TPU test needs `libtpu` (deviceless compile); it skips without."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from experiments.benchmarks import memory_accounting as ma

MIB = 1024 * 1024
HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None

REPORT = """Memory Space: default (color=0)
Total bytes: 35182094176 (32.77GiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
    5.06GiB( 11%);    5.06GiB;   7892500480;                6; f32[4,4608,4096], 5×bf16[36,4,4608,4096]

Memory Space: color=1
Total bytes: 52428800 (50.00MiB)
"""


def sin_matmul_plus_x(x, y):
    return (jnp.sin(x) @ y).sum() + x


def test_the_default_spaces_total_is_read_from_the_report_and_no_other_space():
    assert ma.report_total_bytes(REPORT) == 35182094176
    assert ma.report_total_bytes(REPORT.replace("default (color=0)", "color=1")) is None


def test_the_bound_by_hand_and_the_compilers_peak_beside_it():
    """bound = arguments + outputs + temporaries - aliased, for a program whose output reuses its donated
    4 MiB argument and whose sin(x) is a 4 MiB temporary; without an assignment the bound is held."""
    ones = jnp.ones((1024, 1024))
    compiled = jax.jit(sin_matmul_plus_x, donate_argnums=0).lower(ones, ones).compile()
    row = ma.memory_row(compiled)
    assert (row["argument_bytes"], row["output_bytes"], row["alias_bytes"]) == (8 * MIB, 4 * MIB, 4 * MIB)
    assert row["bound_bytes"] == 8 * MIB + 4 * MIB + row["temp_bytes"] - 4 * MIB
    assert (row["peak_bytes"], row["peak_basis"]) == (row["bound_bytes"], "bound")
    assert row["xla_peak_bytes"] == compiled.memory_analysis().peak_memory_in_bytes > 0
    held = ma.memory_row(compiled, assigned=5 * MIB)
    assert (held["peak_bytes"], held["peak_basis"], held["bound_bytes"]) == (5 * MIB, "buffer assignment",
                                                                               row["bound_bytes"])


@pytest.fixture
def no_persistent_cache():
    """The test before compiles the same program, and the tests' persistent compilation cache keeps it when its
    compile takes over the cache's threshold (a loaded machine); a program loaded from it writes no buffer
    assignment (so the readiness report turns the cache off). JAX decides once a process whether it reads the
    cache, so the switch is followed by a reset, both ways."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", before)
    compilation_cache.reset_cache()


def test_the_cpu_buffer_assignment_is_the_bound_here_and_only_tpu_reads_it(no_persistent_cache):
    """XLA:CPU lays this program out in 12 MiB (two 4 MiB arguments, the 4 MiB sin(x); the output takes
    x's buffer) plus a few scalars: its bound. `compile_accounted` reads the assignment on TPU only."""
    ones = jnp.ones((1024, 1024))
    lowered = jax.jit(sin_matmul_plus_x, donate_argnums=0).lower(ones, ones)
    compiled, assigned = ma.compile_with_assignment(lowered)
    assert 12 * MIB <= assigned < 12 * MIB + 1024
    assert ma.memory_row(compiled)["bound_bytes"] == 12 * MIB
    assert ma.compile_accounted(lowered, "cpu")[1] is None


def test_two_programs_in_one_dump_folder_are_refused(tmp_path):
    for k in range(2):
        (tmp_path / f"module_000{k}.jit_f.memory-usage-report.txt").write_text(REPORT)
    with pytest.raises(ValueError, match="2 memory-usage reports"):
        ma.assigned_bytes(str(tmp_path))
    assert ma.assigned_bytes(str(tmp_path / "empty_or_missing")) is None


@pytest.mark.skipif(not HAVE_LIBTPU, reason="needs libtpu (deviceless TPU compile)")
def test_on_tpu_donation_inflates_the_bound_but_not_the_buffer_assignment():
    """The gradient step on a donated 64 MiB weight: XLA:TPU's temporaries grow past the assignment's,
    so the bound exceeds the heap the runtime allocates, which stays that of the undonated program."""
    tpu, why = ma.tpu_devices()
    assert tpu, why
    plain, donated = (ma.measure(tpu, "scan_grad_step", donate) for donate in (False, True))
    assert donated["bound_bytes"] > donated["assigned_bytes"] + 32 * MIB
    assert donated["assigned_bytes"] == pytest.approx(plain["assigned_bytes"], rel=0.01)
    assert plain["assigned_bytes"] <= plain["bound_bytes"]


def test_a_tpu_program_without_a_buffer_assignment_is_an_error_not_the_bound(monkeypatch):
    """A program loaded from a persistent cache is not compiled and leaves no report: on TPU that stops the
    row with the reason instead of holding the bound in the assignment's place."""
    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(4))
    monkeypatch.setattr(ma, "compile_with_assignment", lambda lowered: (lowered.compile(), None))
    with pytest.raises(RuntimeError, match="no memory-usage report for this tpu program"):
        ma.compile_accounted(lowered, "tpu")
