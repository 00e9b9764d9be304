"""Where `initialize_distributed` takes the coordinator / process count / id from:
config, JAX env vars, SLURM, TPU pods; and the SLURM node-list parsing (checked
against JAX's own SLURM cluster detection)."""

from __future__ import annotations

import pytest

from pipo_jax.config.schema import ConfigError
from pipo_jax.config.sections import DistributedConfig
from pipo_jax.parallel.distributed import (DistributedSettings, distributed_settings, first_slurm_host,
                                           slurm_default_port)

SLURM_2x8 = {"SLURM_JOB_ID": "123456", "SLURM_NTASKS": "16", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
             "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_STEP_NUM_NODES": "2"}


def test_single_process_by_default():
    assert distributed_settings(DistributedConfig(), {}) is None
    assert distributed_settings(DistributedConfig(mode="off"), SLURM_2x8) is None


def test_config_wins():
    cfg = DistributedConfig(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=2, local_device_ids="0,1")
    assert distributed_settings(cfg, SLURM_2x8) == DistributedSettings("config", "10.0.0.1:1234", 4, 2, (0, 1))


@pytest.mark.parametrize("cfg, match", [
    ({"coordinator_address": "h:1"}, r"\['num_processes', 'process_id'\]"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, "process_id=2 is not in"),
    ({"local_device_ids": "0,x", "mode": "on"}, "comma-separated"),
])
def test_config_errors_name_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        distributed_settings(DistributedConfig.from_config(cfg), {})


def test_the_section_checks_the_mode():
    with pytest.raises(ConfigError, match=r"^config\.distributed\.mode: 'sometimes' is not one of \('auto', 'on'"):
        DistributedConfig(mode="sometimes")


def test_env_vars():
    env = {"JAX_COORDINATOR_ADDRESS": "host:99", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert distributed_settings(DistributedConfig(), env) == DistributedSettings("env", "host:99", 2, 1)
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        distributed_settings(DistributedConfig(), {"JAX_COORDINATOR_ADDRESS": "host:99", "JAX_NUM_PROCESSES": "2"})


def test_slurm_one_process_per_gpu():
    s = distributed_settings(DistributedConfig(), SLURM_2x8)
    port = 123456 % 4096 + 61440
    assert s == DistributedSettings("slurm", f"gpu007:{port}", 16, 9, (1,))


def test_slurm_one_process_per_node_uses_all_local_gpus():
    env = dict(SLURM_2x8, SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0")
    s = distributed_settings(DistributedConfig(port=5000), env)
    assert s == DistributedSettings("slurm", "gpu007:5000", 2, 1, None)
    # GPUs bound per task by SLURM (one visible device each): no local id selection either
    bound = dict(SLURM_2x8, CUDA_VISIBLE_DEVICES="3")
    assert distributed_settings(DistributedConfig(), bound).local_device_ids is None


def test_slurm_single_task_and_tpu_pod():
    assert distributed_settings(DistributedConfig(), dict(SLURM_2x8, SLURM_NTASKS="1")) is None
    pod = {"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}
    assert distributed_settings(DistributedConfig(), pod) == DistributedSettings("tpu")
    assert distributed_settings(DistributedConfig(), {"TPU_WORKER_HOSTNAMES": "t0"}) is None
    assert distributed_settings(DistributedConfig(mode="on"), {}) == DistributedSettings("jax-auto")


@pytest.mark.parametrize("nodelist, host", [
    ("node001", "node001"), ("node001,host2", "node001"), ("node[001-015],host2", "node001"),
    ("node[001,007-015],host2", "node001"), ("gpu[3-5]-ib", "gpu3-ib"),
])
def test_first_slurm_host_matches_jax(monkeypatch, nodelist, host):
    assert first_slurm_host(nodelist) == host
    from jax._src.clusters.slurm_cluster import SlurmCluster

    monkeypatch.setenv("SLURM_STEP_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_JOB_ID", "98765")
    jax_addr = SlurmCluster.get_coordinator_address(timeout_secs=None, override_coordinator_port=None)
    if "]-" not in nodelist:  # JAX drops a suffix after the bracket
        assert jax_addr == f"{host}:{slurm_default_port('98765')}"
