#!/bin/bash
# N JAX processes on this machine (CPU, gloo collectives), to try the multi-host code
# paths without a cluster:
#
#   experiments/launch/local_processes.sh 2 4 -- python -m experiments.train --config=configs/grpo.py:tiny \
#       --config.mesh.fsdp=2 --config.mesh.dcn_fsdp=2 --config.mesh.tensor=4 --workdir=runs/mp
#
# Each process gets DEVICES simulated CPU devices and the JAX_COORDINATOR_ADDRESS /
# JAX_NUM_PROCESSES / JAX_PROCESS_ID variables read by `parallel.initialize_distributed`.
# Logs: $LOGDIR/process_<i>.log (default ./local_processes_logs).
set -euo pipefail

N=${1:?number of processes}
DEVICES=${2:?CPU devices per process}
shift 2
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 N DEVICES -- command ..." >&2; exit 2; }
LOGDIR=${LOGDIR:-local_processes_logs}
mkdir -p "$LOGDIR"
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}

pids=()
for ((i = 0; i < N; i++)); do
  JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$DEVICES" \
  JAX_COORDINATOR_ADDRESS="localhost:$PORT" JAX_NUM_PROCESSES="$N" JAX_PROCESS_ID="$i" \
    "$@" > "$LOGDIR/process_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "process $i failed; see $LOGDIR/process_$i.log" >&2
    status=1
  fi
done
exit $status
