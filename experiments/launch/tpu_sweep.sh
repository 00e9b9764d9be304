#!/usr/bin/env bash
# A sweep over single-host Cloud TPU VMs (v4-8, v5e-8, ...): VM i of N runs the sweep's groups i, i+N, ...
# (--group_shard=i/N), each group one vmapped program writing its own result file into --out, which
# must be a directory every VM and the collecting machine share (GCS FUSE, NFS). Then, from any of them,
# the same flags with --collect_only write sweep.json (a finished point is read, not rerun: run this
# script again after a preemption and only the missing groups run).
# Usage (from a machine with gcloud):
#   experiments/launch/tpu_sweep.sh ZONE VM1,VM2,... --out=/gcs-fuse/runs/lam_lr \
#     --config=experiments/studies/pipo_lam_lr.py --seeds=0-2
set -euo pipefail
zone=${1:?zone}; vms=${2:?comma list of TPU VM names}; shift 2
IFS=, read -ra names <<< "${vms}"
n=${#names[@]}
args=$(printf ' %q' "$@")
pids=()
for ((i = 0; i < n; i++)); do
  gcloud compute tpus tpu-vm ssh "${names[i]}" --zone="${zone}" --worker=0 --command="
    cd ~/pipo_jax && . .venv/bin/activate &&
    python -m experiments.sweep ${args} --group_shard=${i}/${n}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
