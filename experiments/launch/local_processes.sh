#!/usr/bin/env bash
# N processes of the main job on this host, joined by jax.distributed over localhost
# (each with its own CPU devices; on a GPU host give each process its GPUs with
# CUDA_VISIBLE_DEVICES or --config.distributed.local_device_ids). Usage:
#   experiments/launch/local_processes.sh NUM_PROCESSES DEVICES_PER_PROCESS WORKDIR --config=FILE:PRESET [overrides]
# e.g. experiments/launch/local_processes.sh 2 2 runs/mp --config=configs/grpo.py:micro \
#        --config.mesh.fsdp=2 --config.mesh.tensor=2 --config.mesh.dcn_fsdp=2
set -euo pipefail
n=${1:?number of processes}; per=${2:?CPU devices per process}; workdir=${3:?workdir}; shift 3
port=${PORT:-$((20000 + RANDOM % 20000))}
pids=()
for ((i = 0; i < n; i++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=${per}" JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} \
  python -m experiments.train --workdir="${workdir}" "$@" \
    --config.distributed.coordinator_address="localhost:${port}" \
    --config.distributed.num_processes="${n}" --config.distributed.process_id="${i}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
