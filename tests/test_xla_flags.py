"""The test processes' XLA flags (tests/xla_flags.py)."""

from tests.xla_flags import TERMINATE_TIMEOUT, xla_flags


def test_a_later_flag_replaces_the_same_flag(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=4")
    flags = xla_flags(f"{TERMINATE_TIMEOUT}=180").split()
    assert flags[0] == "--xla_cpu_max_isa=AVX2"  # the caller's flag kept, its device count dropped
    assert not any(f.startswith("--xla_force_host_platform_device_count") for f in flags)
    assert [f for f in flags if f.startswith(TERMINATE_TIMEOUT)] == [f"{TERMINATE_TIMEOUT}=180"]
