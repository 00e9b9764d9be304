#!/usr/bin/env bash
# A study over single-host Cloud TPU VMs (v4-8, v5e-8, ...): VM i of N runs the study's groups i, i+N, ...
# (--group_shard=i/N), each group one vmapped program writing its own result file into --out, which
# must be a directory every VM and the collecting machine share (GCS FUSE, NFS). Then, from any of them,
# the same command with --collect_only writes the report (a finished group is read, not rerun: run this
# script again after a preemption and only the missing groups run). The study is experiments.sweep, or
# the command named before the flags (experiments.compare: both run on one engine, experiments/schedule.py).
# Usage (from a machine with gcloud):
#   experiments/launch/tpu_sweep.sh ZONE VM1,VM2,... --out=/gcs-fuse/runs/lam_lr \
#     --config=experiments/studies/pipo_lam_lr.py --seeds=0-2
#   experiments/launch/tpu_sweep.sh ZONE VM1,VM2,... experiments.compare --out=/gcs-fuse/runs/cmp \
#     --algorithms=grpo,sdpo --seeds=0-9
set -euo pipefail
zone=${1:?zone}; vms=${2:?comma list of TPU VM names}; shift 2
module=experiments.sweep
if [[ $# -gt 0 && $1 != -* ]]; then module=$1; shift; fi
case ${module} in
  experiments.sweep | experiments.compare) ;;
  *) echo "tpu_sweep.sh: ${module}: expected experiments.sweep or experiments.compare before the flags" >&2; exit 2 ;;
esac
IFS=, read -ra names <<< "${vms}"
n=${#names[@]}
args=$(printf ' %q' "$@")
pids=()
for ((i = 0; i < n; i++)); do
  gcloud compute tpus tpu-vm ssh "${names[i]}" --zone="${zone}" --worker=0 --command="
    cd ~/pipo_jax && . .venv/bin/activate &&
    python -m ${module} ${args} --group_shard=${i}/${n}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
